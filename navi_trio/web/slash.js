// Slash commands kept as files (the daemon reads them: navi_trio/project/commands.py).
// The page asks for the list when a line starts with "/" (and at /help); a line
// "/name words" whose name is listed is sent as the command's prompt with the words in
// it, by the rule of navi_trio/command_text.py (expandCommand: the tests hold both to
// the same cases). The folder asked about is the one the page's messages carry
// (state.cwd), if any; with none, the daemon offers an admin their own commands
// (~/.config/navi/commands). /help is the page's own.

import { frames } from "./wire.js";
import { $, request, showError, state, transcript } from "./page.js";

const BUILTINS = new Set(["help"]);
const EXPANDED_MAX_CHARS = 900000; // as command_text.EXPANDED_MAX_CHARS
const PLACEHOLDER = /\$ARGUMENTS|\$([1-9])(?![0-9])/g;

export const slash = { commands: new Map(), told: new Set(), asked: false };

export function expandCommand(body, args) {
  const rest = args.trim();
  const words = rest ? rest.split(/\s+/) : [];
  let used = false;
  let size = body.length;
  const tooLong = () => new Error(
    `the command's prompt with its arguments would be over ${EXPANDED_MAX_CHARS} characters`);
  let text = body.replace(PLACEHOLDER, (_, n) => {
    used = true;
    const value = n === undefined ? rest : (words[Number(n) - 1] ?? "");
    size += value.length;
    if (size > EXPANDED_MAX_CHARS) throw tooLong();
    return value;
  });
  if (rest && !used) {
    text = `${text}\n\nARGUMENTS: ${rest}`;
    if (text.length > EXPANDED_MAX_CHARS) throw tooLong();
  }
  return text;
}

export function askCommands(help = false) {
  slash.asked = true;
  request(frames.commands(state.sid, state.cwd), { kind: "commands", help });
}

// The daemon's list: offered from now on, but for a name of the page's own.
export function onCommands(frame, what) {
  slash.commands = new Map();
  const notices = Array.isArray(frame.notices) ? frame.notices.map(String) : [];
  for (const c of Array.isArray(frame.commands) ? frame.commands : []) {
    if (!c || typeof c.name !== "string") continue;
    if (BUILTINS.has(c.name)) {
      notices.push(`/${c.name} of ${c.path} is not offered: /${c.name} is a built-in command`);
      continue;
    }
    slash.commands.set(c.name, c);
  }
  for (const n of notices) {
    if (!slash.told.has(n)) { slash.told.add(n); transcript.notice(n); }
  }
  $("input").title = [...slash.commands.keys()].map((n) => "/" + n).join(" ");
  if (what && what.help) showHelp();
}

function showHelp() {
  const lines = [...slash.commands.values()].map(
    (c) => `/${c.name}${c.argument_hint ? " " + c.argument_hint : ""} — ${c.description || ""}`);
  transcript.notice(lines.length ? "Commands kept as files:\n" + lines.join("\n")
    : "no commands kept as files (~/.config/navi/commands)");
}

// What a typed line sends: the line itself, a command's prompt, or null when nothing
// is to be sent (/help, or a command that cannot be expanded).
export function slashLine(text) {
  if (!text.startsWith("/")) return text;
  const name = text.slice(1).split(/\s/, 1)[0];
  const rest = text.slice(1 + name.length);
  if (name === "help") { askCommands(true); return null; }
  const c = slash.commands.get(name);
  if (!c) return text; // sent as typed, as before
  try { return expandCommand(String(c.body || ""), rest); }
  catch (e) { showError(`/${name}: ${e.message}`); return null; }
}

// The list is asked for as a line starts with "/": what the files say now.
$("input").addEventListener("input", () => {
  const value = $("input").value;
  if (value === "/" || (value.startsWith("/") && !slash.asked)) askCommands();
});
