// The composer and the status line: sending a message (queued while a run is active,
// held while a new session's name is on its way), Stop, whether a run is busy, and the
// status bar (session, model, context used, messages waiting).

import { frames } from "./wire.js";
import { $, request, send, state, transcript } from "./page.js";
import { slashLine } from "./slash.js";

export function setBusy(busy) {
  state.busy = busy;
  $("stop").disabled = !busy;
  if (!busy) $("status-activity").textContent = "";
}

export function sendMessage(typed) {
  const text = slashLine(typed); // a command kept as a file: its prompt
  if (text === null) return true;
  if (state.creating !== null) { state.held.push(text); return true; }
  const profile = $("profile").value.trim() || null;
  const mode = $("mode").value || null;
  const queued = state.busy;
  const what = { kind: "message", queued, text };
  const frame = frames.message(text, state.sid, profile, mode);
  if (state.cwd) frame.cwd = state.cwd; // the folder picked (folders.js)
  const id = request(frame, what);
  if (id === null) return false;
  if (queued) state.queued.push(text); // the daemon queues it; its turn shows at its start
  else what.turn = transcript.started(text); // taken away again if the daemon refuses it
  if (!state.sid) state.creating = id;
  setBusy(true);
  return true;
}

export function updateStatus() {
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

export function stopRun() {
  if (state.sid && state.busy && send(frames.stop(state.sid))) {
    $("status-activity").textContent = "stopping…";
  }
}

