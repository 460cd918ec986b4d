"""`navi chat`: the terminal client.

It speaks the wire protocol (JSON frames over WebSocket) and nothing else of navi_trio:
no import from `core/` or `api/`. The parts, each small and testable alone:

- `frames`     builds the client's frames and reads the server's (plain dicts)
- `render`     `Renderer`: fed server frames, prints them on a rich Console (pure-ish)
- `connection` `Connection`: the WebSocket actor (hello, reconnect with backoff, resubscribe)
- `reader`     line input: prompt_toolkit in a worker thread, or plain stdin lines
- `daemon`     finds the token; starts a background daemon when none answers
- `app`        `ChatApp`: wires them together, slash commands, Ctrl-C / Ctrl-D
"""
