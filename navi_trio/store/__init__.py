"""The session store: sessions, display history, LLM context, kv values and users.

`SessionStore` is the class everything above this layer uses. Its methods are written
once (`methods`: checks, operation names, fences) over an engine's statements: those
both engines share (`statements`, over an engine's placeholder and write transaction)
and the engine's own. `SQLiteStore` is one SQLite file, WAL, one worker thread (`_core`,
one module of statements per table); `store.postgres` is PostgreSQL for several daemons
(imported only when `NAVI_DB` names a server: `store.factory`). Both share `base` (the
rows), `_input` (checks and serialisation, no SQL), `fence` and `repair`.
"""

from navi_trio.store.base import LeaseRow as LeaseRow
from navi_trio.store.base import LoadedSession as LoadedSession
from navi_trio.store.base import SessionRow as SessionRow
from navi_trio.store.methods import SessionStore as SessionStore
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
