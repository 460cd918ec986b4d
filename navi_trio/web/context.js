// The project files the session's runs get (a `context` request): the instruction files
// with their sizes, the skills, and what was skipped with why, in a small panel opened
// by the top bar's "Context" button. Asked for the folder the page's messages carry
// (`state.cwd`, when one is picked); with none, a run gets navi's own folders' files.

import { el } from "./dom.js";
import { $, request, state } from "./page.js";

const LISTED = 100; // rows of each list drawn

export function installContext() {
  const button = el("button", "icon-button", "Context");
  button.id = "toggle-context";
  button.type = "button";
  button.title = "Instruction files and skills your runs get";
  const panel = el("aside", "context-panel");
  panel.id = "context";
  panel.hidden = true;
  $("toggle-tasks").before(button);
  $("app").append(panel);
  button.addEventListener("click", () => {
    if (!panel.hidden) { panel.hidden = true; return; }
    const frame = { type: "context" };
    if (state.sid) frame.session_id = state.sid;
    if (state.cwd) frame.cwd = state.cwd; // the folder the messages work in, when picked
    request(frame, { kind: "context" });
  });
}

export function onContext(frame) {
  const panel = $("context");
  if (!panel) return;
  panel.replaceChildren(el("h2", null, "Project files"));
  const files = Array.isArray(frame.files) ? frame.files : [];
  panel.append(el("h3", null, `Instruction files: ${files.length || "none"}`));
  const list = el("ul", "context-files");
  for (const f of files.slice(0, LISTED)) {
    const cut = f.sent < f.size ? `, cut to ${f.sent}` : "";
    list.append(el("li", null, `${f.path} (${f.size} bytes${cut}; ${f.origin})`));
  }
  panel.append(list);
  const skills = Array.isArray(frame.skills) ? frame.skills : [];
  panel.append(el("h3", null, `Skills: ${skills.length || "none"}`));
  const ul = el("ul", "context-skills");
  for (const s of skills.slice(0, LISTED)) ul.append(el("li", null, `${s.name}: ${s.description}`));
  panel.append(ul);
  const skipped = Array.isArray(frame.skipped) ? frame.skipped : [];
  if (skipped.length) {
    panel.append(el("h3", null, `Skipped: ${skipped.length + (frame.more_skipped || 0)}`));
    const sk = el("ul", "context-skipped");
    for (const s of skipped.slice(0, LISTED)) sk.append(el("li", null, `${s.path}: ${s.why}`));
    panel.append(sk);
  }
  panel.hidden = false;
}
