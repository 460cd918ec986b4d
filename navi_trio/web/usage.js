// What the runs spent (a `usage` request): the "Usage" button of the top bar opens a
// side panel with a bar chart of tokens by day, a bar per day stacked by model, and a
// table by model (runs, tokens, time, cost). Its scope: this session, all of mine, or,
// for an admin, everyone's (with a table by user). Drawn as SVG elements made through
// the DOM: no markup from the daemon is ever parsed, and the page's CSP holds.

import { el } from "./dom.js";
import { button, openPanel, panelOpen } from "./panel.js";
import { $, request, state } from "./page.js";

const SVG = "http://www.w3.org/2000/svg";
const DAYS = 30;
const WIDTH = 520;
const HEIGHT = 160;
const COLOURS = ["#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#64748b"];
const ROWS = 50; // table rows drawn at most

let scope = "mine"; // session | mine | everyone
const shown = { day: null, model: null, user: null };

export function installUsage() {
  const open = el("button", "icon-button", "Usage");
  open.id = "toggle-usage";
  open.type = "button";
  open.title = "Tokens, time and cost of your runs";
  $("toggle-tasks").before(open);
  open.addEventListener("click", () => {
    if (panelOpen("usage-panel")) return;
    scope = state.sid ? "session" : "mine";
    ask();
  });
}

function ask() {
  shown.day = shown.model = shown.user = null;
  const base = { type: "usage", since: `${DAYS}d` };
  if (scope === "session" && state.sid) base.session_id = state.sid;
  request({ ...base, by: "day" }, { kind: "usage", by: "day" });
  request({ ...base, by: "model" }, { kind: "usage", by: "model" });
  if (scope === "everyone") request({ ...base, by: "user" }, { kind: "usage", by: "user" });
}

export function onUsage(frame, what) {
  const by = (what && what.by) || frame.by;
  if (!(by in shown)) return;
  shown[by] = frame;
  if (shown.day && shown.model && (scope !== "everyone" || shown.user)) draw();
}

function draw() {
  const { body } = openPanel("usage-panel", "Usage");
  body.append(scopeButtons());
  const total = shown.model.totals || {};
  body.append(el("p", "usage-total",
    `Last ${DAYS} days: ${total.runs || 0} runs, ${total.tokens_in || 0} tokens in, ` +
    `${total.tokens_out || 0} out, cost ${money(total.cost)}`));
  const models = modelsOf(shown.model.lines || []);
  body.append(chart(shown.day.lines || [], models), legend(models));
  body.append(el("h3", null, "By model"), table(shown.model.lines || [], "model"));
  if (scope === "everyone" && shown.user) {
    body.append(el("h3", null, "By user"), table(shown.user.lines || [], "user"));
  }
}

function scopeButtons() {
  const row = el("div", "usage-scopes");
  const choices = [["session", "This session"], ["mine", "Mine"]];
  if (state.user && state.user.role === "admin") choices.push(["everyone", "Everyone"]);
  for (const [value, label] of choices) {
    if (value === "session" && !state.sid) continue;
    const b = button(label, "usage-scope" + (value === scope ? " active" : ""), () => {
      scope = value;
      ask();
    });
    b.setAttribute("aria-pressed", String(value === scope));
    row.append(b);
  }
  return row;
}

function modelsOf(lines) {
  const names = [];
  for (const line of lines) if (!names.includes(String(line.model))) names.push(String(line.model));
  return names.slice(0, COLOURS.length);
}

function chart(lines, models) {
  // tokens (in + out) per day and model, over the last DAYS days (UTC, as stored)
  const days = [];
  const today = Date.now();
  for (let i = DAYS - 1; i >= 0; i--) days.push(new Date(today - i * 86400000).toISOString().slice(0, 10));
  const per = new Map(days.map((d) => [d, new Map()]));
  for (const line of lines) {
    const day = per.get(String(line.key));
    if (!day) continue;
    const model = String(line.model);
    day.set(model, (day.get(model) || 0) + Number(line.tokens_in || 0) + Number(line.tokens_out || 0));
  }
  let top = 1;
  for (const day of per.values()) top = Math.max(top, [...day.values()].reduce((a, b) => a + b, 0));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT + 16}`);
  svg.setAttribute("class", "usage-chart");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `tokens per day, the last ${DAYS} days, highest ${top}`);
  const step = WIDTH / DAYS;
  days.forEach((d, i) => {
    let y = HEIGHT;
    for (const [model, tokens] of per.get(d)) {
      const h = (tokens / top) * HEIGHT;
      y -= h;
      const bar = document.createElementNS(SVG, "rect");
      bar.setAttribute("x", String(i * step + 1));
      bar.setAttribute("y", String(y));
      bar.setAttribute("width", String(Math.max(step - 2, 1)));
      bar.setAttribute("height", String(h));
      bar.setAttribute("fill", COLOURS[Math.max(models.indexOf(model), 0) % COLOURS.length]);
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = `${d} ${model}: ${tokens} tokens`;
      bar.append(tip);
      svg.append(bar);
    }
  });
  for (const [i, label] of [[0, days[0]], [DAYS - 1, days[DAYS - 1]]]) {
    const text = document.createElementNS(SVG, "text");
    text.setAttribute("x", String(i === 0 ? 0 : WIDTH));
    text.setAttribute("y", String(HEIGHT + 13));
    text.setAttribute("text-anchor", i === 0 ? "start" : "end");
    text.setAttribute("class", "usage-axis");
    text.textContent = label;
    svg.append(text);
  }
  return svg;
}

function legend(models) {
  const row = el("div", "usage-legend");
  models.forEach((m, i) => {
    const key = el("span", "usage-key");
    const swatch = el("span", "usage-swatch");
    swatch.style.background = COLOURS[i % COLOURS.length];
    key.append(swatch, document.createTextNode(m));
    row.append(key);
  });
  return row;
}

function table(lines, label) {
  const t = el("table", "usage-table");
  const head = el("tr");
  for (const h of [label, "kind", "runs", "in", "out", "llm s", "tools s", "cost"]) head.append(el("th", null, h));
  t.append(head);
  for (const line of lines.slice(0, ROWS)) {
    const row = el("tr");
    const cells = [line.key, line.kind, line.runs, line.tokens_in, line.tokens_out,
      Number(line.llm_sec || 0).toFixed(1), Number(line.tool_sec || 0).toFixed(1), money(line.cost)];
    for (const c of cells) row.append(el("td", null, c));
    t.append(row);
  }
  if (!lines.length) t.append(el("tr", null, "no runs in this time"));
  return t;
}

function money(cost) {
  return cost === null || cost === undefined ? "–" : Number(cost).toFixed(4);
}
