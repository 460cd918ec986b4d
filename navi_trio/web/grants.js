// The approvals granted "for the session" or "always" (the user's own; an admin's:
// everyone's), from `grants` answers: each with what it covers, in words, and Revoke.
// Listed once a connection's first tasks list is in (a request of its own at the
// welcome could take a rate-limited burst's room from the first history page), and again
// after each approval for the session or always and each revoke.

import { frames } from "./wire.js";
import { el, oneLine } from "./dom.js";
import { $, request } from "./page.js";

export function loadGrants() {
  request(frames.grants("list"), { kind: "grants" });
}

export function onGrants(frame) {
  if (frame.action === "revoke") return loadGrants();
  const ul = $("grant-list");
  ul.replaceChildren();
  const grants = Array.isArray(frame.grants) ? frame.grants : [];
  for (const g of grants) {
    const li = el("li", "grant");
    li.dataset.grantId = String(g.id);
    const where = g.scope === "session" ? `session ${g.session_id}` : "always";
    li.append(el("div", "grant-head", `${where} · mode ${g.mode}`));
    li.append(el("div", "grant-what muted", oneLine(String(g.grants || ""), 300)));
    const revoke = el("button", "grant-revoke", "Revoke");
    revoke.type = "button";
    revoke.addEventListener("click", () => request(frames.grants("revoke", String(g.id)), { kind: "grants" }));
    li.append(revoke);
    ul.append(li);
  }
  $("grant-empty").hidden = grants.length > 0;
}
