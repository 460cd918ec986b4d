// Rewind, undo and fork, from the transcript: each user message has its rewind point
// (chat, files or both) and a fork; the composer has the branch list (undo a rewind)
// and a fork of the whole session. Every rewind shows the daemon's preview first (the
// messages removed; per folder the files restored, created and deleted, the conflicts,
// the folders left out) and applies exactly that with its token; the message rewound
// to goes back into the input box. A fork opens in a new tab.
//
// The protocol's `checkpoints`, `rewind` and `fork` frames (docs/pages/sessions.md,
// "Checkpoints"); message ids come from a fresh `checkpoints` list, never guessed.

import { el, oneLine } from "./dom.js";
import { $, request, showError, state } from "./page.js";
import { button, closePanel, openPanel, panelOpen } from "./panel.js";
import { showChanges } from "./changes.js";

const RESTORES = [["both", "chat and files"], ["chat", "chat only"], ["files", "files only"]];

// -- the points on the user messages --------------------------------------------------

function decorate(user) {
  if (user.nextElementSibling && user.nextElementSibling.classList.contains("user-tools")) return;
  const bar = el("div", "user-tools");
  bar.append(
    button("Rewind", "rewind-open", () => withPoint(user, openRewind)),
    button("Fork", "fork-open", () => withPoint(user, openFork)),
    button("Changes since", "changes-open", () => withPoint(user, (point) => showChanges(point))),
  );
  user.after(bar);
}

new MutationObserver((records) => {
  for (const r of records) {
    for (const node of r.addedNodes) {
      if (!(node instanceof HTMLElement)) continue;
      if (node.classList.contains("user")) decorate(node);
      else for (const u of node.querySelectorAll(".user")) decorate(u);
    }
  }
}).observe($("transcript"), { childList: true, subtree: true });

// The point of a user message shown: the session's list asked for afresh, the message
// found by its place among the user messages (and its text, should a line shown not be
// one the daemon kept).
function withPoint(user, then) {
  if (!state.sid) { showError("nothing to rewind yet: this session has no messages"); return; }
  if (state.busy) { showError("a run is active: stop it or wait, then rewind"); return; }
  const users = [...$("transcript").querySelectorAll(".user")];
  const index = users.indexOf(user);
  const text = user.textContent || "";
  request({ type: "checkpoints", session_id: state.sid }, { kind: "rw-list", then: (list) => {
    const points = Array.isArray(list.messages) ? list.messages : [];
    const more = Number(list.more_messages) || 0;
    const same = (p) => p && text.includes(String(p.text || "").replace(/…$/, ""));
    let point = points[index - more];
    if (!same(point)) point = [...points].reverse().find(same);
    if (!point) { showError("that message is not one the daemon kept: reload the session"); return; }
    then(point, list);
  } });
}

// -- rewind ---------------------------------------------------------------------------

function openRewind(point) {
  const panel = openPanel("rewind", "Rewind");
  panel.body.append(el("p", "", "Go back to just before this message:"), el("blockquote", "rewind-message", oneLine(point.text, 300)));
  const choice = el("fieldset", "rewind-restore");
  choice.append(el("legend", "", "What goes back"));
  for (const [value, label] of RESTORES) {
    const input = el("input");
    input.type = "radio";
    input.name = "restore";
    input.value = value;
    input.checked = value === "both";
    const lab = el("label");
    lab.append(input, " " + label);
    choice.append(lab);
  }
  const force = el("input");
  force.type = "checkbox";
  force.id = "rewind-force";
  const forceLabel = el("label", "muted");
  forceLabel.append(force, " also put back files someone else changed too (conflicts)");
  panel.body.append(choice, forceLabel);
  const out = el("div", "rewind-preview");
  panel.body.append(button("Preview", "rewind-preview-button", () => {
    const restore = choice.querySelector("input:checked").value;
    preview({ type: "rewind", session_id: state.sid, to: point.message_id, restore,
      conflicts: force.checked ? "restore" : "keep" }, out);
  }), out);
}

function preview(ask, out) {
  out.replaceChildren(el("p", "muted", "asking the daemon what would change…"));
  request(ask, { kind: "rw-preview", ask, out, failed: (f) => failedIn(out, f) });
}

function failedIn(out, frame) {
  if (out.isConnected) out.replaceChildren(el("p", "line error", `✗ [${frame.code}] ${oneLine(frame.message, 500)}`));
}

function drawPreview(frame, ask, out) {
  out.replaceChildren();
  const chat = [];
  if (frame.messages_removed) chat.push(`${frame.messages_removed} message(s) removed from the chat`);
  if (frame.messages_restored) chat.push(`${frame.messages_restored} message(s) brought back`);
  out.append(el("p", "preview-chat", chat.join("; ") || "the chat stays as it is"));
  const files = frame.files;
  if (files && Array.isArray(files.roots)) {
    for (const r of files.roots) {
      const moved = ["restored", "created", "deleted", "modes", "dirs_created", "dirs_deleted", "conflicts_count"];
      if (!moved.some((k) => Number(r[k]))) {
        out.append(el("div", "preview-root empty muted", `nothing changes in ${r.root}`));
        continue;
      }
      const box = el("div", "preview-root");
      box.append(el("div", "preview-root-path", String(r.root)));
      box.append(el("div", "preview-counts",
        `${r.restored} restored · ${r.created} created · ${r.deleted} deleted` +
        (r.modes ? ` · ${r.modes} modes` : "") + ` · ${r.bytes} bytes written`));
      const ul = el("ul", "preview-changes");
      for (const c of r.changes || []) {
        const li = el("li", "change " + String(c.what).replace(/[^a-z_]/g, ""));
        li.append(el("span", "change-what", c.what), " ", el("code", "change-path", c.path));
        ul.append(li);
      }
      if (r.more_changes) ul.append(el("li", "muted", `… ${r.more_changes} more`));
      box.append(ul);
      if (r.conflicts_count) {
        box.append(el("div", "preview-conflicts warning",
          `${r.conflicts_count} conflict(s), changed by navi and by someone else: ${(r.conflicts || []).join(", ")}` +
          (ask.conflicts === "restore" ? " (put back too)" : " (kept as they are)")));
      }
      if (r.others_count) box.append(el("div", "muted", `${r.others_count} file(s) changed only by someone else stay: ${(r.others || []).join(", ")}`));
      if (r.kept_count) box.append(el("div", "muted", `${r.kept_count} kept as they are: ${(r.kept || []).map((k) => `${k.path} (${k.why})`).join(", ")}`));
      out.append(box);
    }
    if (files.undo_skipped) out.append(el("p", "warning", `⚠ cannot be undone: ${files.undo_skipped}`));
  } else if (frame.files_note) {
    out.append(el("p", "muted preview-files-note", frame.files_note));
  }
  for (const left of frame.roots_left_out || []) {
    out.append(el("p", "warning preview-left-out", `left out: ${left.root} — ${left.why}`));
  }
  if (frame.not_covered) out.append(el("p", "muted preview-not-covered", frame.not_covered));
  const apply = button("Apply", "rewind-apply", () => {
    apply.disabled = true;
    request({ ...ask, confirm: frame.token }, { kind: "rw-apply", text: frame.text || "", ask,
      failed: (f) => { apply.disabled = false; failedIn(out, f); } });
  });
  out.append(el("div", "preview-buttons"));
  out.lastChild.append(apply, button("Cancel", "rewind-cancel", closePanel));
}

function onDone(frame, what) {
  closePanel();
  const undo = frame.undo ? " (undo it under Branches)" : "";
  showError(`rewound${undo}: ${frame.messages_removed || 0} message(s) removed, ${fileCount(frame.files)} file change(s)`, "notice");
  if (frame.messages_removed && frame.to && what.text) {
    const input = $("input");
    input.value = what.text; // to send again, as it is or edited
    input.focus();
  }
  if (Array.isArray(frame.failed) && frame.failed.length) {
    showError(`${frame.failed.length} file(s) could not be restored: ${frame.failed.map((f) => f.path).join(", ")}`);
  }
}

function fileCount(files) {
  if (!files || typeof files !== "object") return 0;
  return ["restored", "created", "deleted"].reduce((n, k) => n + (Number(files[k]) || 0), 0);
}

// -- branches: undo a rewind ----------------------------------------------------------

function openBranches() {
  if (!state.sid) { showError("this session has no rewinds yet"); return; }
  const panel = openPanel("branches", "Branches");
  panel.body.append(el("p", "muted", "loading…"));
  request({ type: "checkpoints", session_id: state.sid }, { kind: "rw-list", then: drawBranches });
}

function drawBranches(list) {
  const panel = panelOpen("branches");
  if (!panel) return;
  panel.body.replaceChildren(el("p", "muted", "Each rewind left a branch: bringing it back undoes the rewind."));
  const branches = Array.isArray(list.branches) ? [...list.branches].reverse() : [];
  const out = el("div", "rewind-preview");
  const ul = el("ul", "branch-list");
  for (const b of branches) {
    const li = el("li", "branch");
    li.dataset.branch = String(b.branch_id);
    const when = typeof b.created_at === "number" ? new Date(b.created_at * 1000).toLocaleTimeString() : "";
    li.append(el("div", "", `${when} · ${b.restore} · ${b.messages} message(s): ${oneLine(b.text || "", 120)}`),
      button("Undo this rewind", "branch-undo", () =>
        preview({ type: "rewind", session_id: state.sid, branch: String(b.branch_id), restore: String(b.restore || "both") }, out)));
    ul.append(li);
  }
  if (!branches.length) ul.append(el("li", "muted", "no rewind to undo in this session"));
  panel.body.append(ul, out);
}

// -- fork -----------------------------------------------------------------------------

function openFork(point) {
  const panel = openPanel("fork", "Fork");
  panel.body.append(el("p", "", point ? "A new session with the conversation before this message:" : "A new session with the whole conversation."));
  if (point) panel.body.append(el("blockquote", "rewind-message", oneLine(point.text, 300)));
  const files = el("input");
  files.type = "checkbox";
  files.checked = true;
  files.id = "fork-files";
  const lab = el("label");
  lab.append(files, " with a copy of the files as they were then");
  const out = el("div", "fork-result");
  panel.body.append(lab, button("Fork into a new tab", "fork-go", () => {
    // Opened now, while the click counts: a window opened on the reply is a popup.
    const tab = window.open("", "_blank");
    const ask = { type: "fork", session_id: state.sid, files: files.checked };
    if (point) ask.at = point.message_id;
    out.replaceChildren(el("p", "muted", "forking…"));
    request(ask, { kind: "fork", tab, failed: (f) => { if (tab) tab.close(); failedIn(out, f); } });
  }), out);
}

function onForked(frame, what) {
  const url = `${location.pathname}#${encodeURIComponent(String(frame.new_session_id))}`;
  const left = (frame.left_out || []).map((l) => (typeof l === "object" ? l.root : l));
  if (what.tab && !what.tab.closed) what.tab.location.href = url;
  else window.open(url, "_blank");
  closePanel();
  showError(`forked into ${frame.new_session_id}${frame.folder ? ` (files in ${frame.folder})` : ""}` +
    (left.length ? `; left out: ${left.join(", ")}` : ""), "notice");
}

// -- replies --------------------------------------------------------------------------

export function onRewindReply(frame, what) {
  if (!what) return;
  if (frame.type === "checkpoints" && what.kind === "rw-list") return what.then(frame);
  if (frame.type === "fork") return onForked(frame, what);
  if (frame.type !== "rewind") return;
  if (frame.action === "preview" && what.out && what.out.isConnected) drawPreview(frame, what.ask, what.out);
  else if (frame.action === "done") onDone(frame, what);
}

const controls = document.querySelector("#composer .controls");
const branches = button("Branches", "branches-open", openBranches);
branches.id = "branches-open";
branches.title = "undo a rewind";
const fork = button("Fork", "fork-session", () => state.sid ? openFork(null) : showError("nothing to fork yet"));
fork.id = "fork-session";
controls.append(branches, fork);
