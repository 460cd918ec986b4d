// The session list's search (by title or id, as typed; kept across the list's redraws)
// and renaming the session shown (its title in the header becomes a box; Enter saves,
// Escape leaves it as it was).

import { frames } from "./wire.js";
import { $, request, state } from "./page.js";
import { setIcon } from "./icons.js";

function filter() {
  const words = $("session-search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  for (const li of $("session-list").querySelectorAll("li.session")) {
    const name = li.querySelector(".session-name");
    const hay = `${name ? name.textContent : ""} ${li.dataset.sid || ""}`.toLowerCase();
    li.hidden = !words.every((w) => hay.includes(w));
  }
}

$("session-search").addEventListener("input", filter);
new MutationObserver(filter).observe($("session-list"), { childList: true });

// -- rename ---------------------------------------------------------------------------

setIcon($("rename"), "edit", "rename");

// The rename button shows while a session is open (the title span changes with it).
new MutationObserver(() => {
  $("rename").hidden = !state.sid || !$("rename-form").hidden;
}).observe($("session-title"), { childList: true, characterData: true, subtree: true });

function current() {
  const s = state.sessions.find((x) => x.session_id === state.sid);
  return s && s.title ? String(s.title) : "";
}

function closeForm() {
  $("rename-form").hidden = true;
  $("session-title").hidden = false;
  $("rename").hidden = !state.sid;
}

$("rename").addEventListener("click", () => {
  if (!state.sid) return;
  $("rename-input").value = current();
  $("session-title").hidden = true;
  $("rename").hidden = true;
  $("rename-form").hidden = false;
  $("rename-input").focus();
  $("rename-input").select();
});

$("rename-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const title = $("rename-input").value.trim();
  if (title && state.sid && title !== current()) {
    request(frames.sessionsRename(state.sid, title), { kind: "rename" });
  }
  closeForm();
});

$("rename-input").addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    event.preventDefault();
    event.stopPropagation(); // not the page's Escape, which stops a run
    closeForm();
  }
});
$("rename-input").addEventListener("blur", () => { if (!$("rename-form").hidden) closeForm(); });
