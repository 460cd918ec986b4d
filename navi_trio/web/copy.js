// Copy buttons: on a message (its text as written: the Markdown of an answer) and on each
// code block of an answer (the code). The clipboard API where the page is a secure
// context (http://127.0.0.1 and localhost are); elsewhere a selected, hidden textarea and
// the copy command. Nothing here needs more than the page's strict CSP allows.

import { el } from "./dom.js";
import { setIcon } from "./icons.js";

const SHOWN_MS = 1500;

async function writeText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = el("textarea", "copy-source");
  area.value = text;
  area.setAttribute("readonly", "");
  document.body.append(area);
  area.select();
  try {
    if (!document.execCommand("copy")) throw new Error("the browser refused to copy");
  } finally {
    area.remove();
  }
}

// A button that copies what `text()` gives when clicked, and says whether it did.
// Only an icon shows (the button's words are its title and label): a message's text,
// as the page reads it, stays the message's own.
export function copyButton(text, what) {
  const b = el("button", "copy");
  b.type = "button";
  const say = (words, name) => {
    b.title = words;
    b.setAttribute("aria-label", words);
    setIcon(b, name);
  };
  say(`copy ${what}`, "copy");
  let timer = null;
  b.addEventListener("click", async () => {
    try {
      await writeText(text());
      say("copied", "ok");
      b.classList.add("copied");
    } catch (e) {
      say(`could not copy: ${e && e.message ? e.message : e}`, "failed");
    }
    clearTimeout(timer);
    timer = setTimeout(() => { say(`copy ${what}`, "copy"); b.classList.remove("copied"); }, SHOWN_MS);
  });
  return b;
}

// A message's copy button, at its end: `raw` is what the person or the model wrote.
export function copyMessage(node, raw) {
  if (node.querySelector(":scope > .msg-tools")) return;
  const tools = el("div", "msg-tools");
  tools.append(copyButton(() => raw, "this message"));
  node.append(tools);
}

// A copy button on each finished code block under `root` (once each).
export function copyCode(root) {
  for (const pre of root.querySelectorAll("pre.code")) {
    if (pre.parentElement && pre.parentElement.classList.contains("code-block")) continue;
    const wrap = el("div", "code-block");
    pre.replaceWith(wrap);
    wrap.append(pre, copyButton(() => pre.textContent, "this code"));
  }
}
