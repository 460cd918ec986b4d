"""The HTTP client of an LLM backend: an `httpx.AsyncClient` with a cheap request path.

A tool loop sends one chat request per round to one URL, so the per-request work of a
general-purpose client shows in the round's cost: parsing the URL, merging the client's
headers, a `Timeout` turned into a dict, and the cookie jar (a urllib request and
response built around every answer to look for ``Set-Cookie``). An LLM API keeps no
state in cookies, so this client keeps none (`cookies` is always empty, nothing is
stored), and builds a chat POST from a template made once per URL and header set.
Anything else (`send`, proxies from the environment, errors) is httpx's own; the
connections are its transport's (ours on h11 by default: llm/transport.py).
"""

from __future__ import annotations

from typing import Any

import httpx

from navi_trio.caches import remember

# Templates kept per client: one per (URL, extra headers); a caller varying its headers
# per request (no backend does) only costs a rebuild once this many are kept.
MAX_TEMPLATES = 32
JSON_TYPE = {"Content-Type": "application/json"}


class _NoCookies(httpx.Cookies):
    """A cookie jar that stays empty: answers' cookies are neither parsed nor kept."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set_cookie_header(self, request: httpx.Request) -> None:
        return None

    def set(self, name: str, value: str, domain: str = "", path: str = "/") -> None:
        return None


class LLMClient(httpx.AsyncClient):
    """`httpx.AsyncClient` without cookies, with `json_post` for chat requests."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()
        self._templates: dict[tuple[str, tuple[tuple[str, str], ...]], _Template] = {}

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        return None  # nothing to keep: an LLM API has no use for cookies

    def json_post(self, url: str, content: bytes, headers: dict[str, str] | None) -> httpx.Request:
        """A POST of JSON `content` to `url`: what ``build_request`` makes, built cheaply.

        The URL and the merged headers (the client's, then `headers`, then the JSON
        content type) come from a template made by ``build_request`` on first use."""
        if not content:  # httpx's own headers for no body (never a chat request's)
            return self.build_request(
                "POST", url, content=content, headers={**(headers or {}), **JSON_TYPE}
            )
        key = (url, tuple(headers.items()) if headers else ())
        template = self._templates.get(key)
        if template is None:
            model = self.build_request("POST", url, headers={**(headers or {}), **JSON_TYPE})
            template = remember(self._templates, key, _Template(model), MAX_TEMPLATES)
        # The headers httpx would make for `content` (the template's, then the body's
        # Content-Length) given whole, with the body as a stream: httpx then neither
        # looks the headers up again nor copies them into a new set.
        request = httpx.Request(
            "POST",
            template.url,
            headers=[*template.headers, (b"Content-Length", b"%d" % len(content))],
            stream=httpx.ByteStream(content),
            extensions={"timeout": dict(template.timeout)},
        )
        request.read()  # `content` at hand, as for a request made with content=
        return request


class _Template:
    """What every POST to one URL with one header set shares."""

    def __init__(self, model: httpx.Request) -> None:
        self.url = model.url
        # Content-Length is the body's own: httpx sets it for each request's content.
        self.headers = [(k, v) for k, v in model.headers.raw if k.lower() != b"content-length"]
        self.timeout: dict[str, Any] = dict(model.extensions["timeout"])
