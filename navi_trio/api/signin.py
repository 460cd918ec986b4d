"""One-time sign-in codes for the browser page (``navi web``).

A connection already signed in asks for a code (``signin_code``); the daemon answers a
short random code, valid once and for `CODE_TTL_SEC`. The page gets it in its address's
fragment (never sent to a server, never in a Referer), takes it out of the address bar,
and says it in its ``hello`` instead of a token: the daemon exchanges it for the token
of the connection that asked, which the page keeps as if it had been pasted. So the
long-lived token never appears in a URL, a shell's history or a browser's history.

Only a hash of each code is kept, in this daemon's memory: a code dies with the daemon,
and a memory dump shows no usable code. At most `CODES_MAX` codes wait at a time; a
request past that is refused (the expired ones are dropped first). The clock is
injectable: tests move it instead of waiting.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

import attrs
import trio

from navi_trio.errors import AuthError, LimitError

CODE_TTL_SEC = 60.0
CODES_MAX = 16
CODE_BYTES = 16  # 128 bits: guessing one within its minute is hopeless


def _digest(code: str) -> bytes:
    return hashlib.sha256(code.encode("utf-8", "replace")).digest()


@attrs.frozen
class _Waiting:
    token: str = attrs.field(repr=False)
    expires: float


@attrs.define
class SigninCodes:
    """The codes waiting to be used, by the hash of each."""

    clock: Callable[[], float] = trio.current_time
    ttl: float = CODE_TTL_SEC
    limit: int = CODES_MAX
    _waiting: dict[bytes, _Waiting] = attrs.field(factory=dict, repr=False)

    def issue(self, token: str) -> str:
        """A new code that signs in as `token`'s user; `LimitError` when too many wait."""
        self._drop_expired()
        if len(self._waiting) >= self.limit:
            raise LimitError(
                f"{self.limit} sign-in codes are waiting to be used: use one, or wait "
                f"{self.ttl:g} s for them to expire"
            )
        code = secrets.token_urlsafe(CODE_BYTES)
        self._waiting[_digest(code)] = _Waiting(token, self.clock() + self.ttl)
        return code

    def redeem(self, code: str) -> str:
        """The token `code` stands for; the code is spent. `AuthError` for a code that
        is unknown, used already or expired (the same words: no oracle for guessing)."""
        self._drop_expired()
        digest = _digest(code)
        # Compared in constant time against each (a handful): no timing tells a prefix.
        found = next((k for k in self._waiting if hmac.compare_digest(k, digest)), None)
        if found is None:
            raise AuthError(
                "this sign-in link is used or expired: run `navi web` again for a new one"
            )
        return self._waiting.pop(found).token

    def _drop_expired(self) -> None:
        now = self.clock()
        for key in [k for k, w in self._waiting.items() if w.expires <= now]:
            del self._waiting[key]

    def __len__(self) -> int:
        self._drop_expired()
        return len(self._waiting)
