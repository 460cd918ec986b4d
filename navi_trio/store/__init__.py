"""The session store: sessions, display history, LLM context, kv values and users.

`SessionStore` is the protocol everything above this layer uses; `SQLiteStore` is the
implementation (one SQLite file, WAL, one worker thread): a body (`_core`) and one
module per table, each holding that table's methods and its SQL (`_sessions`,
`_history`, `_queue`, `_kv`, `_users`, `_lease`). `store.postgres` implements the same
protocol on PostgreSQL for several daemons (imported only when `NAVI_DB` names a server:
`store.factory`), sharing `base` (the protocol, the rows), `_input` (checks and
serialisation, no SQL) and `repair`.
"""

# First: sqlite-utils without numpy, before the modules below import it (its docstring).
from navi_trio.store import _sqlite_utils as _sqlite_utils
from navi_trio.store.base import LeaseRow as LeaseRow
from navi_trio.store.base import LoadedSession as LoadedSession
from navi_trio.store.base import SessionRow as SessionRow
from navi_trio.store.base import SessionStore as SessionStore
from navi_trio.store.repair import repair_dangling_tool_calls as repair_dangling_tool_calls
from navi_trio.store.sqlite import SQLiteStore as SQLiteStore

open_store = SQLiteStore.open

__all__ = [
    "LeaseRow",
    "LoadedSession",
    "SQLiteStore",
    "SessionRow",
    "SessionStore",
    "open_store",
    "repair_dangling_tool_calls",
]
