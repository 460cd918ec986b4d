"""trio-websocket, imported without importlib.metadata (why: navi_trio/imports.py).

navi's modules take trio-websocket's names from here: a plain ``from trio_websocket
import ...`` sorts before this module's import and would load the library, and
importlib.metadata with it, first.
"""

from __future__ import annotations

import trio

from navi_trio.imports import import_standing_in


def _version(distribution: str) -> str:
    """``importlib.metadata.version``: trio's from trio itself, any other's as it is."""
    if distribution == "trio":
        return trio.__version__
    from importlib.metadata import version

    return version(distribution)


import_standing_in("trio_websocket", "importlib.metadata", version=_version)

from trio_websocket import CloseReason as CloseReason  # noqa: E402 - loaded by the line above
from trio_websocket import ConnectionClosed as ConnectionClosed  # noqa: E402
from trio_websocket import ConnectionRejected as ConnectionRejected  # noqa: E402
from trio_websocket import HandshakeError as HandshakeError  # noqa: E402
from trio_websocket import WebSocketConnection as WebSocketConnection  # noqa: E402
from trio_websocket import WebSocketRequest as WebSocketRequest  # noqa: E402
from trio_websocket import open_websocket_url as open_websocket_url  # noqa: E402
from trio_websocket import wrap_server_stream as wrap_server_stream  # noqa: E402
