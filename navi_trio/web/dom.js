// Small DOM and text helpers every part of the page uses: `el` (an element with a
// class and a text node, never HTML), `oneLine` (text flattened and clipped), and the
// one-line form of a daemon's error with a hint saying what to do (`errorText`).

export const HINTS = {
  unauthorized: "sign in again with a valid token",
  forbidden: "that session or task belongs to another user",
  not_found: "check the id in the session list or the tasks panel",
  busy: "a run is active: stop it or wait, then try again",
  session_busy: "a run is active or queued: stop it first",
  nothing_to_compact: "the conversation is already short",
  rate_limited: "slow down a little and try again",
  limit: "close another tab or delete old sessions",
  llm_connection: "is the LLM server running? (navi doctor)",
  llm_timeout: "the model did not answer in time (navi doctor)",
  llm_status: "the LLM server refused the request: check the model name (navi doctor)",
  unsupported: "this daemon does not support that yet",
};

export function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export function oneLine(text, limit = 0) {
  const flat = String(text ?? "").split(/\s+/).filter(Boolean).join(" ");
  return limit && flat.length > limit ? flat.slice(0, limit - 1) + "…" : flat;
}

export function errorText(frame) {
  const code = frame.code && frame.code !== "error" ? ` [${frame.code}]` : "";
  const hint = HINTS[frame.code] ? ` — ${HINTS[frame.code]}` : "";
  return `✗ error${code}: ${oneLine(frame.message, 1000)}${hint}`;
}
