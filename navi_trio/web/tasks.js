// The background tasks panel: the session's tasks (from `tasks` answers and live
// `task_update` frames) drawn as a list, each with Check and, while running, Cancel.

import { frames } from "./wire.js";
import { el, oneLine } from "./dom.js";
import { $, request, state } from "./page.js";

export function onTasks(frame) {
  if (frame.action === "list") {
    state.tasks.clear();
    for (const t of frame.tasks || []) if (t && t.task_id) state.tasks.set(String(t.task_id), { ...t });
  } else if (frame.action === "check" && frame.task) {
    const t = frame.task;
    const known = state.tasks.get(String(t.task_id)) || {};
    state.tasks.set(String(t.task_id), { ...known, ...t, checked: true });
  } else if (frame.action === "cancel") {
    const t = state.tasks.get(String(frame.task_id));
    if (t && frame.cancelled) t.status = "cancelled";
  }
  renderTasks();
}

export function onTaskUpdate(frame) {
  if (frame.session_id && frame.session_id !== state.sid) return;
  const id = String(frame.task_id);
  const known = state.tasks.get(id) || { task_id: id };
  state.tasks.set(id, {
    ...known, tool: frame.tool, status: frame.status, args: frame.args_summary || known.args,
    error: frame.error || known.error, excerpt: frame.result_excerpt || known.excerpt,
  });
  renderTasks();
}

export function renderTasks() {
  const ul = $("task-list");
  ul.replaceChildren();
  let running = 0;
  for (const t of state.tasks.values()) {
    if (t.status === "running") running++;
    const li = el("li", "task " + String(t.status || "").replace(/[^a-z]/g, ""));
    li.dataset.taskId = t.task_id;
    li.append(el("div", "task-head", `◆ ${t.task_id} · ${t.tool || "?"} · ${t.status || "?"}`));
    if (t.args) li.append(el("div", "task-args muted", oneLine(t.args, 120)));
    const detail = t.error || t.result || t.excerpt;
    if (detail) li.append(el("pre", "task-result", String(detail).slice(0, 2000)));
    const buttons = el("div", "task-buttons");
    const check = el("button", "task-check", "Check");
    check.type = "button";
    check.addEventListener("click", () => request(frames.tasks("check", state.sid, t.task_id), { kind: "tasks" }));
    buttons.append(check);
    if (t.status === "running") {
      const cancel = el("button", "task-cancel", "Cancel");
      cancel.type = "button";
      cancel.addEventListener("click", () => request(frames.tasks("cancel", state.sid, t.task_id), { kind: "tasks" }));
      buttons.append(cancel);
    }
    li.append(buttons);
    ul.append(li);
  }
  $("task-empty").hidden = state.tasks.size > 0;
  $("task-count").textContent = running ? `${running} running` : String(state.tasks.size);
}
