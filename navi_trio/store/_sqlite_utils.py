"""sqlite-utils, imported without numpy and pandas (why: navi_trio/imports.py).

The package's ``__init__`` imports this module before any other store module, so their
``from sqlite_utils import Database`` finds it already loaded.
"""

from navi_trio.imports import SQLITE_UTILS_HIDDEN, import_hiding

sqlite_utils = import_hiding("sqlite_utils", SQLITE_UTILS_HIDDEN)
