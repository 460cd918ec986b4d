"""The private paths are a security boundary, so their cheaper reading must answer as
the plain one did: `within` as ``path == f or f in path.parents`` on any paths
(``..``, ``.``, ``//``, relative ones), and `private_paths` (read once as `OwnData`,
then with or without the config's SSH keys) as the one-pass reading on a drawn disk of
symlinks: a data folder, a database, a config folder, a session folder and keys that
are links to each other, to the home folder or above it, or missing."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from navi_trio.profiles import NaviConfig, parse_config
from navi_trio.settings import DB_SIDES, Settings, default_config_path
from navi_trio.tools.private import (
    PrivatePaths,
    own_data,
    private_paths,
    real_path,
    within,
)


def plain_within(path: Path, *folders: Path) -> bool:
    """The containment check as it was: each parent made and compared."""
    return any(path == f or f in path.parents for f in folders)


def plain_private_paths(
    settings: Settings, own_session_dir: Path | None = None, *, config: NaviConfig | None = None
) -> PrivatePaths:
    """`private_paths` as it was, in one pass with `plain_within`."""
    db = real_path(settings.db_path)
    config_file = real_path(settings.config_path)
    home = real_path(Path.home())
    folder = config_file.parent
    config_paths = [config_file] if folder == Path("/") or plain_within(home, folder) else [folder]
    hidden = [
        real_path(settings.data_dir),
        db,
        *(db.with_name(db.name + side) for side in DB_SIDES),
        *config_paths,
        real_path(Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config") / "navi"),
    ]
    if config is not None and config.ssh is not None:
        hidden += [real_path(Path(h.identity_file)) for h in config.ssh.hosts.values()]
    unique = tuple(dict.fromkeys(hidden))
    allowed: tuple[Path, ...] = ()
    if own_session_dir is not None:
        own = real_path(own_session_dir)
        if not any(plain_within(h, own) for h in unique):
            allowed = (own,)
    return PrivatePaths(hidden=unique, allowed=allowed)


PART = st.sampled_from(["a", "b", "ab", "..", ".", "", "a b", "~"])
ANCHOR = st.sampled_from(["", "/", "//", "///"])


@st.composite
def paths(draw: st.DrawFn) -> str:
    return draw(ANCHOR) + "/".join(draw(st.lists(PART, max_size=5)))


@st.composite
def path_and_folders(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A path and folders, some of them leading runs of its own text (to be inside)."""
    path = draw(paths())
    cuts = [path[: draw(st.integers(0, len(path)))] for _ in range(draw(st.integers(0, 2)))]
    return path, cuts + draw(st.lists(paths(), max_size=2))


# Ten different cases to an example: hypothesis's own work for an example costs far more
# than the check, and is paid once for ten (2000 cases, as many different ones as 2000
# examples of one case gave, less a tenth).
@settings(max_examples=200, deadline=None)
@given(st.lists(path_and_folders(), min_size=10, max_size=10, unique_by=lambda d: str(d)))
def test_within_answers_as_the_parents_do(cases: list[tuple[str, list[str]]]) -> None:
    for drawn in cases:
        path, folders = Path(drawn[0]), [Path(f) for f in drawn[1]]
        assert within(path, *folders) is plain_within(path, *folders), drawn
        for folder in folders:  # and one by one, each way round
            assert within(path, folder) is plain_within(path, folder), drawn
            assert within(folder, path) is plain_within(folder, path), drawn


# Where a drawn place is: a folder of its own, missing, or a link to another place.
PLACES = ("home", "root", "data", "other", "sessions")
KIND = st.sampled_from(["folder", "missing", "dotdot", *(f"link:{p}" for p in PLACES)])


@contextmanager
def drawn_disk(layout: dict[str, str]) -> Iterator[Path]:
    """A temporary folder with ``home`` (HOME points at it), and each of `layout`'s
    names made as its kind says; the environment's XDG_CONFIG_HOME unset."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "home").mkdir()
        (base / "other").mkdir()
        for name, kind in layout.items():
            spot = base / name
            if not spot.parent.is_dir():
                continue  # inside a place that is missing or a dangling link
            if kind == "folder":
                spot.mkdir(exist_ok=True)
            elif kind == "dotdot":  # a link through ``..``: other/../home
                spot.symlink_to(base / "other" / ".." / "home")
            elif kind.startswith("link:"):
                target = kind.split(":", 1)[1]
                spot.symlink_to(base if target == "root" else base / target)
        env = {"HOME": str(base / "home")}
        with mock.patch.dict(os.environ, env):
            os.environ.pop("XDG_CONFIG_HOME", None)
            yield base


@settings(max_examples=150, deadline=None)
@given(
    data=KIND,
    sessions=KIND,
    session=KIND,
    config=st.sampled_from(["home", "root", "conf", "data", "/"]),
    conf=KIND,
    xdg=st.sampled_from([None, "home/.config", "conf", "data"]),
    key=st.sampled_from([None, "own", "data", "home", "elsewhere"]),
    with_own=st.booleans(),
)
def test_private_paths_read_once_answer_as_the_one_pass_reading(
    data: str,
    sessions: str,
    session: str,
    config: str,
    conf: str,
    xdg: str | None,
    key: str | None,
    with_own: bool,
) -> None:
    layout = {"data": data, "conf": conf}
    if data == "folder":  # the session folders inside a real data folder, or linked
        layout |= {"data/sessions": sessions, "data/sessions/s1": session}
    with drawn_disk(layout) as base:
        if xdg is not None:
            os.environ["XDG_CONFIG_HOME"] = str(base / xdg)
        config_file = Path("/config.json") if config == "/" else base / config / "config.json"
        settings_ = Settings.from_env(
            {},
            data_dir=base / "data",
            db_path=base / "data" / "navi.db",
            config_path=config_file,
        )
        own = settings_.session_dir("s1") if with_own else None
        cfg = None
        if key is not None:
            keys = {
                "own": settings_.session_dir("s1") / "id",
                "data": base / "data" / "id",
                "home": base / "home" / ".ssh" / "id",
                "elsewhere": base / "other" / "id",
            }
            cfg = ssh_config(str(keys[key]))
        found = own_data(settings_, own)
        for with_config in (None, cfg):
            plain = plain_private_paths(settings_, own, config=with_config)
            assert private_paths(settings_, own, config=with_config) == plain
            assert found.paths(with_config) == plain


def ssh_config(identity_file: str) -> NaviConfig:
    """The default config with one SSH host whose key is `identity_file`."""
    data: dict[str, Any] = json.loads(default_config_path().read_text(encoding="utf-8"))
    data["ssh"] = {
        "known_hosts": "kh",
        "hosts": {
            "box": {"user": "u", "host": "h", "identity_file": identity_file, "commands": ["*"]}
        },
    }
    return parse_config(data, default_config_path())
