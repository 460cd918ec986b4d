"""Who holds the other end of a connection to this machine: a client's token goes only to
a daemon of an account it trusts.

A client reads its token (the local-token file, NAVI_TOKEN) and connects to
``ws://127.0.0.1:8765/``. Whoever holds that port gets the hello; and while no daemon
holds it (before one starts, between a crash and its restart, a daemon on another port)
any account on the machine may bind it. So before the hello `open_daemon` looks the
connection up in the kernel's table of TCP sockets (``/proc/net/tcp`` and ``tcp6``): the
socket at the other end of this very connection (its local address is ours remote, its
remote ours local, it is established) and the account that made it. A socket accepted
by a listener belongs to the listener's account, so this is the account of whatever
accepted us; it must be one the client trusts (`trusted_accounts`): root, the client's
own, the owner of the data folder's local-token file, or one named in
``NAVI_DAEMON_USERS``. Anything else gets nothing: `UntrustedDaemonError`.

Why the connection and not the listener: a listener looked up before connecting may be
gone, and another in its place, by the time the connection is made; the connection's own
socket cannot change hands. Why not a proof in the handshake (the daemon showing it knows
the token's digest): a squatter that relays to the real daemon passes it on, and reads
the hello that follows; it cannot make its relay socket root's or the daemon's.

No entry for the other end: on another machine (D10: use TLS there), nothing to check;
but a loopback address always has its other end here, so not finding it (a /proc that
cannot be read) refuses as well.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import struct
from collections.abc import Collection, Mapping
from pathlib import Path

import attrs

from navi_trio.api.auth import local_token_path
from navi_trio.errors import ConfigError, UntrustedDaemonError
from navi_trio.settings import data_dir_of

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"
USERS_VAR = "NAVI_DAEMON_USERS"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@attrs.frozen
class Other:
    """The socket at the other end of a connection, as the kernel lists it."""

    uid: int
    established: bool


def _address(hexa: str) -> Address:
    """An address of /proc/net/tcp: 32-bit words in the host's byte order, in hex."""
    words = [int(hexa[i : i + 8], 16) for i in range(0, len(hexa), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _endpoint(text: str) -> tuple[Address, int]:
    hexa, port = text.split(":")
    return _address(hexa), int(port, 16)


def _plain(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def other_end(
    local: tuple[Address, int], remote: tuple[Address, int], tables: Collection[str] = TABLES
) -> Other | None:
    """The socket of this machine whose local end is `remote` and remote end `local` (the
    other end of our connection `local` -> `remote`), or None when there is none here.
    OSError when a table cannot be read."""
    want = ((_plain(remote[0]), remote[1]), (_plain(local[0]), local[1]))
    # The ports first, as the table writes them: a busy machine lists thousands of
    # sockets, and decoding each one's addresses cost milliseconds per connect.
    ports = (f":{remote[1]:04X}", f":{local[1]:04X}")
    for table in tables:
        with open(table, encoding="ascii") as rows:
            next(rows, None)  # the header
            for row in rows:
                fields = row.split()
                if len(fields) < 8:
                    continue
                if not (fields[1].endswith(ports[0]) and fields[2].endswith(ports[1])):
                    continue
                if (_endpoint(fields[1]), _endpoint(fields[2])) == want:
                    return Other(uid=int(fields[7]), established=fields[3] == ESTABLISHED)
    return None


def trusted_accounts(environ: Mapping[str, str], data_dir: Path | None = None) -> frozenset[int]:
    """The accounts a client gives its token to: root, its own, the owner of the data
    folder's local-token file (`data_dir`, default the one `environ` names), and those
    ``NAVI_DAEMON_USERS`` names (user names or uids, comma-separated; a name that is no
    account is a `ConfigError`)."""
    uids = {0, os.geteuid()}
    try:
        uids.add(os.stat(local_token_path(data_dir or data_dir_of(environ))).st_uid)
    except OSError:
        pass  # no local daemon ever wrote one here
    for name in (n.strip() for n in environ.get(USERS_VAR, "").split(",")):
        if not name:
            continue
        try:
            uids.add(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ConfigError(f"{USERS_VAR}: {name!r} is no account of this machine") from None
    return frozenset(uids)


def _account(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_other_end(
    url: str,
    local: tuple[Address, int],
    remote: tuple[Address, int],
    trusted: Collection[int],
) -> None:
    """Raise `UntrustedDaemonError` unless the other end of `local` -> `remote` is on
    another machine, or is an established socket of a `trusted` account."""
    where = f"{remote[0]}:{remote[1]}"
    try:
        other = other_end(local, remote)
    except OSError as exc:
        if not _plain(remote[0]).is_loopback:
            return  # no table here: nothing local to check against
        raise UntrustedDaemonError(
            f"cannot tell whose socket answers at {url} ({exc}): the token was not sent",
            reason="the socket table cannot be read",
        ) from None
    if other is None:
        if not _plain(remote[0]).is_loopback:
            return  # another machine's daemon (docs/security.md D10)
        raise UntrustedDaemonError(
            f"no socket of this machine holds the other end of the connection to {where}: "
            "the token was not sent",
            reason="no socket holds the other end",
        )
    if not other.established:
        raise UntrustedDaemonError(
            f"the other end at {where} closed the connection before the hello",
            reason="closed before the hello",
        )
    if other.uid not in trusted:
        names = ", ".join(_account(uid) for uid in sorted(trusted))
        raise UntrustedDaemonError(
            f"what answers at {url} is a socket of {_account(other.uid)}, not of an account "
            f"this client trusts with its token ({names}): the token was not sent. If a navi "
            f"daemon of that account serves you, name it in {USERS_VAR}",
            reason=f"the socket belongs to {_account(other.uid)}",
        )
