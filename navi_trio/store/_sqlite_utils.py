"""sqlite-utils, imported without numpy and pandas (why: navi_trio/imports.py).

The schema's creation (`_schema._create`, the one user of sqlite-utils) imports this
module first, so its ``from sqlite_utils import Database`` finds it already loaded.
"""

from navi_trio.imports import SQLITE_UTILS_HIDDEN, import_hiding

sqlite_utils = import_hiding("sqlite_utils", SQLITE_UTILS_HIDDEN)
