// What every part of the browser client shares: the state of the session shown (`state`),
// the transcript, `$` (an element by id), and the ways out: `send` and `request` to the
// daemon (a request's id remembers what it asked), `showError` to the person.

import { frames } from "./wire.js";
import { el } from "./dom.js";
import { Transcript } from "./view.js";

export const $ = (id) => document.getElementById(id);

export const state = {
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
  profiles: [], // the daemon's, from its welcome
  tasks: new Map(), // task id -> info
  contextTokens: null,
  contextWindow: null,
  model: null,
  cwd: null, // the folder the next messages work in (folders.js); null: the session's own
};

export const transcript = new Transcript($("transcript"), {
  answer(callId, approve, scope, sid) {
    return send(frames.approval(approve, sid || state.sid, callId, scope));
  },
  activity(text) { $("status-activity").textContent = text; },
  plan(text) { $("status-plan").textContent = text; }, // the plan's progress, always in sight
});

// -- the frame of mind ---------------------------------------------------------------

export function send(frame) {
  if (!state.wire || !state.wire.send(frame)) {
    showError("not connected to the daemon (reconnecting…): try again in a moment");
    return false;
  }
  return true;
}

export function request(frame, what) {
  const id = state.wire ? state.wire.request(frame) : null;
  if (id === null) {
    showError("not connected to the daemon (reconnecting…): try again in a moment");
    return null;
  }
  state.pending.set(id, what);
  return id;
}

export function showError(text, cls = "error") {
  const line = el("div", "line " + cls, text);
  const box = $("errors");
  box.append(line);
  while (box.childElementCount > 3) box.firstElementChild.remove();
  setTimeout(() => line.remove(), 15000);
}
