// The page's own icons: small inline SVGs drawn in the text's colour (currentColor), so a
// status shows the same on every machine, with or without an emoji font. Built with
// createElementNS from fixed path data: nothing from the daemon goes in.

const NS = "http://www.w3.org/2000/svg";

// 16×16 strokes; each entry: the path data, and whether it is filled.
const PATHS = {
  running: ["M8 2a6 6 0 1 0 6 6", false], // an open ring, turned by CSS
  ok: ["M3 8.5l3.2 3.2L13 4.8", false],
  failed: ["M4 4l8 8M12 4l-8 8", false],
  stopped: ["M4 4h8v8H4z", true],
  pending: ["M8 2.5a5.5 5.5 0 1 0 0 11a5.5 5.5 0 1 0 0-11z", false],
  in_progress: ["M6 4l5 4-5 4z", true],
  copy: ["M5.5 5.5h7v8h-7zM3.5 10.5v-8h7", false],
  edit: ["M3 13l1-3.5 6.5-6.5 2.5 2.5L6.5 12zM9.5 4l2.5 2.5", false],
  wait: ["M8 3.5V8l3 2M8 1.5a6.5 6.5 0 1 0 0 13a6.5 6.5 0 1 0 0-13z", false],
};

export function icon(name, label) {
  const [d, filled] = PATHS[name] || PATHS.pending;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("class", `icon icon-${name}`);
  if (label) {
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label);
  } else svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS(NS, "path");
  path.setAttribute("d", d);
  path.setAttribute("fill", filled ? "currentColor" : "none");
  path.setAttribute("stroke", "currentColor");
  path.setAttribute("stroke-width", "1.6");
  path.setAttribute("stroke-linecap", "round");
  path.setAttribute("stroke-linejoin", "round");
  svg.append(path);
  return svg;
}

// `node`'s children replaced by the icon `name` (its status for a screen reader: `label`).
export function setIcon(node, name, label) {
  node.replaceChildren(icon(name, label || name.replace("_", " ")));
  node.dataset.icon = name;
}
