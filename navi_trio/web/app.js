// The navi browser client: login, sessions, the transcript of one session, background
// tasks, the composer. One more client of the WebSocket protocol (wire.js), with the
// same rules as `navi chat`: frames of a session are shown once each (seq and epoch),
// a reconnect resubscribes from the last seq seen, a `resync` reloads the history.

import { Wire, frames, isSessionFrame } from "./wire.js";
import { Transcript, el, errorText, oneLine } from "./view.js";

const TOKEN_KEY = "navi.token";
const SESSION_ID = /^[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}$/;
const $ = (id) => document.getElementById(id);

const state = {
  wire: null,
  user: null,
  sid: null, // the session shown
  lastSeq: null,
  epoch: null,
  busy: false,
  queued: [], // texts of our messages waiting in the daemon's queue
  creating: null, // the id of a message sent without a session (the daemon creates one)
  held: [], // messages typed before that session was known
  opening: null, // the session whose history was asked for
  resync: null, // frames held while a resync's history is on its way
  pending: new Map(), // request id -> what it asked
  sessions: [],
  tasks: new Map(), // task id -> info
  contextTokens: null,
  contextWindow: null,
  model: null,
};

const transcript = new Transcript($("transcript"), {
  answer(callId, approve, scope, sid) {
    return send(frames.approval(approve, sid || state.sid, callId, scope));
  },
  activity(text) { $("status-activity").textContent = text; },
});

// -- the frame of mind ---------------------------------------------------------------

function send(frame) {
  if (!state.wire || !state.wire.send(frame)) {
    showError("not connected to the daemon (reconnecting…): try again in a moment");
    return false;
  }
  return true;
}

function request(frame, what) {
  const id = state.wire ? state.wire.request(frame) : null;
  if (id === null) {
    showError("not connected to the daemon (reconnecting…): try again in a moment");
    return null;
  }
  state.pending.set(id, what);
  return id;
}

function showError(text, cls = "error") {
  const line = el("div", "line " + cls, text);
  const box = $("errors");
  box.append(line);
  while (box.childElementCount > 3) box.firstElementChild.remove();
  setTimeout(() => line.remove(), 15000);
}

// -- login ---------------------------------------------------------------------------

function showLogin(message) {
  if (state.wire) state.wire.close();
  state.wire = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $("app").hidden = true;
  $("banner").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-token").focus();
}

function start(token) {
  $("login").hidden = true;
  $("app").hidden = false;
  setConn("connecting…", "connecting");
  state.wire = new Wire(token, { onWelcome, onFrame, onDown, onUnauthorized });
  state.wire.start();
}

function onUnauthorized(message) {
  resetSession(null);
  transcript.clear();
  showLogin(`The daemon refused the token (${message}). Sign in again.`);
}

function onWelcome(welcome, again) {
  $("banner").hidden = true;
  state.user = welcome.user || {};
  // The daemon's profiles (a user with no session yet can still pick one).
  state.profiles = Array.isArray(welcome.profiles) ? welcome.profiles.map(String) : [];
  $("user-name").textContent = `${state.user.name || "?"} (${state.user.role || "?"})`;
  setConn("connected", "up");
  request(frames.sessionsList(), { kind: "list" });
  if (again) {
    if (state.sid) {
      // From the last seq seen: the daemon replays what we missed (or says resync).
      request(frames.subscribe(state.sid, state.lastSeq, state.epoch), { kind: "subscribe", sid: state.sid });
      request(frames.tasks("list", state.sid), { kind: "tasks" });
    }
    showError("reconnected", "notice"); // not in the transcript: a streaming answer goes on whole
    return;
  }
  const wanted = location.hash.slice(1);
  if (wanted) openSession(decodeURIComponent(wanted));
  else showEmpty();
}

function onDown({ attempt, retryIn, reason }) {
  setConn("disconnected", "down");
  if (state.creating !== null) {
    // The new session's name may be lost with the socket: stop waiting for it.
    state.creating = null;
    if (state.held.length) showError(`${state.held.length} message(s) not sent: send them again`);
    state.held = [];
    setBusy(false);
  }
  const seconds = (retryIn / 1000).toFixed(retryIn < 1000 ? 1 : 0);
  $("banner-text").textContent =
    `Cannot reach the navi daemon (${oneLine(reason, 120)}): retrying in ${seconds}s (try ${attempt})…`;
  $("banner").hidden = false;
}

function setConn(text, cls) {
  const c = $("conn-state");
  c.textContent = text;
  c.className = "conn-state " + cls;
}

// -- sessions ------------------------------------------------------------------------

function resetSession(sid) {
  if (state.sid && state.sid !== sid && state.wire) state.wire.send(frames.unsubscribe(state.sid));
  state.sid = sid;
  state.lastSeq = null;
  state.epoch = null;
  state.busy = false;
  state.queued = [];
  state.resync = null;
  state.tasks.clear();
  state.contextTokens = null;
  renderTasks();
  updateStatus();
  $("session-title").textContent = sid ? titleOf(sid) : "new session";
  markCurrent();
}

function showEmpty() {
  resetSession(null);
  transcript.clear();
  transcript.line("A new session starts with your first message; or pick one on the left.", "notice placeholder");
  history.replaceState(null, "", location.pathname);
}

function openSession(sid) {
  if (!SESSION_ID.test(sid)) {
    showError(`✗ "${oneLine(sid, 64)}" is not a session id`);
    showEmpty();
    return;
  }
  state.opening = sid;
  request(frames.history(sid), { kind: "history", sid });
}

function onHistory(frame) {
  const sid = String(frame.session_id);
  const messages = Array.isArray(frame.messages) ? frame.messages : [];
  if (state.resync && sid === state.sid) {
    // After a resync: redraw from the history, then the frames that came meanwhile.
    const held = state.resync;
    state.resync = null;
    transcript.clear();
    transcript.history(messages);
    state.lastSeq = Number.isInteger(frame.seq) ? frame.seq : state.lastSeq;
    state.epoch = frame.epoch || state.epoch;
    transcript.notice(`history reloaded (${messages.length} messages)`);
    for (const f of held) onSessionFrame(f);
    return;
  }
  if (sid !== state.opening) return;
  state.opening = null;
  resetSession(sid);
  state.lastSeq = Number.isInteger(frame.seq) ? frame.seq : null;
  state.epoch = frame.epoch || null;
  transcript.clear();
  transcript.history(messages);
  if (!messages.length) transcript.line("an empty session: your message starts it", "notice placeholder");
  history.replaceState(null, "", "#" + encodeURIComponent(sid));
  request(frames.subscribe(sid, state.lastSeq, state.epoch), { kind: "subscribe", sid });
  request(frames.tasks("list", sid), { kind: "tasks" });
  closeSidebarOnPhone();
}

function titleOf(sid) {
  const s = state.sessions.find((x) => x.session_id === sid);
  return (s && s.title) ? `${oneLine(s.title, 60)} · ${sid}` : sid;
}

function renderSessions(list) {
  state.sessions = list;
  const ul = $("session-list");
  ul.replaceChildren();
  const profiles = new Set(state.profiles || []);
  for (const s of list) {
    profiles.add(String(s.profile || ""));
    const li = el("li", "session");
    li.dataset.sid = s.session_id;
    const open = el("button", "session-open");
    open.type = "button";
    open.append(el("span", "session-name", oneLine(s.title || s.session_id, 60)),
      el("span", "session-meta muted", `${s.profile || ""} · ${when(s.updated_at)}${s.busy ? " · running" : ""}`));
    open.addEventListener("click", () => openSession(String(s.session_id)));
    const del = el("button", "session-delete", "✕");
    del.type = "button";
    del.title = "delete this session";
    del.setAttribute("aria-label", `delete session ${s.session_id}`);
    del.addEventListener("click", () => {
      if (del.classList.contains("confirm")) {
        request(frames.sessionsDelete(String(s.session_id)), { kind: "delete" });
        return;
      }
      del.classList.add("confirm");
      del.textContent = "Delete?";
      setTimeout(() => { del.classList.remove("confirm"); del.textContent = "✕"; }, 4000);
    });
    li.append(open, del);
    ul.append(li);
  }
  if (!list.length) ul.append(el("li", "muted", "no sessions yet"));
  $("profiles").replaceChildren(...[...profiles].filter(Boolean).sort().map((p) => {
    const o = el("option");
    o.value = p;
    return o;
  }));
  if (state.sid) $("session-title").textContent = titleOf(state.sid);
  markCurrent();
}

function markCurrent() {
  for (const li of $("session-list").children) li.classList.toggle("current", li.dataset.sid === state.sid);
}

function when(stamp) {
  if (typeof stamp !== "number") return "";
  const ago = Date.now() / 1000 - stamp;
  if (ago < 60) return "just now";
  if (ago < 3600) return `${Math.floor(ago / 60)} min ago`;
  if (ago < 86400) return `${Math.floor(ago / 3600)} h ago`;
  return new Date(stamp * 1000).toLocaleDateString();
}

// -- frames --------------------------------------------------------------------------

function onFrame(frame) {
  const what = frame.id !== undefined ? state.pending.get(frame.id) : undefined;
  if (frame.id !== undefined) state.pending.delete(frame.id);
  switch (frame.type) {
    case "session":
      if (what && what.kind === "message" && state.creating === frame.id) adopt(String(frame.session_id));
      else if (what && what.kind === "create") openSession(String(frame.session_id));
      return;
    case "sessions":
      if (frame.action === "list") renderSessions(Array.isArray(frame.sessions) ? frame.sessions : []);
      else if (frame.action === "history") onHistory(frame);
      else if (frame.action === "delete") {
        if (frame.session_id === state.sid) showEmpty();
        request(frames.sessionsList(), { kind: "list" });
      }
      return;
    case "tasks": return onTasks(frame);
    case "task_update": return onTaskUpdate(frame);
    case "ok":
      if (Array.isArray(frame.approvals) && frame.session_id === state.sid) transcript.waiting(frame.approvals);
      return;
    case "resync":
      if (frame.session_id !== state.sid) return;
      state.epoch = frame.epoch || null;
      state.lastSeq = Number.isInteger(frame.seq) ? frame.seq : null;
      state.resync = [];
      state.busy = false;
      updateStatus();
      transcript.notice("the daemon restarted or the stream is gone: reloading the history…");
      request(frames.history(state.sid), { kind: "history", sid: state.sid });
      return;
    case "lagged":
      // The daemon resubscribes us from the last frame we got; a line in the transcript
      // would cut the streaming answer's block in two.
      showError(`fell behind (seq ${frame.missed_from}–${frame.missed_to}): catching up`, "notice");
      return;
    case "welcome": return;
    case "error":
      if (!Number.isInteger(frame.seq)) return onRequestError(frame, what);
      break;
    default: break;
  }
  if (isSessionFrame(frame)) onSessionFrame(frame);
}

function onRequestError(frame, what) {
  if (frame.code === "unauthorized") {
    onUnauthorized(frame.message || "unauthorized");
    return;
  }
  if (what && what.kind === "history" && state.opening === what.sid) {
    state.opening = null;
    showEmpty();
  }
  if (what && what.kind === "message" && state.creating === frame.id) {
    state.creating = null;
    state.held = [];
  }
  if (what && what.kind === "message") {
    if (what.queued) state.queued.pop();
    else setBusy(false); // the message did not start a run
    updateStatus();
  }
  transcript.error(frame);
  showError(errorText(frame));
}

function adopt(sid) {
  state.creating = null;
  state.sid = sid;
  state.lastSeq = null;
  state.epoch = null;
  history.replaceState(null, "", "#" + encodeURIComponent(sid));
  $("session-title").textContent = sid;
  request(frames.sessionsList(), { kind: "list" });
  const held = state.held;
  state.held = [];
  for (const text of held) sendMessage(text);
}

function onSessionFrame(frame) {
  if (frame.session_id !== state.sid) {
    if (state.creating !== null && state.sid === null && frame.session_id) adopt(String(frame.session_id));
    else return; // a session we left
  }
  if (state.resync) { state.resync.push(frame); return; }
  const sameEpoch = !frame.epoch || !state.epoch || frame.epoch === state.epoch;
  if (state.lastSeq !== null && sameEpoch && frame.seq <= state.lastSeq) return; // shown already
  state.lastSeq = frame.seq;
  if (frame.epoch) state.epoch = frame.epoch;
  const top = !frame.is_subagent;
  if (top && frame.type === "model_info") state.model = String(frame.model || "");
  if (top && Number.isInteger(frame.context_window)) state.contextWindow = frame.context_window;
  if (top && frame.type === "context_compressed") state.contextTokens = frame.tokens_after;
  if (frame.type === "stream_end" && top) {
    transcript.frame(frame);
    if (frame.prompt_tokens > 0) state.contextTokens = frame.prompt_tokens;
    $("status-activity").textContent = "";
    if (state.queued.length) transcript.user(state.queued.shift()); // its run starts now
    else setBusy(false);
    request(frames.sessionsList(), { kind: "list" });
    updateStatus();
    return;
  }
  if (top && ["text_delta", "thinking_delta", "tool_started", "plan_phase", "model_info", "plan"].includes(frame.type)) {
    setBusy(true);
  }
  transcript.frame(frame);
  updateStatus();
}

// -- tasks ---------------------------------------------------------------------------

function onTasks(frame) {
  if (frame.action === "list") {
    state.tasks.clear();
    for (const t of frame.tasks || []) if (t && t.task_id) state.tasks.set(String(t.task_id), { ...t });
  } else if (frame.action === "check" && frame.task) {
    const t = frame.task;
    const known = state.tasks.get(String(t.task_id)) || {};
    state.tasks.set(String(t.task_id), { ...known, ...t, checked: true });
  } else if (frame.action === "cancel") {
    const t = state.tasks.get(String(frame.task_id));
    if (t && frame.cancelled) t.status = "cancelled";
  }
  renderTasks();
}

function onTaskUpdate(frame) {
  if (frame.session_id && frame.session_id !== state.sid) return;
  const id = String(frame.task_id);
  const known = state.tasks.get(id) || { task_id: id };
  state.tasks.set(id, {
    ...known, tool: frame.tool, status: frame.status, args: frame.args_summary || known.args,
    error: frame.error || known.error, excerpt: frame.result_excerpt || known.excerpt,
  });
  renderTasks();
}

function renderTasks() {
  const ul = $("task-list");
  ul.replaceChildren();
  let running = 0;
  for (const t of state.tasks.values()) {
    if (t.status === "running") running++;
    const li = el("li", "task " + String(t.status || "").replace(/[^a-z]/g, ""));
    li.dataset.taskId = t.task_id;
    li.append(el("div", "task-head", `◆ ${t.task_id} · ${t.tool || "?"} · ${t.status || "?"}`));
    if (t.args) li.append(el("div", "task-args muted", oneLine(t.args, 120)));
    const detail = t.error || t.result || t.excerpt;
    if (detail) li.append(el("pre", "task-result", String(detail).slice(0, 2000)));
    const buttons = el("div", "task-buttons");
    const check = el("button", "task-check", "Check");
    check.type = "button";
    check.addEventListener("click", () => request(frames.tasks("check", state.sid, t.task_id), { kind: "tasks" }));
    buttons.append(check);
    if (t.status === "running") {
      const cancel = el("button", "task-cancel", "Cancel");
      cancel.type = "button";
      cancel.addEventListener("click", () => request(frames.tasks("cancel", state.sid, t.task_id), { kind: "tasks" }));
      buttons.append(cancel);
    }
    li.append(buttons);
    ul.append(li);
  }
  $("task-empty").hidden = state.tasks.size > 0;
  $("task-count").textContent = running ? `${running} running` : String(state.tasks.size);
}

// -- composer and status ---------------------------------------------------------------

function setBusy(busy) {
  state.busy = busy;
  $("stop").disabled = !busy;
  if (!busy) $("status-activity").textContent = "";
}

function sendMessage(text) {
  if (state.creating !== null) { state.held.push(text); return true; }
  const profile = $("profile").value.trim() || null;
  const mode = $("mode").value || null;
  const queued = state.busy;
  const id = request(frames.message(text, state.sid, profile, mode), { kind: "message", queued });
  if (id === null) return false;
  if (queued) state.queued.push(text); // the daemon queues it; its turn shows at its start
  else transcript.user(text);
  if (!state.sid) state.creating = id;
  setBusy(true);
  return true;
}

function updateStatus() {
  $("status-session").textContent = state.sid ? `session ${state.sid}` : "new session";
  $("status-model").textContent = state.model ? `model ${state.model}` : "";
  const tokens = state.contextTokens;
  $("status-context").textContent = tokens ? `context ${tokens} tokens${state.contextWindow ? ` of ${state.contextWindow}` : ""}` : "";
  const fill = state.contextWindow && tokens ? Math.min(100, (100 * tokens) / state.contextWindow) : 0;
  $("meter-fill").style.width = `${fill}%`;
  $("meter-fill").parentElement.hidden = !state.contextWindow;
  const n = state.queued.length;
  $("status-queue").textContent = n ? `${n} message${n > 1 ? "s" : ""} waiting` : "";
}

function stopRun() {
  if (state.sid && state.busy && send(frames.stop(state.sid))) {
    $("status-activity").textContent = "stopping…";
  }
}

function closeSidebarOnPhone() {
  document.body.classList.remove("show-sessions");
}

// -- wiring --------------------------------------------------------------------------

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("login-token").value.trim();
  $("login-token").value = "";
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  start(token);
});

$("logout").addEventListener("click", () => {
  resetSession(null);
  transcript.clear();
  showLogin("Signed out.");
});

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("input");
  const text = input.value.trim();
  if (text && sendMessage(text)) input.value = "";
});

$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && state.busy) {
    event.preventDefault();
    stopRun();
  }
});

$("stop").addEventListener("click", stopRun);
$("compact").addEventListener("click", () => {
  if (!state.sid) { showError("nothing to compact yet: this session has no messages"); return; }
  if (request(frames.compact(state.sid), { kind: "compact" }) !== null) transcript.notice("compacting…");
});
$("new-session").addEventListener("click", () => {
  request(frames.sessionsCreate($("profile").value.trim() || null), { kind: "create" });
  closeSidebarOnPhone();
});
$("banner-retry").addEventListener("click", () => state.wire && state.wire.retryNow());
$("toggle-sessions").addEventListener("click", () => document.body.classList.toggle("show-sessions"));
$("toggle-tasks").addEventListener("click", () => document.body.classList.toggle("show-tasks"));
window.addEventListener("hashchange", () => {
  const sid = decodeURIComponent(location.hash.slice(1));
  if (sid && sid !== state.sid && state.wire && state.wire.ready) openSession(sid);
});

const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) start(saved);
else showLogin("");
