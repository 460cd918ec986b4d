"""The WebSocket daemon's layer: above core, below the wiring (DESIGN.md).

protocol    client frame -> command; every server frame built here (events, resync,
            lagged, error, replies)
services    DaemonCore: what this layer needs of the core (never the concrete Runtime)
auth        tokens, users, the local token file, the Origin check
connection  one actor per connection: hello, reader, writer, subscription pumps
commands    what each command does for one user, ownership checked once
server      the listening socket, connections per user
web         the browser client's files and plain HTTP on the same port
daemon_client  `open_daemon`, the one client of the protocol (every navi client uses it)
our_run     which frames of a session are our message's run (the runs queued ahead counted)
remote      a one-request client (navi sessions / tasks / doctor)
peer_link   the peer tool's link to another daemon
"""

from navi_trio.api.protocol import PROTOCOL_VERSION as PROTOCOL_VERSION
from navi_trio.api.protocol import event_frame as event_frame
from navi_trio.api.protocol import parse_frame as parse_frame

# Only the light protocol here: `navi --help` imports this package; the server (and
# with it the whole core) is imported where it is used.
__all__ = ["PROTOCOL_VERSION", "event_frame", "parse_frame"]
