// The cards of the transcript: a tool call's card (its arguments, the tail of its
// output, its result and time) and an approval request's card (the tool, the rule, a
// terminal line's parts and what a session grant covers, the
// time left, the Approve / Deny buttons). Every string goes in as a text node.

import { el, oneLine } from "./dom.js";
import { editDiff } from "./diffview.js";
import { icon, setIcon } from "./icons.js";

const TAIL_LINES = 20; // lines of a tool's output shown on its card
const TAIL_CHARS = 4000;
const ARGS_CHARS = 4000;

function tail(text, lines = TAIL_LINES, chars = TAIL_CHARS) {
  const all = String(text ?? "").split("\n");
  let kept = all.slice(-lines).join("\n");
  if (kept.length > chars) kept = "…" + kept.slice(-chars);
  return { text: kept, more: Math.max(0, all.length - lines) };
}

export class ToolCard {
  constructor(parent, frame) {
    this.el = el("div", "tool running");
    this.started = performance.now();
    const head = el("div", "tool-head");
    this.status = el("span", "tool-status");
    setIcon(this.status, "running");
    this.dur = el("span", "tool-dur muted");
    head.append(this.status, " ", el("b", "tool-name", frame.name || "?"), " ", this.dur);
    this.el.append(head);
    const args = frame.arguments;
    if (args && (typeof args !== "object" || Object.keys(args).length)) {
      const json = typeof args === "string" ? args : JSON.stringify(args, null, 2);
      const d = el("details", "tool-args");
      d.append(el("summary", "", oneLine(typeof args === "string" ? args : JSON.stringify(args), 80)),
        el("pre", "", json.length > ARGS_CHARS ? json.slice(0, ARGS_CHARS) + "…" : json));
      this.el.append(d);
    }
    const diff = editDiff(frame.name, args);
    if (diff) this.el.append(diff);
    this.more = el("div", "tool-more muted");
    this.out = el("pre", "tool-out");
    this.el.append(this.more, this.out);
    this.buffer = "";
    this.dropped = 0;
    this.done = false;
    parent.append(this.el);
  }

  output(data) {
    if (this.done) return;
    const text = data.text ?? data.line ?? data.message ?? JSON.stringify(data);
    this.buffer += String(text);
    if (!this.buffer.endsWith("\n")) this.buffer += "\n";
    this.dropped += Number(data.dropped_lines) || 0;
    const t = tail(this.buffer.replace(/\n$/, ""));
    if (t.more) this.buffer = t.text + "\n";
    this.skipped = (this.skipped || 0) + t.more;
    this.show(t.text, this.skipped + this.dropped);
  }

  show(text, more) {
    this.out.textContent = text;
    this.more.textContent = more ? `… ${more} earlier lines` : "";
  }

  // The result (null: the run ended without one, e.g. stopped).
  finish(frame) {
    if (this.done) return;
    this.done = true;
    this.el.classList.remove("running");
    if (!frame) {
      this.el.classList.add("failed");
      setIcon(this.status, "stopped");
      return;
    }
    const ok = Boolean(frame.ok);
    this.el.classList.add(ok ? "ok" : "failed");
    setIcon(this.status, ok ? "ok" : "failed");
    const ms = Number.isFinite(frame.duration_ms) ? frame.duration_ms : null;
    if (ms !== null) this.dur.textContent = `${(ms / 1000).toFixed(1)}s`;
    const text = ok ? frame.output : (frame.error || frame.output);
    if (text) {
      const t = tail(text);
      this.show(t.text, t.more);
    }
  }
}

const SCOPES = [["once", "Approve once"], ["session", "For this session"], ["always", "Always"]];

export class ApprovalCard {
  constructor(parent, frame, answer) {
    this.el = el("div", "approval waiting");
    this.el.dataset.callId = String(frame.call_id);
    const timeout = Number(frame.timeout_sec) || 0;
    this.deadline = timeout ? Date.now() + timeout * 1000 : null;
    this.el.append(
      el("div", "approval-head", `? approve ${frame.tool || "?"}: ${oneLine(frame.summary, 300)}`),
      el("div", "approval-rule", `rule: ${oneLine(frame.rule || "?", 300)}`),
    );
    // A terminal line: each simple command with its decision, and what "For this
    // session" grants, in words.
    const marks = { allow: "✓", ask: "?", deny: "✗" };
    const parts = Array.isArray(frame.parts) ? frame.parts.slice(0, 16) : [];
    for (const p of parts) {
      const outside = (Array.isArray(p.paths) ? p.paths : []).filter((x) => !x.inside);
      const where = outside.length ? ` (outside the workspace: ${outside.map((x) => x.path).join(", ")})` : "";
      const line = `${marks[p.decision] || "?"} ${p.decision}: ${p.text}${where}`;
      this.el.append(el("div", `approval-part ${p.decision}`, oneLine(line, 300)));
    }
    if (frame.grant) {
      this.el.append(el("div", "approval-grant muted", `For this session allows: ${oneLine(frame.grant, 600)}`));
    }
    this.left = el("div", "approval-left muted");
    this.el.append(this.left);
    this.mode = String(frame.mode || "?");
    this.buttons = el("div", "approval-buttons");
    for (const [scope, label] of SCOPES) {
      const b = el("button", "approve", label);
      b.type = "button";
      b.dataset.scope = scope;
      b.addEventListener("click", () => this._click(answer, true, scope));
      this.buttons.append(b);
    }
    const deny = el("button", "deny", "Deny");
    deny.type = "button";
    deny.addEventListener("click", () => this._click(answer, false, "once"));
    this.buttons.append(deny);
    this.el.append(this.buttons);
    this.result = el("div", "approval-result");
    this.el.append(this.result);
    this.tick();
    parent.append(this.el);
  }

  _click(answer, approve, scope) {
    if (answer(approve, scope)) {
      for (const b of this.buttons.querySelectorAll("button")) b.disabled = true;
      this.result.textContent = approve ? `approving (${scope})…` : "denying…";
    }
  }

  tick() {
    if (!this.el.classList.contains("waiting")) return;
    if (!this.deadline) {
      this.left.textContent = `mode ${this.mode} · waits for your answer`;
      return;
    }
    const s = Math.max(0, Math.round((this.deadline - Date.now()) / 1000));
    const shown = s >= 60 ? `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}` : `${s}s`;
    this.left.textContent = `mode ${this.mode} · ${shown} left, then it is denied`;
  }

  decided(frame) {
    this.el.classList.remove("waiting");
    this.el.classList.add(frame.approved ? "approved" : "denied");
    this.buttons.remove();
    this.left.textContent = "";
    const how = frame.approved ? `approved (${frame.scope || "once"}, by ${frame.by || "owner"})`
      : `denied (by ${frame.by || "owner"})`;
    this.result.replaceChildren(icon(frame.approved ? "ok" : "failed"), " ", how);
  }
}
