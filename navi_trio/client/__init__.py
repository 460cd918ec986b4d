"""`navi chat`: the terminal client.

It speaks the wire protocol through `open_daemon` and imports nothing else of
navi_trio but the wire vocabulary. `ChatApp` wires a `Connection` (the WebSocket
actor), a `Reader` (line input) and a `Renderer` (frames printed on a rich Console).
"""
