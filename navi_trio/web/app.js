// The navi browser client: login, sessions, the transcript of one session, background
// tasks, the composer. One more client of the WebSocket protocol (wire.js), with the
// same rules as `navi chat`: frames of a session are shown once each (seq and epoch),
// a reconnect resubscribes from the last seq seen, a `resync` reloads the history.
//
// This module is the page's start: the login, the frame dispatch (each frame from the
// daemon to its owner: sessions.js, tasks.js, the transcript) and the buttons' wiring.

import { Wire, frames, isSessionFrame } from "./wire.js";
import { errorText, oneLine } from "./dom.js";
import { $, request, showError, state, transcript } from "./page.js";
import { adopt, closeSidebarOnPhone, onHistoryPage, onSessionFrame, openSession, pageRefused, renderSessions, resetSession, showEmpty } from "./sessions.js";
import { onTaskUpdate, onTasks } from "./tasks.js";
import { loadGrants, onGrants } from "./grants.js";
import { sendMessage, setBusy, stopRun, updateStatus } from "./composer.js";
import { onFolders } from "./folders.js";
import { onChanges } from "./changes.js";
import { onRewindReply } from "./rewind.js";
import { installContext, onContext } from "./context.js";
import { installUsage, onUsage } from "./usage.js";
import { renderChoices } from "./choices.js";
import { forgetToken, keepToken, savedToken, takeSigninCode } from "./signin.js";
import "./session_tools.js";
import { onCommands } from "./slash.js";

// -- login ---------------------------------------------------------------------------

function showLogin(message) {
  if (state.wire) state.wire.close();
  state.wire = null;
  forgetToken();
  $("app").hidden = true;
  $("banner").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-token").focus();
}

function start(token, code = null) {
  $("login").hidden = true;
  $("app").hidden = false;
  setConn("connecting…", "connecting");
  state.wire = new Wire(token, { onWelcome, onFrame, onDown, onUnauthorized }, code);
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
  renderChoices(welcome);
  // Signed in by a one-time link: the token it stood for, kept as a pasted one is.
  if (typeof welcome.token === "string") keepToken(welcome.token, false);
  $("user-name").textContent = `${state.user.name || "?"} (${state.user.role || "?"})`;
  setConn("connected", "up");
  request(frames.sessionsList(), { kind: "list" });
  state.grantsLoaded = false; // listed after the first tasks list: never ahead of a history page
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

// -- frames --------------------------------------------------------------------------

function onFrame(frame) {
  const what = frame.id !== undefined ? state.pending.get(frame.id) : undefined;
  if (frame.id !== undefined) state.pending.delete(frame.id);
  switch (frame.type) {
    case "session":
      if (what && what.kind === "message") state.pending.set(frame.id, what); // its ok follows
      if (what && what.kind === "message" && state.creating === frame.id) adopt(String(frame.session_id));
      else if (what && what.kind === "create") openSession(String(frame.session_id));
      return;
    case "sessions":
      if (frame.action === "list") renderSessions(Array.isArray(frame.sessions) ? frame.sessions : []);
      else if (frame.action === "history") onHistoryPage(frame, what);
      else if (frame.action === "rename") request(frames.sessionsList(), { kind: "list" });
      else if (frame.action === "delete") {
        if (frame.session_id === state.sid) showEmpty();
        request(frames.sessionsList(), { kind: "list" });
      }
      return;
    case "tasks":
      if (frame.action === "list" && !state.grantsLoaded) {
        state.grantsLoaded = true;
        loadGrants();
      }
      return onTasks(frame);
    case "grants": return onGrants(frame);
    case "folders": return onFolders(frame, what);
    case "changes": return onChanges(frame, what);
    case "checkpoints": case "rewind": case "fork": return onRewindReply(frame, what);
    case "context": return onContext(frame);
    case "usage": return onUsage(frame, what);
    case "commands": return onCommands(frame, what);
    case "task_update": return onTaskUpdate(frame);
    case "ok":
      if (Array.isArray(frame.approvals) && frame.session_id === state.sid) transcript.waiting(frame.approvals);
      // A run that started before this page followed the session: Stop works on it too.
      if (what && what.kind === "subscribe" && frame.session_id === state.sid && frame.busy === true) setBusy(true);
      if (frame.approved && (frame.scope === "session" || frame.scope === "always")) loadGrants();
      // A new session's title is saved by the time its first message's ok comes: the
      // list asked for at its creation had none yet.
      if (what && what.kind === "message" && !state.sessions.some((s) => s.session_id === frame.session_id && s.title)) {
        request(frames.sessionsList(), { kind: "list" });
      }
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
  if (pageRefused(frame, what)) return; // asked for again shortly
  if (what && typeof what.failed === "function") what.failed(frame); // its panel says so too
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
    // Not in the session: out of the transcript, and back in the box to edit and resend.
    transcript.drop(what.turn);
    if (!$("input").value.trim()) $("input").value = what.text || "";
    updateStatus();
  }
  transcript.error(frame);
  showError(errorText(frame));
}

// -- wiring --------------------------------------------------------------------------

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("login-token").value.trim();
  $("login-token").value = "";
  if (!token) return;
  keepToken(token, $("login-remember").checked);
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
installContext();
installUsage();
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
  // A sign-in link opened in a tab already signed in: not a session id; out of the address.
  if (location.hash.startsWith("#signin=")) { takeSigninCode(); return; }
  const sid = decodeURIComponent(location.hash.slice(1));
  if (sid && sid !== state.sid && state.wire && state.wire.ready) openSession(sid);
});

const code = takeSigninCode();
const saved = savedToken();
if (code) start(null, code);
else if (saved) start(saved);
else showLogin("");
