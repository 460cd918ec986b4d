"""`navi chat`: the terminal client.

It speaks the wire protocol (JSON frames over WebSocket) through `open_daemon`
(api/daemon_client.py), with the frames of the wire vocabulary (navi_trio/wire.py), and
imports nothing else of navi_trio but the vocabulary. The parts, each small and
testable alone:

- `render`     `Renderer`: fed server frames, prints them on a rich Console (pure-ish);
               `cards`: its tool-call, approval and plan cards; `text`: line shaping
- `connection` `Connection`: the WebSocket actor (hello, reconnect with backoff, resubscribe)
- `reader`     line input: prompt_toolkit in a worker thread, or plain stdin lines
- `daemon`     finds the token; starts a background daemon when none answers
- `app`        `ChatApp`: wires them together, the session's state, Ctrl-C / Ctrl-D;
               `commands`: the slash commands; `profile`: the status line's profile
"""
