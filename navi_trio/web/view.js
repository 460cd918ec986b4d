// The transcript: a session's frames in, DOM out. It owns display state only (lanes of
// streaming text, open tool cards, the plan, approval cards) and never talks to the
// daemon itself: answering an approval goes through `hooks.answer`.
//
// Every string from the model, a tool or the daemon goes in as a text node (markdown.js
// builds elements, never parses HTML). Text deltas are buffered and drawn at most once
// per animation frame: a finished Markdown block (up to a blank line outside a fence) is
// rendered once and kept; only the unfinished tail is redrawn.

import { render, splitBlocks } from "./markdown.js";

const TAIL_LINES = 20; // lines of a tool's output shown on its card
const TAIL_CHARS = 4000;
const ARGS_CHARS = 4000;
const SUMMARY_CHARS = 100;
const STEP_MARK = /\s+—\s+(TOOL:\s*[\w.-]+|AGENT:\s*[\w.-]+|SELF)\s*$/;
const TICKS = { done: "✔", in_progress: "▸", failed: "✗", pending: "☐" };

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

function tail(text, lines = TAIL_LINES, chars = TAIL_CHARS) {
  const all = String(text ?? "").split("\n");
  let kept = all.slice(-lines).join("\n");
  if (kept.length > chars) kept = "…" + kept.slice(-chars);
  return { text: kept, more: Math.max(0, all.length - lines) };
}

function words(text) {
  const m = String(text).match(/\S+/g);
  return m ? m.length : 0;
}

export function errorText(frame) {
  const code = frame.code && frame.code !== "error" ? ` [${frame.code}]` : "";
  const hint = HINTS[frame.code] ? ` — ${HINTS[frame.code]}` : "";
  return `✗ error${code}: ${oneLine(frame.message, 1000)}${hint}`;
}

class Lane {
  constructor(parent, cls) {
    this.el = el("div", cls);
    this.body = this.el;
    parent.append(this.el);
    this.answer = null; // the .answer element text goes to now
    this.tail = ""; // its text not yet in a finished block
    this.dirty = false;
    this.thinking = null;
    this.thinkingWords = 0;
    this.streamed = false;
    this.words = 0;
  }
}

export class Transcript {
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks; // answer(callId, approve, scope) -> bool, activity(text)
    this.scheduled = false;
    this.timer = setInterval(() => this._tick(), 1000);
    this.clear();
  }

  clear() {
    this.root.replaceChildren();
    this.lanes = new Map(); // agent id -> Lane (sub-agents) ; null -> main lane of the turn
    this.main = null;
    this.cards = new Map(); // call id -> tool card
    this.approvals = new Map(); // call id -> approval card
    this.plan = null;
    this.dirty = new Set();
  }

  // -- plain lines -----------------------------------------------------------------

  _turn() {
    if (!this.main) {
      const turn = el("div", "turn");
      this.root.append(turn);
      this.main = new Lane(turn, "lane main");
    }
    return this.main;
  }

  user(text) {
    this.flush();
    for (const old of this.root.querySelectorAll(".placeholder")) old.remove();
    if (this.main) this._close(this.main);
    const turn = el("div", "turn");
    turn.append(el("div", "user", text));
    this.root.append(turn);
    this.main = new Lane(turn, "lane main");
    this.lanes.clear();
    this.plan = null;
    this._scroll();
  }

  line(text, cls = "notice", lane = null) {
    const target = lane || this._turn();
    this._close(target);
    target.body.append(el("div", "line " + cls, text));
    this._scroll();
  }

  notice(text) { this.line(text, "notice"); }

  error(frame, lane = null) { this.line(errorText(frame), "error", lane); }

  // -- frames ----------------------------------------------------------------------

  _lane(frame) {
    if (!frame.is_subagent) return this._turn();
    const id = String(frame.agent_id || "sub-agent");
    let lane = this.lanes.get(id);
    if (!lane) {
      const parent = this._turn();
      this._close(parent);
      lane = new Lane(parent.body, "lane sub");
      lane.el.dataset.agent = id;
      lane.head = el("div", "sub-head", `↳ sub-agent ${id}`);
      lane.el.append(lane.head);
      lane.body = el("div", "sub-body");
      lane.el.append(lane.body);
      this.lanes.set(id, lane);
    }
    return lane;
  }

  frame(frame) {
    const handler = this["_on_" + frame.type];
    if (handler) handler.call(this, frame, this._lane(frame));
  }

  _on_text_delta(frame, lane) {
    this._endThinking(lane);
    if (!lane.answer) {
      lane.answer = el("div", "answer md");
      lane.done = el("div", "done");
      lane.tailEl = el("div", "tail");
      lane.answer.append(lane.done, lane.tailEl);
      lane.body.append(lane.answer);
    }
    const text = String(frame.text ?? "");
    lane.tail += text;
    lane.streamed = true;
    if (!frame.is_subagent) {
      lane.words += words(text);
      this.hooks.activity(`answering… ${lane.words} words`);
    }
    this._mark(lane);
  }

  _on_thinking_delta(frame, lane) {
    if (!lane.thinking) {
      this._close(lane);
      const d = el("details", "thinking");
      d.summaryEl = el("summary", "", "thinking…");
      d.textEl = el("div", "thinking-text");
      d.append(d.summaryEl, d.textEl);
      lane.body.append(d);
      lane.thinking = d;
      lane.thinkingWords = 0;
    }
    const text = String(frame.text ?? "");
    lane.thinking.textEl.append(text);
    lane.thinkingWords += words(text);
    lane.thinking.summaryEl.textContent = `thinking… (${lane.thinkingWords} words)`;
    if (!frame.is_subagent) this.hooks.activity(`thinking… ${lane.thinkingWords} words`);
  }

  _on_thinking_end(frame, lane) { this._endThinking(lane); }

  _endThinking(lane) {
    if (lane.thinking) {
      lane.thinking.summaryEl.textContent = `thought (${lane.thinkingWords} words)`;
      lane.thinking = null;
    }
  }

  _on_stream_end(frame, lane) {
    this._close(lane);
    if (!lane.streamed && frame.text) {
      const a = el("div", "answer md");
      a.append(render(String(frame.text)));
      lane.body.append(a);
    }
    lane.streamed = false;
    if (frame.stopped || frame.reason === "stopped") this.line("■ stopped", "stopped", lane);
    else if (frame.reason && !["complete", "error"].includes(frame.reason)) {
      this.line(`⚠ the run ended: ${frame.reason}`, "warning", lane);
    }
    if (!frame.is_subagent) {
      lane.words = 0;
      for (const card of this.cards.values()) card.finish(null); // a stop leaves none open
      this.cards.clear();
    }
  }

  _on_model_info() {}

  _on_plan_phase(frame, lane) {
    if (frame.status === "started") this.line(`· planning: ${frame.phase}…`, "notice", lane);
  }

  _on_plan(frame, lane) {
    const steps = (frame.steps || []).filter((s) => s && typeof s === "object");
    this._close(lane);
    if (!steps.length) {
      const a = el("div", "answer md plan-text");
      a.append(render(String(frame.text || "")));
      lane.body.append(a);
      return;
    }
    this._checklist(lane, steps.map((s, i) => ({
      index: s.index ?? i + 1, text: s.description || "", status: "pending",
    })));
  }

  _on_todo_updated(frame, lane) {
    const steps = (frame.steps || []).filter((s) => s && typeof s === "object");
    if (!steps.length) return;
    if (this.plan && this.plan.el.isConnected) this._fillPlan(this.plan, steps);
    else this._checklist(this._turn(), steps);
  }

  _checklist(lane, steps) {
    this._close(lane);
    const box = el("div", "plan");
    const head = el("div", "plan-head");
    const list = el("ol", "plan-steps");
    box.append(head, list);
    lane.body.append(box);
    this.plan = { el: box, head, list };
    this._fillPlan(this.plan, steps);
    this._scroll();
  }

  _fillPlan(plan, steps) {
    const done = steps.filter((s) => s.status === "done").length;
    plan.head.replaceChildren(el("b", "", "Plan "), el("span", "muted", `${done}/${steps.length}`));
    plan.list.replaceChildren(...steps.map((s) => {
      const status = String(s.status || "pending");
      const li = el("li", "step " + status.replace(/[^a-z_]/g, ""));
      li.dataset.status = status;
      li.append(el("span", "tick", TICKS[status] || "☐"), " ",
        el("span", "step-text", `${s.index ?? ""}. ${oneLine(String(s.text || "").replace(STEP_MARK, ""))}`));
      return li;
    }));
  }

  _on_tool_started(frame, lane) {
    this._close(lane);
    const card = new ToolCard(lane.body, frame);
    this.cards.set(String(frame.call_id), card);
    if (!frame.is_subagent) this.hooks.activity(`running ${frame.name}…`);
    this._scroll();
  }

  _on_tool_event(frame) {
    const card = this.cards.get(String(frame.call_id));
    if (card) card.output(frame.data || {});
  }

  _on_tool_result(frame, lane) {
    let card = this.cards.get(String(frame.call_id));
    if (!card) card = new ToolCard(lane.body, frame); // replay from the middle of a call
    card.finish(frame);
    this.cards.delete(String(frame.call_id));
  }

  _on_approval_request(frame, lane) {
    const id = String(frame.call_id);
    if (this.approvals.has(id)) return;
    this._close(lane);
    const card = new ApprovalCard(lane.body, frame, (approve, scope) =>
      this.hooks.answer(id, approve, scope, String(frame.session_id || "")));
    this.approvals.set(id, card);
    this._scroll();
  }

  _on_approval_decided(frame, lane) {
    const card = this.approvals.get(String(frame.call_id));
    if (card) card.decided(frame);
    else {
      const verb = frame.approved ? "✔ approved" : "✗ denied";
      this.line(`${verb} (${frame.scope || "once"}, by ${frame.by || "owner"})`, "notice", lane);
    }
  }

  // The `approvals` list of a subscribe's ok: the requests still waiting.
  waiting(requests) {
    for (const r of requests) if (r && r.call_id) this._on_approval_request(r, this._lane(r));
  }

  _on_compression_started(frame, lane) {
    this.line(`compressing the context (${frame.reason})…`, "notice", lane);
  }

  _on_context_compressed(frame, lane) {
    this.line(`context compressed: ${frame.tokens_before} → ${frame.tokens_after} tokens`, "notice", lane);
  }

  _on_error(frame, lane) { this.error(frame, lane); }

  _on_warning(frame, lane) { this.line(`⚠ ${oneLine(frame.message, 1000)}`, "warning", lane); }

  _on_message_queued(frame, lane) {
    const dropped = frame.dropped_total ? ` (${frame.dropped_total} older dropped)` : "";
    this.line(`queued #${frame.position}: ${oneLine(frame.text, 80)}${dropped}`, "queued", lane);
  }

  _on_subagent_started(frame, lane) {
    lane.head.textContent = `↳ sub-agent ${frame.agent_id || ""} (${frame.profile_id}): ${oneLine(frame.task, SUMMARY_CHARS)}`;
  }

  _on_subagent_finished(frame, lane) {
    this._close(lane);
    lane.el.classList.add(frame.completed ? "finished" : "failed");
    const verdict = frame.completed ? "done" : "did not finish";
    lane.body.append(el("div", "line sub-end", `↳ ${verdict} (${frame.tokens || 0} tokens)`));
  }

  // -- history ---------------------------------------------------------------------

  history(messages) {
    const calls = new Map();
    for (const m of messages) {
      const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? "");
      if (m.role === "user") this.user(content);
      else if (m.role === "assistant") {
        const lane = this._turn();
        if (m.is_plan) {
          const d = el("details", "plan-text");
          d.append(el("summary", "", "plan"));
          const body = el("div", "md");
          body.append(render(content));
          d.append(body);
          lane.body.append(d);
          continue;
        }
        if (content.trim()) {
          const a = el("div", "answer md");
          a.append(render(content));
          lane.body.append(a);
        }
        if (m.partial) lane.body.append(el("div", "line stopped", "■ stopped"));
        for (const call of m.tool_calls || []) {
          const fn = (call && call.function) || call || {};
          let args = fn.arguments;
          if (typeof args === "string") { try { args = JSON.parse(args); } catch (e) { /* as is */ } }
          const card = new ToolCard(lane.body, { name: fn.name, arguments: args });
          if (call && call.id) calls.set(String(call.id), card);
        }
      } else if (m.role === "tool") {
        const card = calls.get(String(m.tool_call_id));
        if (card) card.finish({ ok: !/^error\b/i.test(content), output: content });
        else this.line(`⎿ ${oneLine(content, SUMMARY_CHARS)}`, "notice");
      }
    }
    this.main = null; // live frames of a new run start their own turn
    this._scroll();
  }

  // -- drawing -------------------------------------------------------------------------

  _mark(lane) {
    this.dirty.add(lane);
    if (this.scheduled) return;
    this.scheduled = true;
    const draw = () => { this.scheduled = false; this.flush(); };
    if (document.hidden) setTimeout(draw, 50);
    else requestAnimationFrame(draw);
  }

  // Draw every lane's waiting text now.
  flush() {
    for (const lane of this.dirty) this._draw(lane, false);
    this.dirty.clear();
    this._scroll();
  }

  _draw(lane, final) {
    if (!lane.answer) return;
    const [done, rest] = final ? [lane.tail, ""] : splitBlocks(lane.tail);
    if (done) {
      lane.done.append(render(done));
      lane.tail = rest;
    }
    lane.tailEl.replaceChildren(render(lane.tail));
  }

  // End the lane's current answer (a tool card, a plan or a line comes next).
  _close(lane) {
    this._endThinking(lane);
    if (lane.answer) {
      this._draw(lane, true);
      this.dirty.delete(lane);
      lane.answer = null;
      lane.tail = "";
    }
  }

  _scroll() {
    const r = this.root;
    if (r.scrollHeight - r.scrollTop - r.clientHeight < 200) r.scrollTop = r.scrollHeight;
  }

  _tick() {
    for (const card of this.approvals.values()) card.tick();
  }
}

class ToolCard {
  constructor(parent, frame) {
    this.el = el("div", "tool running");
    this.started = performance.now();
    const head = el("div", "tool-head");
    this.status = el("span", "tool-status", "⏳");
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
      this.status.textContent = "■";
      return;
    }
    const ok = Boolean(frame.ok);
    this.el.classList.add(ok ? "ok" : "failed");
    this.status.textContent = ok ? "✔" : "✗";
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

class ApprovalCard {
  constructor(parent, frame, answer) {
    this.el = el("div", "approval waiting");
    this.el.dataset.callId = String(frame.call_id);
    const timeout = Number(frame.timeout_sec) || 0;
    this.deadline = timeout ? Date.now() + timeout * 1000 : null;
    this.el.append(
      el("div", "approval-head", `? approve ${frame.tool || "?"}: ${oneLine(frame.summary, 300)}`),
      el("div", "approval-rule", `rule: ${oneLine(frame.rule || "?", 300)}`),
    );
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
    const how = frame.approved ? `✔ approved (${frame.scope || "once"}, by ${frame.by || "owner"})`
      : `✗ denied (by ${frame.by || "owner"})`;
    this.result.textContent = how;
  }
}
