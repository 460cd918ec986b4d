// Diffs drawn as text: a unified diff (the daemon's, made by difflib from the
// checkpoints) one line per element, coloured by its first character; and an edit's
// tool card shown as the lines it took out and put in. Every line goes in as a text
// node: a diff of a page's source is shown, never run.

import { el } from "./dom.js";

const DIFF_LINES = 2000; // lines drawn of one diff (the daemon bounds its bytes too)
const EDIT_CHARS = 20000; // characters of an edit's old and new text shown

function lineClass(line) {
  if (line.startsWith("+++") || line.startsWith("---")) return "diff-file";
  if (line.startsWith("@@")) return "diff-hunk";
  if (line.startsWith("+")) return "diff-add";
  if (line.startsWith("-")) return "diff-del";
  if (line.startsWith("\\")) return "diff-note";
  return "diff-ctx";
}

// A unified diff's text as a <pre> of one element per line.
export function renderDiff(text) {
  const pre = el("pre", "diff");
  const lines = String(text ?? "").replace(/\n$/, "").split("\n");
  for (const line of lines.slice(0, DIFF_LINES)) pre.append(el("span", "diff-line " + lineClass(line), line + "\n"));
  if (lines.length > DIFF_LINES) pre.append(el("span", "diff-line diff-note", `… ${lines.length - DIFF_LINES} more lines\n`));
  return pre;
}

function clip(text) {
  const s = String(text ?? "");
  return s.length > EDIT_CHARS ? s.slice(0, EDIT_CHARS) + "…" : s;
}

// The diff an edit's tool card shows: its `old` text taken out, its `new` text put in
// (null when the call is not an edit).
export function editDiff(name, args) {
  if (name !== "filesystem" || !args || typeof args !== "object" || args.action !== "edit") return null;
  if (typeof args.old !== "string" || typeof args.new !== "string") return null;
  const path = String(args.path ?? "");
  const lines = [`--- a/${path}`, `+++ b/${path}`];
  for (const l of clip(args.old).split("\n")) lines.push("-" + l);
  if (args.new !== "") for (const l of clip(args.new).split("\n")) lines.push("+" + l);
  const box = el("details", "tool-diff");
  box.open = true;
  box.append(el("summary", "", `edit of ${path}`), renderDiff(lines.join("\n")));
  return box;
}
