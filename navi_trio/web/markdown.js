// A small Markdown renderer that builds DOM nodes: text only ever goes in through
// createTextNode / textContent, never innerHTML, so a model's "<img onerror=...>" or
// "<script>" stays text. Links keep only http(s) and mailto targets; each shows its full
// address on hover, and one to another site is marked with that site's host.
//
// Blocks: fenced code (with highlighting), ATX headings, rules, block quotes, lists
// (- * + and 1.), tables (| a | b | with a --- row), paragraphs. Inline: `code`,
// **bold**, *italic* / _italic_, ~~strike~~, [text](url), backslash escapes.

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const BULLET = /^(\s*)([-*+])\s+(.*)$/;
const ORDERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;
const HIGHLIGHT_MAX = 20000; // characters of a code block highlighted; the rest plain

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// (finished blocks, the rest): cut at the last blank line outside a code fence.
export function splitBlocks(buffer) {
  let inFence = false;
  let cut = 0;
  let pos = 0;
  const lines = buffer.split("\n");
  for (let i = 0; i < lines.length - 1; i++) {
    const line = lines[i];
    pos += line.length + 1;
    const stripped = line.trim();
    if (stripped.startsWith("```") || stripped.startsWith("~~~")) inFence = !inFence;
    else if (!stripped && !inFence) cut = pos;
  }
  return [buffer.slice(0, cut), buffer.slice(cut)];
}

// `text` rendered into a DocumentFragment.
export function render(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = FENCE.exec(line))) {
      const mark = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(mark)) body.push(lines[i++]);
      i++; // the closing fence (or the end of an unfinished block)
      out.append(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const h = el("h" + Math.min(6, m[1].length + 2));
      inline(h, m[2]);
      out.append(h);
      i++;
      continue;
    }
    if (RULE.test(line)) { out.append(el("hr")); i++; continue; }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i++; }
      const q = el("blockquote");
      q.append(render(body.join("\n")));
      out.append(q);
      continue;
    }
    if (BULLET.test(line) || ORDERED.test(line)) {
      const ordered = !BULLET.test(line);
      const re = ordered ? ORDERED : BULLET;
      const list = el(ordered ? "ol" : "ul");
      if (ordered) {
        const start = Number(ORDERED.exec(line)[2]);
        if (start !== 1) list.start = start;
      }
      let item = null;
      while (i < lines.length && lines[i].trim()) {
        const lm = re.exec(lines[i]);
        if (lm) {
          item = el("li");
          listItem(item, lm[3]);
          list.append(item);
        } else if (item && /^\s+/.test(lines[i])) {
          item.append(document.createTextNode(" "));
          inline(item, lines[i].trim());
        } else break;
        i++;
      }
      out.append(list);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      const rows = [line];
      i += 2;
      while (i < lines.length && lines[i].includes("|") && lines[i].trim()) rows.push(lines[i++]);
      out.append(table(rows));
      continue;
    }
    const p = el("p");
    const start = i;
    while (i < lines.length && lines[i].trim() && (i === start || !startsBlock(lines[i], lines[i + 1]))) {
      if (i > start) p.append(el("br"));
      inline(p, lines[i].trim());
      i++;
    }
    out.append(p);
  }
  return out;
}

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    BULLET.test(line) || ORDERED.test(line) ||
    (line.includes("|") && next !== undefined && TABLE_SEP.test(next));
}

function listItem(item, text) {
  const task = /^\[([ xX])\]\s+(.*)$/.exec(text);
  if (task) {
    item.className = "task";
    item.append(el("span", "tick", task[1] === " " ? "☐ " : "☑ "));
    inline(item, task[2]);
  } else inline(item, text);
}

function cells(row) {
  let text = row.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((c) => c.trim());
}

function table(rows) {
  const wrap = el("div", "table-wrap");
  const t = el("table");
  rows.forEach((row, n) => {
    const tr = el("tr");
    for (const cell of cells(row)) {
      const td = el(n === 0 ? "th" : "td");
      inline(td, cell);
      tr.append(td);
    }
    (n === 0 ? t.createTHead() : (t.tBodies[0] || t.createTBody())).append(tr);
  });
  wrap.append(t);
  return wrap;
}

// -- inline ---------------------------------------------------------------------------

const INLINE = [
  [/^\\([\\`*_{}[\]()#+\-.!|~<>])/, (m, parent) => parent.append(m[1])],
  [/^(`+)([\s\S]*?[^`])\1(?!`)/, (m, parent) => parent.append(el("code", "", m[2].trim() || m[2]))],
  [/^\*\*(?=\S)([\s\S]*?\S)\*\*/, (m, parent) => wrapped(parent, "strong", m[1])],
  [/^__(?=\S)([\s\S]*?\S)__/, (m, parent) => wrapped(parent, "strong", m[1])],
  [/^~~(?=\S)([\s\S]*?\S)~~/, (m, parent) => wrapped(parent, "del", m[1])],
  [/^\*(?=[^\s*])([\s\S]*?[^\s*])\*/, (m, parent) => wrapped(parent, "em", m[1])],
  [/^_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/, (m, parent) => wrapped(parent, "em", m[1])],
  [/^\[([^\]\n]{1,500})\]\(\s*<?([^()\s<>]{1,2000})>?(?:\s+"[^"]*")?\s*\)/, (m, parent) => link(parent, m[1], m[2])],
];
const SPECIAL = /[\\`*_~[]/;

function wrapped(parent, tag, text) {
  const node = el(tag);
  inline(node, text);
  parent.append(node);
}

function link(parent, text, url) {
  if (!SAFE_URL.test(url)) {
    parent.append(`[${text}](${url})`); // a javascript: or data: link stays text
    return;
  }
  const a = el("a");
  a.href = url;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  // The model chooses both the text and the address: the full address shows on hover,
  // and a link off this site is marked with its host (as the browser spells it: an
  // internationalised name in punycode, so a look-alike shows as what it is).
  a.title = a.href;
  inline(a, text);
  if (/^https?:/i.test(a.href)) {
    const target = new URL(a.href);
    if (target.origin !== location.origin) {
      a.classList.add("external");
      a.dataset.host = target.host;
    }
  }
  parent.append(a);
}

export function inline(parent, text) {
  let rest = String(text);
  let plain = "";
  const flush = () => { if (plain) { parent.append(plain); plain = ""; } };
  while (rest) {
    const at = rest.search(SPECIAL);
    if (at < 0) { plain += rest; break; }
    plain += rest.slice(0, at);
    rest = rest.slice(at);
    let matched = false;
    for (const [re, make] of INLINE) {
      const m = re.exec(rest);
      if (m) {
        flush();
        make(m, parent);
        rest = rest.slice(m[0].length);
        matched = true;
        break;
      }
    }
    if (!matched) { plain += rest[0]; rest = rest.slice(1); }
  }
  flush();
}

// -- code -----------------------------------------------------------------------------

const KEYWORDS = {
  python: "and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield match case self",
  js: "async await break case catch class const continue debugger default delete do else export extends false finally for function if import in instanceof let new null of return static super switch this throw true try typeof undefined var void while with yield",
  sh: "if then else elif fi for while until do done case esac function in return export local set unset echo exit cd source",
  c: "auto break case char const continue default do double else enum extern float for goto if int long register return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false null nullptr class public private protected new delete template typename namespace using fn let mut impl pub use mod struct trait enum match loop where self Self func package import type var go defer chan select range interface map string",
};
const LANGS = {
  py: "python", python: "python", js: "js", javascript: "js", ts: "js", typescript: "js",
  json: "js", jsx: "js", tsx: "js", sh: "sh", bash: "sh", shell: "sh", zsh: "sh", console: "sh",
  c: "c", h: "c", cpp: "c", "c++": "c", java: "c", go: "c", rust: "c", rs: "c", cs: "c",
  kotlin: "c", swift: "c",
};
const HASH_COMMENTS = new Set(["python", "sh"]);
const keywordSets = Object.fromEntries(
  Object.entries(KEYWORDS).map(([k, v]) => [k, new Set(v.split(" "))]),
);

function codeBlock(code, lang) {
  const pre = el("pre", "code");
  const c = el("code");
  const family = LANGS[String(lang || "").toLowerCase()];
  if (lang) pre.dataset.lang = lang;
  if (family) {
    highlight(c, code.slice(0, HIGHLIGHT_MAX), family);
    if (code.length > HIGHLIGHT_MAX) c.append(code.slice(HIGHLIGHT_MAX));
  } else c.textContent = code;
  pre.append(c);
  return pre;
}

function tokenRe(family) {
  const comment = HASH_COMMENTS.has(family) ? "#[^\\n]*" : "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/";
  const strings = family === "python"
    ? "\"\"\"[\\s\\S]*?\"\"\"|'''[\\s\\S]*?'''|\"(?:\\\\.|[^\"\\\\\\n])*\"|'(?:\\\\.|[^'\\\\\\n])*'"
    : "`(?:\\\\.|[^`\\\\])*`|\"(?:\\\\.|[^\"\\\\\\n])*\"|'(?:\\\\.|[^'\\\\\\n])*'";
  return new RegExp(`(${comment})|(${strings})|(\\b\\d[\\d_.xXa-fA-FeE]*\\b)|([A-Za-z_$][\\w$]*)`, "g");
}

export function highlight(parent, code, family) {
  const re = tokenRe(family);
  const words = keywordSets[family] || new Set();
  let last = 0;
  let m;
  while ((m = re.exec(code))) {
    if (m.index > last) parent.append(code.slice(last, m.index));
    const [text, comment, string, number, word] = m;
    let cls = null;
    if (comment) cls = "tok-com";
    else if (string) cls = "tok-str";
    else if (number) cls = "tok-num";
    else if (word && words.has(word)) cls = "tok-kw";
    if (cls) parent.append(el("span", cls, text));
    else parent.append(text);
    last = m.index + text.length;
  }
  if (last < code.length) parent.append(code.slice(last));
}
