// The working folder: the folder picker (the folders the user may work in, browsed
// through the daemon's `folders` request, and the last ones used) and the folder shown
// in the header. The chosen folder is the `cwd` of the messages sent from then on; a
// session opened again works in the folder its last message named.

import { el } from "./dom.js";
import { $, request, state } from "./page.js";
import { button, closePanel, openPanel, panelOpen } from "./panel.js";

function folderFrame(path) {
  const f = { type: "folders" };
  if (path) f.path = path;
  if (state.sid) f.session_id = state.sid;
  return f;
}

// -- the header and the composer's button ---------------------------------------------

const shown = el("span", "session-folder muted");
shown.id = "session-folder";
$("session-title").after(shown);

const pick = button("Folder", "folder-button", () => openPicker());
pick.id = "folder-button";
pick.title = "the folder the next messages work in";
document.querySelector("#composer .controls").append(pick);

export function setFolder(path) {
  state.cwd = path || null;
  showFolder();
}

function showFolder() {
  const where = state.cwd || (state.sid ? "the session's own folder" : "a new session folder");
  shown.textContent = `in ${where}`;
  shown.title = state.cwd || "";
  pick.textContent = state.cwd ? `Folder: ${short(state.cwd)}` : "Folder";
}

function short(path) {
  const parts = path.split("/").filter(Boolean);
  return parts.length > 2 ? "…/" + parts.slice(-2).join("/") : path;
}

// A session's history says where it worked: the cwd of its last user message (an empty
// session keeps the folder picked for it).
export function onSessionHistory(messages) {
  const users = messages.filter((m) => m && m.role === "user");
  if (!users.length) { showFolder(); return; }
  const cwd = users[users.length - 1].cwd;
  setFolder(typeof cwd === "string" && cwd ? cwd : null);
}

// -- the picker -----------------------------------------------------------------------

function openPicker() {
  const panel = openPanel("folders", "Working folder");
  panel.body.append(el("p", "muted", "Loading the folders you may work in…"));
  request(folderFrame(null), { kind: "folders", start: true, failed: failed });
}

function failed(frame) {
  const panel = panelOpen("folders");
  if (panel) panel.body.append(el("p", "line error", `✗ ${frame.message || frame.code}`));
}

export function onFolders(frame, what) {
  const panel = panelOpen("folders");
  if (!panel) return;
  if (what && what.start) return drawStart(panel, frame);
  drawListing(panel, frame);
}

function entry(path, label) {
  const b = button(label || path, "folder-entry", () => browse(path));
  b.dataset.path = path;
  return b;
}

function drawStart(panel, frame) {
  panel.body.replaceChildren();
  const now = el("p", "folder-now", `Now: ${state.cwd || "the session's own folder"}`);
  panel.body.append(now);
  const starts = Array.isArray(frame.starts) ? frame.starts.map(String) : [];
  const recent = Array.isArray(frame.recent) ? frame.recent.map(String) : [];
  panel.body.append(el("h3", "", "Where you may work"));
  const list = el("div", "folder-list starts");
  for (const p of starts) list.append(entry(p, p === frame.session_folder ? `${p} (this session's folder)` : p));
  if (!starts.length) list.append(el("p", "muted", "no folder but a session's own"));
  panel.body.append(list);
  panel.body.append(el("h3", "", "Last used"));
  const last = el("div", "folder-list recent");
  for (const p of recent) last.append(entry(p));
  if (!recent.length) last.append(el("p", "muted", "none yet"));
  panel.body.append(last);
  panel.body.append(button("Use the session's own folder", "folder-default", () => { setFolder(null); closePanel(); }));
}

function browse(path) {
  request(folderFrame(path), { kind: "folders", failed: failed });
}

function drawListing(panel, frame) {
  panel.body.replaceChildren();
  const path = String(frame.path || "");
  panel.body.append(el("p", "folder-path", path));
  const row = el("div", "folder-actions");
  const use = button("Use this folder", "folder-use", () => { setFolder(path); closePanel(); });
  row.append(use);
  if (typeof frame.parent === "string") row.append(button("↑ Up", "folder-up", () => browse(frame.parent)));
  row.append(button("Back", "folder-back", openPicker));
  panel.body.append(row);
  const list = el("div", "folder-list children");
  const names = Array.isArray(frame.folders) ? frame.folders.map(String) : [];
  for (const name of names) {
    const b = entry(path.replace(/\/$/, "") + "/" + name, name + "/");
    b.dataset.name = name;
    list.append(b);
  }
  if (!names.length) list.append(el("p", "muted", "no sub-folders"));
  if (frame.more) list.append(el("p", "muted", `… and ${frame.more} more`));
  panel.body.append(list);
}

showFolder();
