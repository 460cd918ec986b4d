// The transcript: a session's frames in, DOM out. It owns display state only (lanes of
// streaming text, open tool and approval cards (cards.js), the plan) and never talks to the
// daemon itself: answering an approval goes through `hooks.answer`.
//
// Every string from the model, a tool or the daemon goes in as a text node (markdown.js
// builds elements, never parses HTML). Text deltas are buffered and drawn at most once
// per animation frame: a finished Markdown block (up to a blank line outside a fence) is
// rendered once and kept; only the unfinished tail is redrawn.

import { ApprovalCard, ToolCard } from "./cards.js";
import { copyCode, copyMessage } from "./copy.js";
import { el, errorText, oneLine } from "./dom.js";
import { icon, setIcon } from "./icons.js";
import { render, splitBlocks } from "./markdown.js";
import { Waiting } from "./waiting.js";

const SUMMARY_CHARS = 100;
const STEP_MARK = /\s+—\s+(TOOL:\s*[\w.-]+|AGENT:\s*[\w.-]+|SELF)\s*$/;
const TICKS = { done: "ok", in_progress: "in_progress", failed: "failed", pending: "pending" };

function words(text) {
  const m = String(text).match(/\S+/g);
  return m ? m.length : 0;
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
    this.raw = ""; // the current answer's text as the model wrote it (copied as is)
  }
}

export class Transcript {
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks; // answer(callId, approve, scope) -> bool, activity(text), plan(text)
    this.scheduled = false;
    this.timer = setInterval(() => this._tick(), 1000);
    this.wait = new Waiting((text) => this.hooks.activity(text));
    this.clear();
  }

  clear() {
    this.wait.stop();
    this.root.replaceChildren();
    this.lanes = new Map(); // agent id -> Lane (sub-agents) ; null -> main lane of the turn
    this.main = null;
    this.cards = new Map(); // call id -> tool card
    this.approvals = new Map(); // call id -> approval card
    this.plan = null;
    this.dirty = new Set();
    this.hooks.plan("");
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
    const bubble = el("div", "user", text);
    copyMessage(bubble, text);
    turn.append(bubble);
    this.root.append(turn);
    this.main = new Lane(turn, "lane main");
    this.lanes.clear();
    this.plan = null;
    this._scroll();
    return turn;
  }

  // A message of ours whose run starts now: its turn, and the wait for the model's first
  // word. Returns the turn (`drop` takes it away again if the daemon refuses the message).
  started(text) {
    const turn = this.user(text);
    this.wait.start(this.main.body);
    this._scroll();
    return turn;
  }

  // Take away the turn of a message the daemon refused: it is not in the session.
  drop(turn) {
    if (!turn || !turn.isConnected) return;
    if (this.main && this.main.el.parentNode === turn) {
      this.wait.stop();
      this.main = null;
    }
    turn.remove();
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
    const lane = this._lane(frame);
    if (handler) handler.call(this, frame, lane);
    if (!frame.is_subagent) this.wait.frame(frame, lane.body);
  }

  _on_text_delta(frame, lane) {
    this._endThinking(lane);
    if (!lane.answer) {
      lane.answer = el("div", "answer md");
      lane.done = el("div", "done");
      lane.tailEl = el("div", "tail");
      lane.answer.append(lane.done, lane.tailEl);
      lane.body.append(lane.answer);
      lane.raw = "";
    }
    const text = String(frame.text ?? "");
    lane.tail += text;
    lane.raw += text;
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
    const [shown, raw] = [lane.answer, lane.raw];
    this._close(lane);
    const text = String(frame.text ?? "");
    if (!lane.streamed && text) this._answer(lane, text);
    else if (shown && raw && text !== raw && text.endsWith(raw)) {
      // Opened mid-answer (a second tab): the words streamed before it came are in no
      // history yet, nor after the seq it followed from. The end's text is all of them.
      shown.replaceWith(this._whole(text));
    }
    lane.streamed = false;
    if (frame.stopped || frame.reason === "stopped") this._stopped(lane);
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
    // The card scrolls with its turn (pinned, it covered tool output): the status bar
    // keeps the progress in sight.
    const now = steps.find((s) => s.status === "in_progress") || steps.find((s) => s.status !== "done");
    this.hooks.plan(`plan ${done}/${steps.length}${now ? `: ${oneLine(String(now.text || "").replace(STEP_MARK, ""), 40)}` : ""}`);
    plan.list.replaceChildren(...steps.map((s) => {
      const status = String(s.status || "pending");
      const li = el("li", "step " + status.replace(/[^a-z_]/g, ""));
      li.dataset.status = status;
      const tick = el("span", "tick");
      setIcon(tick, TICKS[status] || "pending", status);
      li.append(tick, " ",
        el("span", "step-text", `${s.index ?? ""}. ${oneLine(String(s.text || "").replace(STEP_MARK, ""))}`));
      return li;
    }));
  }

  _on_tool_started(frame, lane) {
    const known = this.cards.get(String(frame.call_id));
    if (known && known.fromHistory) return; // the history showed it already
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
    // The call's card (started before it asked) goes below the question: its result
    // then reads after the answer to it.
    const tool = this.cards.get(id);
    if (tool && tool.el.parentNode === card.el.parentNode) tool.el.before(card.el);
    this.approvals.set(id, card);
    this._scroll();
  }

  _on_approval_decided(frame, lane) {
    const card = this.approvals.get(String(frame.call_id));
    if (card) card.decided(frame);
    else {
      const verb = frame.approved ? "approved" : "denied";
      this.line(`${verb} (${frame.scope || "once"}, by ${frame.by || "owner"})`, "notice", lane);
      lane.body.lastElementChild.prepend(icon(frame.approved ? "ok" : "failed"), " ");
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
        if (content.trim()) this._answer(lane, content);
        // A turn that failed keeps why (an LLM error, a daemon that died under it) with
        // what it said: the reason, not a stop, as its end said live.
        if (typeof m.error === "string" && m.error) this.error({ message: m.error }, lane);
        else if (m.partial) this._stopped(lane);
        for (const call of m.tool_calls || []) {
          const fn = (call && call.function) || call || {};
          let args = fn.arguments;
          if (typeof args === "string") { try { args = JSON.parse(args); } catch (e) { /* as is */ } }
          const card = new ToolCard(lane.body, { name: fn.name, arguments: args });
          if (call && call.id) calls.set(String(call.id), card);
        }
      } else if (m.role === "tool") {
        const card = calls.get(String(m.tool_call_id));
        calls.delete(String(m.tool_call_id));
        if (card) card.finish({ ok: !/^error\b/i.test(content), output: content });
        else this.line(`⎿ ${oneLine(content, SUMMARY_CHARS)}`, "notice");
      }
    }
    // A call with no result yet runs now (the page opened mid-run): its live frames
    // (its start again, its output, its result) go to this card, not to a second one.
    for (const [id, card] of calls) {
      card.fromHistory = true;
      this.cards.set(id, card);
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
      copyCode(lane.done);
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
      copyMessage(lane.answer, lane.raw);
      lane.answer = null;
      lane.tail = "";
      lane.raw = "";
    }
  }

  // A whole answer at once (not streamed): rendered, with its copy buttons.
  _answer(lane, text) {
    lane.body.append(this._whole(text));
  }

  _whole(text) {
    const a = el("div", "answer md");
    a.append(render(text));
    copyCode(a);
    copyMessage(a, text);
    return a;
  }

  _stopped(lane) {
    this.line("stopped", "stopped", lane);
    lane.body.lastElementChild.prepend(icon("stopped"), " ");
  }

  _scroll() {
    const r = this.root;
    if (r.scrollHeight - r.scrollTop - r.clientHeight < 200) r.scrollTop = r.scrollHeight;
  }

  _tick() {
    for (const card of this.approvals.values()) card.tick();
  }
}
