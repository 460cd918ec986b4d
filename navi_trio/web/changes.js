// The changed files: what the session's tools changed since a message, per file, as the
// daemon's diffs (made from the checkpoints; a filesystem edit and a terminal command
// alike), each collapsible. A binary or too large file is named, not shown.

import { el, oneLine } from "./dom.js";
import { request, showError, state } from "./page.js";
import { button, openPanel, panelOpen } from "./panel.js";
import { renderDiff } from "./diffview.js";

const OPEN_FIRST = 5; // files shown open; the rest folded

// Since `point` (a user message of the checkpoints list; null: since the first).
export function showChanges(point) {
  if (!state.sid) { showError("nothing changed yet: this session has no messages"); return; }
  const panel = openPanel("changes", "Changed files");
  panel.body.append(el("p", "muted", "asking the daemon…"));
  const ask = { type: "changes", session_id: state.sid };
  if (point) ask.since = point.message_id;
  request(ask, { kind: "changes", point, failed: (f) => {
    const p = panelOpen("changes");
    if (p) p.body.replaceChildren(el("p", "line error", `✗ [${f.code}] ${oneLine(f.message, 500)}`));
  } });
}

export function onChanges(frame, what) {
  const panel = panelOpen("changes");
  if (!panel || frame.session_id !== state.sid) return;
  panel.body.replaceChildren();
  const since = what && what.point ? `since “${oneLine(what.point.text, 80)}”` : "since the first message";
  const files = Array.isArray(frame.files) ? frame.files : [];
  panel.body.append(el("p", "changes-since", `${files.length} file(s) changed ${since}`));
  if (frame.note) panel.body.append(el("p", "muted changes-note", frame.note));
  for (const left of frame.left_out || []) panel.body.append(el("p", "warning", `left out: ${left.root} — ${left.why}`));
  const roots = new Set(files.map((f) => f.root));
  files.forEach((f, i) => {
    const d = el("details", "changed-file " + String(f.what).replace(/[^a-z_]/g, ""));
    d.open = i < OPEN_FIRST;
    d.dataset.path = String(f.path);
    const name = roots.size > 1 ? `${f.root}/${f.path}` : String(f.path);
    const summary = el("summary");
    summary.append(el("span", "change-what", f.what), " ", el("code", "changed-path", name));
    d.append(summary);
    if (f.diff) d.append(renderDiff(f.diff));
    if (f.cut) d.append(el("p", "muted", "… the rest of this diff is cut (too long)"));
    if (f.omitted) d.append(el("p", "muted changed-omitted", f.omitted));
    panel.body.append(d);
  });
  if (frame.more_files) panel.body.append(el("p", "muted", `… and ${frame.more_files} more file(s)`));
  panel.body.append(button("Refresh", "changes-refresh", () => showChanges(what ? what.point : null)));
}

const open = button("Changes", "changes-session", () => showChanges(null));
open.id = "changes-session";
open.title = "what this session's tools changed, as diffs";
document.querySelector("#composer .controls").append(open);
