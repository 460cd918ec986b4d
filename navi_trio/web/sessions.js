// The sessions: the list on the left (open, delete), opening one
// (its history, then a subscribe from the history's seq), and following the one shown:
// its frames are shown once each (seq and epoch); a message sent without a session
// adopts the session the daemon made for it.

import { frames } from "./wire.js";
import { el, oneLine } from "./dom.js";
import { $, request, showError, state, transcript } from "./page.js";
import { renderTasks } from "./tasks.js";
import { sendMessage, setBusy, updateStatus } from "./composer.js";
import { onSessionHistory } from "./folders.js";

const SESSION_ID = /^[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}$/;

export function resetSession(sid) {
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

export function showEmpty() {
  resetSession(null);
  transcript.clear();
  transcript.line("A new session starts with your first message; or pick one on the left.", "notice placeholder");
  history.replaceState(null, "", location.pathname);
}

export function openSession(sid) {
  if (!SESSION_ID.test(sid)) {
    showError(`✗ "${oneLine(sid, 64)}" is not a session id`);
    showEmpty();
    return;
  }
  state.opening = sid;
  request(frames.history(sid), { kind: "history", sid });
}

// A long history comes in pages, each naming the next one's cursor: the pages are put
// together and shown once the last came (the seq to subscribe from is the last's). A
// page refused for the frame rate is asked for again shortly.
const PAGE_RETRIES = 10;
const PAGE_RETRY_MS = 200;

function wanted(sid) {
  return sid === state.opening || (state.resync !== null && sid === state.sid);
}

export function onHistoryPage(frame, what) {
  const sid = String(frame.session_id);
  const messages = Array.isArray(frame.messages) ? frame.messages : [];
  const sofar = what && Array.isArray(what.pages) ? what.pages.concat(messages) : messages;
  if (typeof frame.next_cursor !== "string") {
    onHistory({ ...frame, messages: sofar });
  } else if (wanted(sid)) {
    request(frames.history(sid, frame.next_cursor), { kind: "history", sid, pages: sofar, cursor: frame.next_cursor });
  }
}

export function pageRefused(frame, what) {
  if (frame.code !== "rate_limited" || !what || what.kind !== "history" || !what.cursor) return false;
  const retries = (what.retries || 0) + 1;
  if (retries > PAGE_RETRIES) return false;
  setTimeout(() => {
    if (wanted(what.sid)) request(frames.history(what.sid, what.cursor), { ...what, retries });
  }, PAGE_RETRY_MS);
  return true;
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
  onSessionHistory(messages);
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

export function renderSessions(list) {
  state.sessions = list;
  const ul = $("session-list");
  ul.replaceChildren();
  for (const s of list) {
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

// -- the session shown ---------------------------------------------------------------

export function adopt(sid) {
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

export function onSessionFrame(frame) {
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
    if (state.queued.length) transcript.started(state.queued.shift()); // its run starts now
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

export function closeSidebarOnPhone() {
  document.body.classList.remove("show-sessions");
}
