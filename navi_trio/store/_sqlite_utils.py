"""sqlite-utils, imported without numpy and pandas (why: navi_trio/imports.py).

The schema's creation (`_schema._create`, the one user of sqlite-utils) takes its
``Database`` from here: a plain ``from sqlite_utils import ...`` sorts before this
module's import and would load the library, numpy with it, first.
"""

from navi_trio.imports import SQLITE_UTILS_HIDDEN, import_hiding

sqlite_utils = import_hiding("sqlite_utils", SQLITE_UTILS_HIDDEN)

from sqlite_utils import Database as Database  # noqa: E402 - loaded by the line above
