// The composer's choices from the daemon's welcome: the profiles a message may name (the
// daemon's list, not free text) and the mode, with what "default" means named: the mode
// a run of the chosen profile gets when none is asked for.

import { el } from "./dom.js";
import { $, state } from "./page.js";

export function renderChoices(welcome) {
  const profiles = Array.isArray(welcome.profiles) ? welcome.profiles.map(String) : [];
  state.defaultProfile = welcome.default_profile ? String(welcome.default_profile) : null;
  const modes = welcome.default_modes && typeof welcome.default_modes === "object" ? welcome.default_modes : {};
  state.defaultModes = Object.fromEntries(Object.entries(modes).map(([k, v]) => [String(k), String(v)]));
  const select = $("profile");
  const kept = select.value;
  const first = el("option", "", state.defaultProfile ? `default (${state.defaultProfile})` : "default");
  first.value = "";
  select.replaceChildren(first, ...profiles.map((p) => {
    const o = el("option", "", p);
    o.value = p;
    return o;
  }));
  select.value = profiles.includes(kept) ? kept : "";
  nameDefaultMode();
}

// The mode list's first entry says which mode "default" is for the profile chosen.
export function nameDefaultMode() {
  const profile = $("profile").value || state.defaultProfile;
  const mode = profile ? state.defaultModes[profile] : undefined;
  $("mode").options[0].textContent = mode ? `default (${mode})` : "default";
}

$("profile").addEventListener("change", nameDefaultMode);
