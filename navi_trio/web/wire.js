// The page's WebSocket to the daemon that served it (protocol v1, docs/pages/protocol.md):
// hello with the token, then frames in and out. A dropped socket is
// reconnected by itself with backoff (0.5 s doubling to 8 s, for ever: the page never
// gives up, the banner says so); an `unauthorized` error ends it for good (the token
// is wrong or was rotated), and the owner sends the person back to the login.

export const PROTOCOL = 1;
const BACKOFF_FIRST = 500;
const BACKOFF_MAX = 8000;
const WELCOME_TIMEOUT = 10000;

export class Wire {
  // handlers: onWelcome(welcome, again), onFrame(frame), onDown({attempt, retryIn, reason}),
  // onUnauthorized(message). `code`: a one-time sign-in code said instead of the token;
  // the welcome gives the token back, which the later hellos say.
  constructor(token, handlers, code = null) {
    this.token = token;
    this.code = code;
    this.h = handlers;
    this.ws = null;
    this.ready = false; // welcomed on the current socket
    this.welcomed = false; // at least once
    this.failures = 0;
    this.closed = false;
    this.timer = null;
    this.nextId = 0;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/`;
  }

  start() {
    this.closed = false;
    this._open();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "bye");
    this.ws = null;
    this.ready = false;
  }

  retryNow() {
    if (this.closed || this.ready) return;
    clearTimeout(this.timer);
    if (this.ws) { try { this.ws.close(); } catch (e) { /* already gone */ } }
    this.ws = null;
    this._open();
  }

  // Send `frame`; false (and nothing sent) while the socket is down.
  send(frame) {
    if (!this.ready || !this.ws) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  // Send `frame` with a fresh id; returns the id (null when down). The id goes first: of
  // a frame too large to read, the daemon looks for it in the first few KB only.
  request(frame) {
    const id = "w" + (++this.nextId);
    return this.send({ id, ...frame }) ? id : null;
  }

  _open() {
    let ws;
    try {
      ws = new WebSocket(this.url());
    } catch (e) {
      this._down(String(e));
      return;
    }
    this.ws = ws;
    let welcomeTimer = null;
    let refused = false;
    ws.onopen = () => {
      ws.send(JSON.stringify(this.code ? { type: "hello", code: this.code } : { type: "hello", token: this.token }));
      welcomeTimer = setTimeout(() => ws.close(4000, "no welcome"), WELCOME_TIMEOUT);
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (e) {
        frame = { type: "error", code: "bad_frame", message: "the daemon sent a frame that is not JSON" };
      }
      if (!frame || typeof frame.type !== "string") return;
      if (!this.ready) {
        if (frame.type === "error" && frame.code === "unauthorized") {
          refused = true;
          clearTimeout(welcomeTimer);
          this.close();
          this.h.onUnauthorized(String(frame.message || "unauthorized"));
          return;
        }
        if (frame.type === "welcome") {
          clearTimeout(welcomeTimer);
          if (this.code && typeof frame.token === "string") { this.token = frame.token; this.code = null; }
          const again = this.welcomed;
          this.ready = true;
          this.welcomed = true;
          this.failures = 0;
          this.h.onWelcome(frame, again);
          return;
        }
        if (frame.type === "error") {
          // refused before the welcome (too many connections): say so, retry later
          this.h.onFrame(frame);
          return;
        }
      }
      this.h.onFrame(frame);
    };
    ws.onclose = (event) => {
      clearTimeout(welcomeTimer);
      if (ws !== this.ws || refused || this.closed) return;
      this.ws = null;
      this.ready = false;
      this._down(event.reason || (event.code === 1006 ? "the connection dropped" : `closed (${event.code})`));
    };
    ws.onerror = () => { /* onclose follows and says it */ };
  }

  _down(reason) {
    this.failures += 1;
    const delay = Math.min(BACKOFF_FIRST * 2 ** (this.failures - 1), BACKOFF_MAX);
    this.h.onDown({ attempt: this.failures, retryIn: delay, reason });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => { if (!this.closed) this._open(); }, delay);
  }
}

// -- client frames ---------------------------------------------------------------------

export const frames = {
  message(content, sessionId, profile, mode) {
    const f = { type: "message", content };
    if (sessionId) f.session_id = sessionId;
    if (profile) f.profile = profile;
    if (mode) f.mode = mode;
    return f;
  },
  stop: (sid) => ({ type: "stop", session_id: sid }),
  compact: (sid) => ({ type: "compact", session_id: sid }),
  subscribe(sid, lastSeq, epoch) {
    const f = { type: "subscribe", session_id: sid, last_seq: lastSeq ?? null };
    if (epoch) f.epoch = epoch;
    return f;
  },
  unsubscribe: (sid) => ({ type: "unsubscribe", session_id: sid }),
  sessionsList: () => ({ type: "sessions", action: "list" }),
  sessionsCreate(profile) {
    const f = { type: "sessions", action: "create" };
    if (profile) f.profile = profile;
    return f;
  },
  sessionsDelete: (sid) => ({ type: "sessions", action: "delete", session_id: sid }),
  sessionsRename: (sid, title) => ({ type: "sessions", action: "rename", session_id: sid, title }),
  history(sid, cursor) {
    const f = { type: "sessions", action: "history", session_id: sid };
    if (cursor) f.cursor = cursor; // the next_cursor of the page before
    return f;
  },
  tasks(action, sid, taskId) {
    const f = { type: "tasks", action };
    if (sid) f.session_id = sid;
    if (taskId) f.task_id = taskId;
    return f;
  },
  grants(action, grantId) {
    const f = { type: "grants", action };
    if (grantId) f.grant_id = grantId;
    return f;
  },
  approval(approve, sid, callId, scope) {
    return { type: approve ? "approve" : "deny", session_id: sid, call_id: callId, scope };
  },
  commands(sid, cwd) {
    const f = { type: "commands" };
    if (sid) f.session_id = sid;
    if (cwd) f.cwd = cwd; // the folder the page's messages carry, when one is picked
    return f;
  },
};

// Frames that are replies or out of band: never part of a session's seq stream.
const REPLY_TYPES = new Set(["welcome", "ok", "session", "sessions", "tasks", "grants", "resync", "lagged", "task_update", "commands"]);

export function isSessionFrame(frame) {
  return !REPLY_TYPES.has(frame.type) && Number.isInteger(frame.seq);
}
