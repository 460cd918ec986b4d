// The wait between Enter and the model's first word: a line at the end of the turn that
// says what the run does now ("waiting for the model…", or the planning phase running)
// and for how long, ticking each second, until something of the answer shows (text,
// thinking, a tool, an approval) or the run ends. A local model may take most of a
// minute to say its first word: the page shows it is alive meanwhile.

import { el } from "./dom.js";
import { icon } from "./icons.js";

// Top-level frames that end the wait: the run shows something of its own now.
const ENDS = new Set(["text_delta", "thinking_delta", "tool_started", "approval_request", "stream_end", "error"]);

export class Waiting {
  // activity(text): the status bar's activity line.
  constructor(activity) {
    this.activity = activity;
    this.box = null;
    this.timer = null;
  }

  get active() { return this.box !== null; }

  // Start (or restart) waiting at the end of `parent`.
  start(parent) {
    this.stop();
    this.started = Date.now();
    this.what = "waiting for the model…";
    this.box = el("div", "line waiting");
    this.box.setAttribute("role", "status");
    this.text = el("span", "waiting-text");
    this.box.append(icon("wait"), " ", this.text);
    parent.append(this.box);
    this.timer = setInterval(() => this._draw(), 1000);
    this._draw();
  }

  // A session frame of the run (top level): what the wait says now, or its end.
  frame(frame, parent) {
    if (!this.box) return;
    if (ENDS.has(frame.type)) { this.stop(); return; }
    if (frame.type === "plan_phase") {
      this.what = frame.status === "started" ? `planning: ${String(frame.phase || "")}…` : "waiting for the model…";
    }
    parent.append(this.box); // stays last, below what the frame added
    this._draw();
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
    if (this.box) this.box.remove();
    this.box = null;
  }

  _draw() {
    if (!this.box) return;
    const s = Math.max(0, Math.floor((Date.now() - this.started) / 1000));
    const shown = s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
    this.text.textContent = `${this.what} ${shown}`;
    this.activity(`${this.what} ${shown}`);
  }
}
