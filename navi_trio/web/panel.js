// The page's side panel: one at a time, over the transcript's right side, with a
// title and a close button (Escape closes it too). The folder picker, a rewind's
// preview and the changed files each fill it.

import { el } from "./dom.js";

let current = null;

export function openPanel(kind, title) {
  closePanel();
  const box = el("section", "side-panel " + kind);
  box.setAttribute("role", "dialog");
  box.setAttribute("aria-label", title);
  const head = el("div", "panel-head");
  const close = el("button", "panel-close", "✕");
  close.type = "button";
  close.setAttribute("aria-label", "close");
  close.addEventListener("click", closePanel);
  head.append(el("h2", "", title), close);
  const body = el("div", "panel-body");
  box.append(head, body);
  document.body.append(box);
  current = { kind, box, body };
  return current;
}

export function closePanel() {
  if (current) current.box.remove();
  current = null;
}

export function panelOpen(kind) {
  return current !== null && current.kind === kind && current.box.isConnected ? current : null;
}

export function button(text, cls, onClick) {
  const b = el("button", cls, text);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && current) {
    event.stopImmediatePropagation(); // closing the panel, not stopping the run
    closePanel();
  }
});
