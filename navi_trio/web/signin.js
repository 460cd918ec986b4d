// Where the page keeps the token, and the one-time sign-in link of `navi web`.
//
// By default the token is kept in this tab only (sessionStorage): gone when the tab
// closes, asked again in a new tab. "Remember on this browser" keeps it in localStorage
// until Sign out: every tab of this browser profile signs in by itself, and so can
// anyone using that profile or reading its files. The login form says so in words.
//
// `navi web` prints the page's address with `#signin=CODE`: the code (good once, for a
// minute) is taken out of the address bar at once, before anything else runs, and said
// in the hello instead of a token; the daemon answers with the token it stood for.

const TOKEN_KEY = "navi.token";
const CODE = /^#signin=([A-Za-z0-9_-]{1,64})$/;

export function savedToken() {
  return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY);
}

export function keepToken(token, remember) {
  forgetToken();
  (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  localStorage.removeItem(TOKEN_KEY);
}

// The sign-in code of the address, if any, removed from it (and from the history).
export function takeSigninCode() {
  const found = CODE.exec(location.hash);
  if (location.hash.startsWith("#signin=")) history.replaceState(null, "", location.pathname);
  return found ? found[1] : null;
}
