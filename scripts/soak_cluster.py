"""Soak the cluster's promise: an ``ok`` means the message is stored and runs exactly
once, on whichever daemon, whatever fails.

    python scripts/soak_cluster.py [--daemons 2 3] [--acked 1200] [--seed N] [--keep]

For each topology (2 daemons, then 3 by default): a database on a throwaway PostgreSQL
(navi_trio/testing/postgres.py, Debian's binaries), one fake LLM server per daemon
(navi_trio.testing; its answer names the message it answers, so each run is counted),
`navi serve` daemons each with a data folder of its own (as machines have) on that
database, a user made with ``navi users add``, and WebSocket clients on every daemon
(`open_daemon`) sending messages to random sessions with random ``on_busy``, one at a
time, at random moments (a send every `--pause-ms` per client). Meanwhile, at random
moments, one at a time: PostgreSQL restarted (short) and halted for `--outage-sec`
(20 s), one daemon's database connections terminated (``pg_terminate_backend``), one
daemon SIGKILLed and started again, one SIGSTOPped past its lease then SIGCONTed.

Then the sends stop, and the script waits (bounded) until everything settled: no
message queued in the database, every session's last turn ended. It counts, for every
message a client got an ``ok`` for (acked), from the database's history and the fake
LLMs' request logs:

- stored: in the history as a user message (once); run: its turn ended in the history,
  with an answer, or stopped by an ``interrupt`` before a word of it, or ended by the
  daemon that took the session over (its daemon died or stopped answering: counted
  apart when the model was never asked with it, and listed);
- lost: acked, and not stored (nor named dropped by the queue's cap), or stored and its
  turn never ended; duplicated: stored more than once, or answered more than once;
- dropped by cap: named in a ``message_dropped`` warning the sender got (the one way an
  ``ok`` may still not run: README, "Scaling out"); refused: an error reply (nothing
  may be stored of it); unanswered: no reply (the connection died with its daemon).

A table per topology, and the messages behind any lost or duplicated figure; the exit
status is 1 when any message was lost or duplicated. Bounded: sends stop once
`--acked` messages were acknowledged and every fault was injected (or at `--limit-sec`),
the settling has its own bound, and every process and folder it made is removed on the
way out (`--keep` keeps the folder: daemon logs and the server's).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_reliability_memory import _config as config_file  # noqa: E402

from navi_trio.api.daemon_client import DaemonConnection, open_daemon  # noqa: E402
from navi_trio.errors import DaemonUnreachableError, RemoteError  # noqa: E402
from navi_trio.llm.script import Reply  # noqa: E402
from navi_trio.settings import Settings  # noqa: E402
from navi_trio.testing.fake_llm import FakeLLMServer  # noqa: E402
from navi_trio.testing.postgres import PgServer, PgUnavailable  # noqa: E402

START_SEC = 60.0  # a daemon prints its port within this (a Python start on busy cores)
CLI_SEC = 60.0
REPLY_SEC = 60.0  # a message's reply (a PostgreSQL outage holds it up to --outage-sec)
SETTLE_SEC = 240.0  # every turn ended, nothing queued: else the figures name what hangs
N_CTX = 131072  # no compression in a session of a few hundred short messages
ON_BUSY: dict[str | None, int] = {None: 4, "enqueue": 2, "reject": 1, "steer": 2, "interrupt": 1}
TEXT = re.compile(r"m\d+\.c\d+\.\d{5}")  # a soak message: m<daemons>.c<client>.<n>
DROPPED = re.compile(r"the message '(m\d+\.c\d+\.\d{5})'")


# -- what was sent, and what came back ------------------------------------------------


@attrs.define
class Sent:
    text: str
    session_id: str
    on_busy: str | None
    daemon: int
    outcome: str = "unanswered"  # acked / refused / unanswered
    code: str = ""  # a refusal's error code
    queued: bool = False
    applied: str | None = None  # the on_busy the daemon applied (the ok says)


@attrs.define
class Tally:
    sent: list[Sent] = attrs.field(factory=list)
    dropped: collections.Counter[str] = attrs.field(factory=collections.Counter)
    errors: collections.Counter[str] = attrs.field(factory=collections.Counter)  # in frames
    faults: collections.Counter[str] = attrs.field(factory=collections.Counter)
    reconnects: int = 0
    acked: int = 0
    target: int = 0  # `enough` is set once this many were acked
    enough: trio.Event = attrs.field(factory=trio.Event)

    def ack(self, sent: Sent, queued: bool, applied: str | None) -> None:
        sent.outcome, sent.queued, sent.applied = "acked", queued, applied
        self.acked += 1
        if self.acked >= self.target:
            self.enough.set()

    def see(self, frame: dict[str, Any]) -> None:
        """A frame a client got between its sends: drops and errors are counted."""
        if frame.get("type") == "warning" and frame.get("code") == "message_dropped":
            for text in DROPPED.findall(str(frame.get("message", ""))):
                self.dropped[text] += 1
        elif frame.get("type") == "error":
            self.errors[str(frame.get("code"))] += 1


# -- the parts: PostgreSQL, the fake LLMs, the daemons ---------------------------------


def asked_texts(body: dict[str, Any]) -> list[str]:
    """The soak messages a chat request asks about: those in the user messages after
    its last assistant message (a message steered in before the first call is asked
    with the one it joined)."""
    messages = body.get("messages", [])
    ends = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    tail = messages[ends[-1] + 1 :] if ends else messages
    return [t for m in tail if m.get("role") == "user" for t in TEXT.findall(str(m.get("content")))]


@attrs.define
class Asked:
    last: collections.Counter[str]  # the newest soak message of a request
    seen: collections.Counter[str]  # any after the request's last answer

    @classmethod
    def of(cls, bodies: list[dict[str, Any]]) -> Asked:
        last: collections.Counter[str] = collections.Counter()
        seen: collections.Counter[str] = collections.Counter()
        for body in bodies:
            texts = asked_texts(body)
            seen.update(texts)
            if texts:
                last[texts[-1]] += 1
        return cls(last, seen)


def last_soak_text(body: dict[str, Any]) -> str:
    """The soak message a chat request answers: the last one in its last user message."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    found = TEXT.findall(str(users[-1].get("content", ""))) if users else []
    return found[-1] if found else ""


def echo(rng: random.Random) -> Callable[[dict[str, Any], Reply], Reply]:
    """The fake LLM's answer: it names the message it answers, after a random think
    (20-300 ms) so that sends land on running turns, queued, steering, interrupting."""

    def shape(body: dict[str, Any], reply: Reply) -> Reply:
        return attrs.evolve(
            reply,
            text=f"re {last_soak_text(body) or 'other'} done",
            delay_first=rng.uniform(0.02, 0.3),
            delay_chunk=rng.uniform(0.0, 0.05),
        )

    return shape


def base_env(**extra: str) -> dict[str, str]:
    """This environment without any navi setting, plus `extra`."""
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_DEBUG", "NAVI_TOKEN"}
    return {**{k: v for k, v in os.environ.items() if k not in names}, **extra}


@attrs.define(eq=False)
class Slot:
    """One daemon's place: its data folder and fake LLM stay, its process may be killed
    and started again (on another port: `url` and `up` say where and when)."""

    index: int
    env: dict[str, str]
    llm: FakeLLMServer
    log: Path
    proc: trio.Process | None = None
    url: str = ""
    up: trio.Event = attrs.field(factory=trio.Event)
    stopped: bool = False  # SIGSTOPped now

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, nursery: trio.Nursery) -> None:
        with self.log.open("ab") as err:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "navi_trio", "serve", "--port", "0", "--llm-url",
                 self.llm.url, "--log-level", "info"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=self.env,
            )  # fmt: skip
        self.proc = proc
        assert proc.stdout is not None
        data = b""
        with trio.fail_after(START_SEC):
            while b"\n" not in data:
                chunk = await proc.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"daemon {self.index} exited before listening: {data!r}")
                data += chunk
        line = data.decode().splitlines()[0]
        if not line.startswith("navi: listening on ws://"):
            raise RuntimeError(f"daemon {self.index} printed {line!r}")
        self.url = line.split()[-1]
        nursery.start_soon(_drain, proc.stdout)
        self.up.set()

    async def kill(self) -> None:
        """SIGKILL (SIGCONT first, should it be stopped); its clients wait for `up`."""
        self.up = trio.Event()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            if self.stopped:
                os.kill(self.proc.pid, signal.SIGCONT)
            with trio.move_on_after(10):
                await self.proc.wait()
        self.stopped = False


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Read what a daemon prints after its first line, so that it never blocks on it."""
    while await stream.receive_some():
        pass


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (autocommit); its rows. Blocking."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(statement.encode(), params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


# -- the clients ------------------------------------------------------------------------


@attrs.define
class Plan:
    daemons: int
    sessions: list[str]
    pause: tuple[float, float]  # seconds between a reply and the next send


async def client(
    slot: Slot, name: str, token: str, plan: Plan, tally: Tally, rng: random.Random,
    stop: trio.Event,
) -> None:  # fmt: skip
    """Send one message at a time to a random session, on `slot`'s daemon, until `stop`;
    read the frames meanwhile (drops, errors). A lost connection is made again once the
    daemon is up."""
    count = 0
    while not stop.is_set():
        await slot.up.wait()
        try:
            async with open_daemon(slot.url, token) as conn:
                while not stop.is_set():
                    text = f"m{plan.daemons}.{name}.{count:05d}"
                    count += 1
                    await send(conn, slot, text, plan, tally, rng)
                    with trio.move_on_after(rng.uniform(*plan.pause)):
                        while True:
                            tally.see(await conn.receive())
        except DaemonUnreachableError:
            tally.reconnects += 1
            await trio.sleep(rng.uniform(0.1, 0.5))  # the daemon is down or paused


async def send(
    conn: DaemonConnection, slot: Slot, text: str, plan: Plan, tally: Tally, rng: random.Random
) -> None:
    on_busy = rng.choices(list(ON_BUSY), weights=list(ON_BUSY.values()))[0]
    sent = Sent(text, rng.choice(plan.sessions), on_busy, slot.index)
    tally.sent.append(sent)
    try:
        accepted = await conn.send_message(
            text, session_id=sent.session_id, on_busy=on_busy, timeout=REPLY_SEC
        )
    except RemoteError as exc:
        sent.outcome, sent.code = "refused", exc.code
        return
    tally.ack(sent, accepted.queued, accepted.on_busy)


# -- the faults -------------------------------------------------------------------------


@attrs.define
class Faults:
    server: PgServer
    slots: list[Slot]
    nursery: trio.Nursery
    tally: Tally
    rng: random.Random
    ttl: float
    outage: float

    def live(self) -> Slot:
        return self.rng.choice([s for s in self.slots if s.up.is_set() and not s.stopped])

    async def pg_restart(self) -> None:
        await self._pg_down(self.rng.uniform(0.2, 3.0))

    async def pg_outage(self) -> None:
        await self._pg_down(self.outage)

    async def _pg_down(self, seconds: float) -> None:
        await trio.to_thread.run_sync(self.server.halt)
        try:
            await trio.sleep(seconds)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.server.resume)

    async def cut(self) -> None:
        """Every connection of one daemon to the database ends (its pool's, its
        listener's), as a network cut or an operator would end them."""
        pid = self.live().pid
        await trio.to_thread.run_sync(
            self.server.admin,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name"
            f" IN ('navi {pid}', 'navi bus {pid}')",
        )

    async def kill(self) -> None:
        slot = self.live()
        await slot.kill()
        await trio.sleep(self.rng.uniform(0.5, 5.0))
        await slot.start(self.nursery)

    async def pause(self) -> None:
        """SIGSTOP past the lease's TTL (its sessions are taken over), then SIGCONT."""
        slot = self.live()
        slot.stopped = True
        os.kill(slot.pid, signal.SIGSTOP)
        try:
            await trio.sleep(self.ttl + self.rng.uniform(1.0, self.ttl + 2.0))
        finally:
            if slot.stopped:
                os.kill(slot.pid, signal.SIGCONT)
                slot.stopped = False

    async def inject(self, kinds: list[str], gap: tuple[float, float]) -> None:
        """Each fault in `kinds`, in a random order, at random moments."""
        order = list(kinds)
        self.rng.shuffle(order)
        for kind in order:
            await trio.sleep(self.rng.uniform(*gap))
            started = time.monotonic()
            await getattr(self, kind)()
            self.tally.faults[kind] += 1
            print(f"  fault {kind} ({time.monotonic() - started:.1f} s)", flush=True)


FAULTS = ["pg_restart", "pg_restart", "pg_outage", "cut", "cut", "kill", "pause"]


# -- settling and counting ----------------------------------------------------------------


SESSION_ROWS = """
SELECT m.session_id, m.position, m.role, m.content, m.data FROM messages m
WHERE m.session_id = ANY(%s) ORDER BY m.session_id, m.position
"""
UNSETTLED = """
SELECT (SELECT count(*) FROM queued WHERE session_id = ANY(%s)),
       (SELECT count(*) FROM (
           SELECT DISTINCT ON (session_id) session_id, role FROM messages
           WHERE session_id = ANY(%s) ORDER BY session_id, position DESC
       ) last WHERE role = 'user')
"""


async def settle(url: str, sessions: list[str]) -> tuple[int, int]:
    """Wait until nothing is queued and every session's last turn ended (its last row
    is not a user message), polling the database every second within SETTLE_SEC; what
    is still unsettled (queued rows, sessions mid-turn) at the end."""
    left = (-1, -1)
    with trio.move_on_after(SETTLE_SEC):
        while True:
            try:
                row = await trio.to_thread.run_sync(sql, url, UNSETTLED, (sessions, sessions))
                left = (int(row[0][0]), int(row[0][1]))
            except Exception as exc:  # noqa: BLE001 - the server may be on its way back
                print(f"  settling: {exc}", flush=True)
            if left == (0, 0):
                break
            await trio.sleep(1.0)
    return left


@attrs.define
class Turn:
    """One turn of the history: its user message, the steered ones it took in, and
    how it ended (the assistant rows' content and error)."""

    text: str
    steered: list[str] = attrs.field(factory=list)
    answers: list[str] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    next: Turn | None = None  # the session's next turn


def turns(rows: list[tuple[Any, ...]]) -> tuple[list[Turn], list[str]]:
    """The turns of the history rows, and the user messages of each in order."""
    out: list[Turn] = []
    users: list[str] = []
    for _sid, _pos, role, content, data in rows:
        extra = json.loads(data) if data else {}
        if role == "user":
            users.append(str(content))
            if extra.get("steered") and out:
                out[-1].steered.append(str(content))
            else:
                out.append(Turn(str(content)))
                if len(out) > 1:
                    out[-2].next = out[-1]
        elif role == "assistant" and out:
            out[-1].answers.append(str(content or ""))
            if extra.get("error"):
                out[-1].errors.append(str(extra["error"]))
    return out, users


@attrs.define
class Figures:
    daemons: int
    sent: int = 0
    acked: int = 0
    stored: int = 0
    run: int = 0
    lost: int = 0
    duplicated: int = 0
    dropped: int = 0
    refused: int = 0
    unanswered: int = 0
    died: int = 0  # acked, its turn ended by its daemon's death before the model was asked
    interrupted: int = 0  # acked, its turn stopped by the next message (on_busy interrupt)
    asked_again: int = 0  # the model asked twice with it, answered once (a resumed turn)
    refused_stored: int = 0
    faults: int = 0
    wall: float = 0.0
    unsettled: tuple[int, int] = (0, 0)
    details: list[str] = attrs.field(factory=list)


def interrupted(turn: Turn, applied: dict[str, str | None], cap: int) -> bool:
    """Whether a turn that ended without a word was stopped by a message sent with
    ``on_busy: interrupt``: one of the turns after it. Not always the next one: an
    interrupting message goes behind the rows queued in the store before it (handed
    over by other daemons, not taken in yet), at most `cap` of them."""
    later = turn.next
    for _ in range(cap + 1):
        if later is None:
            return False
        if applied.get(later.text) == "interrupt":
            return True
        later = later.next
    return False


def count(
    daemons: int,
    tally: Tally,
    rows: list[tuple[Any, ...]],
    asked_pair: Asked,
    cap: int,
) -> Figures:
    """The figures of one topology. `asked_pair`: how often the model was asked with each
    message as the newest of its request (`last`), and with it anywhere after the
    request's last answer (`seen`: a message steered in before a turn's first call)."""
    asked, seen = asked_pair.last, asked_pair.seen
    fig = Figures(daemons, sent=len(tally.sent), faults=sum(tally.faults.values()))
    by_session: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
    for row in rows:
        by_session[row[0]].append(row)
    stored: collections.Counter[str] = collections.Counter()
    answered: collections.Counter[str] = collections.Counter()
    ended: dict[str, Turn] = {}
    for session_rows in by_session.values():
        session_turns, users = turns(session_rows)
        stored.update(users)
        for turn in session_turns:
            for answer in turn.answers:
                answered.update(TEXT.findall(answer))
            for text in [turn.text, *turn.steered]:
                ended[text] = turn
    applied = {s.text: s.applied for s in tally.sent}
    for s in tally.sent:
        if s.outcome == "refused":
            fig.refused += 1
            if stored[s.text] or asked[s.text]:
                fig.refused_stored += 1
                fig.details.append(f"refused ({s.code}) but stored {stored[s.text]}x, "
                                   f"asked {asked[s.text]}x: {s}")  # fmt: skip
            continue
        if s.outcome == "unanswered":
            fig.unanswered += 1
        else:
            fig.acked += 1
        twice = stored[s.text] > 1 or answered[s.text] > 1
        if twice:
            fig.duplicated += 1
            fig.details.append(f"duplicated: stored {stored[s.text]}x, answered "
                               f"{answered[s.text]}x, asked {asked[s.text]}x: {s}")  # fmt: skip
        if s.outcome != "acked":
            continue
        its = ended.get(s.text)
        if stored[s.text]:
            fig.stored += 1
        if tally.dropped[s.text] and not stored[s.text]:
            fig.dropped += 1
            continue
        if not stored[s.text]:
            fig.lost += 1
            fig.details.append(f"lost: never stored, asked {asked[s.text]}x: {s}")
        elif its is not None and not its.answers and interrupted(its, applied, cap):
            fig.run += 1  # stopped before a word of its answer: nothing of it to keep
            fig.interrupted += 1
        elif its is None or not its.answers:
            fig.lost += 1
            fig.details.append(f"lost: stored, its turn never ended, asked {asked[s.text]}x: {s}")
        else:
            fig.run += 1
            if not seen[s.text]:
                fig.died += 1
                fig.details.append(f"its turn ended by a takeover before the model was asked "
                                   f"(errors {its.errors}): {s}")  # fmt: skip
            if asked[s.text] > 1 and not twice:
                fig.asked_again += 1
                fig.details.append(f"asked {asked[s.text]}x, answered {answered[s.text]}x, "
                                   f"turn errors {its.errors}: {s}")  # fmt: skip
    return fig


# -- one topology ---------------------------------------------------------------------------


async def topology(daemons: int, server: PgServer, args: argparse.Namespace) -> Figures:
    rng = random.Random(f"{args.seed}-{daemons}")
    folder = Path(tempfile.mkdtemp(prefix=f"navi-soak-{daemons}-"))
    url = await trio.to_thread.run_sync(server.create_database)
    started = time.monotonic()
    tally = Tally(target=args.acked)
    sessions = [f"alice.soak{i:02d}" for i in range(args.sessions)]
    slots: list[Slot] = []
    try:
        config = config_file(folder)  # (in folder/config)
        env = base_env(
            NAVI_DB=url, NAVI_CONFIG=str(config), NAVI_LEASE_TTL_SEC=str(args.ttl),
            NAVI_MESSAGE_QUEUE_MAX=str(args.cap), NAVI_WS_CONNECTIONS_PER_USER="64",
            OLLAMA_NUM_CTX=str(N_CTX),
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            for i in range(daemons):
                llm = FakeLLMServer([{"text": "x"}], loop=True, n_ctx=N_CTX, shape=echo(rng))
                await nursery.start(llm.serve)
                data = {"NAVI_DATA_DIR": str(folder / f"data{i}")}
                slots.append(Slot(i, {**env, **data}, llm, folder / f"daemon{i}.log"))
            for slot in slots:
                await slot.start(nursery)
            token = await add_user({**env, "NAVI_DATA_DIR": str(folder / "operator")})
            await create(slots[0].url, token, sessions)
            print(f"{daemons} daemons up (pids {[s.pid for s in slots]}), "
                  f"{len(sessions)} sessions; sending", flush=True)  # fmt: skip
            plan = Plan(daemons, sessions, (args.pause_ms[0] / 1000, args.pause_ms[1] / 1000))
            stop = trio.Event()
            faults = Faults(server, slots, nursery, tally, rng, args.ttl, args.outage_sec)
            with trio.move_on_after(args.limit_sec) as limit:
                async with trio.open_nursery() as clients:
                    for n in range(daemons * args.clients):
                        slot = slots[n % daemons]
                        crng = random.Random(rng.random())
                        clients.start_soon(client, slot, f"c{n}", token, plan, tally, crng, stop)
                    await faults.inject(FAULTS * args.rounds, (args.gap_sec[0], args.gap_sec[1]))
                    await trio.sleep(args.gap_sec[0])  # a calm tail after the last fault
                    await tally.enough.wait()
                    stop.set()
            if limit.cancelled_caught:
                print(f"  --limit-sec {args.limit_sec} reached", flush=True)
            print(f"  {tally.acked} acked; settling", flush=True)
            unsettled = await settle(url, sessions)
            rows = await trio.to_thread.run_sync(sql, url, SESSION_ROWS, (sessions,))
            asked = Asked.of([r["body"] for s in slots for r in s.llm.chat_requests])
            for slot in slots:
                await slot.kill()
            nursery.cancel_scope.cancel()
        if args.keep:
            keep(folder, tally, rows, slots)
        fig = count(daemons, tally, rows, asked, args.cap)
        fig.unsettled = unsettled
        fig.wall = time.monotonic() - started
        print(f"  frames' errors: {dict(tally.errors)}; reconnects {tally.reconnects}; "
              f"faults {dict(tally.faults)}", flush=True)  # fmt: skip
        return fig
    finally:
        with trio.CancelScope(shield=True):
            for slot in slots:
                await slot.kill()
            await trio.to_thread.run_sync(server.drop_database, url.rsplit("/", 1)[1])
        if args.keep:
            print(f"  kept {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def keep(folder: Path, tally: Tally, rows: list[tuple[Any, ...]], slots: list[Slot]) -> None:
    """What the figures were counted from, for a look at what went wrong."""
    (folder / "sent.json").write_text(json.dumps([attrs.asdict(s) for s in tally.sent]))
    (folder / "history.json").write_text(json.dumps(rows, default=str))
    asked = [
        {"daemon": s.index, "time": r["time"], "texts": asked_texts(r["body"]),
         "messages": [m.get("content") for m in r["body"]["messages"][1:]][-4:]}
        for s in slots for r in s.llm.chat_requests
    ]  # fmt: skip
    (folder / "asked.json").write_text(json.dumps(asked))


async def create(url: str, token: str, sessions: list[str]) -> None:
    """Make the sessions (the reply to a create is a ``session`` frame)."""
    async with open_daemon(url, token) as conn:
        for sid in sessions:
            await conn.send({"type": "sessions", "action": "create", "session_id": sid, "id": sid})
            with trio.fail_after(CLI_SEC):
                while (frame := await conn.receive()).get("id") != sid:
                    pass
            if frame["type"] != "session":
                raise RuntimeError(f"creating {sid}: {frame}")


async def add_user(env: dict[str, str]) -> str:
    """alice, made with ``navi users add`` (a process of its own); her token."""
    with trio.fail_after(CLI_SEC):
        done = await trio.run_process(
            [sys.executable, "-m", "navi_trio", "users", "add", "alice", "--role", "user"],
            capture_stdout=True, capture_stderr=True, env=env,
        )  # fmt: skip
    return done.stdout.decode().strip().splitlines()[-1]


# -- the table ----------------------------------------------------------------------------


COLUMNS = ["daemons", "acked", "stored", "run", "lost", "duplicated", "dropped by cap",
           "refused", "unanswered", "faults", "wall"]  # fmt: skip


def table(figures: list[Figures]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for f in figures:
        cells = [f.daemons, f.acked, f.stored, f.run, f.lost, f.duplicated, f.dropped,
                 f.refused, f.unanswered, f.faults, f"{f.wall:.0f} s"]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--acked", type=int, default=1200, help="acked messages per topology")
    parser.add_argument("--clients", type=int, default=2, help="clients per daemon")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--pause-ms", type=int, nargs=2, default=[50, 200])
    parser.add_argument("--gap-sec", type=float, nargs=2, default=[8.0, 20.0],
                        help="between two faults")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="times each fault is injected")
    parser.add_argument("--ttl", type=float, default=3.0, help="NAVI_LEASE_TTL_SEC")
    parser.add_argument("--cap", type=int, default=5, help="NAVI_MESSAGE_QUEUE_MAX")
    parser.add_argument("--outage-sec", type=float, default=20.0)
    parser.add_argument("--limit-sec", type=float, default=900.0, help="sending, per topology")
    parser.add_argument("--seed", default=str(random.randrange(10**6)))
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = parser.parse_args()
    print(f"seed {args.seed}", flush=True)
    try:
        server = PgServer.start()
    except PgUnavailable as exc:
        print(f"soak_cluster: no PostgreSQL server: {exc}", file=sys.stderr)
        return 2
    figures: list[Figures] = []
    try:
        for daemons in args.daemons:
            figures.append(trio.run(topology, daemons, server, args))
    finally:
        server.stop()
    print()
    print(table(figures))
    for f in figures:
        print(f"\n{f.daemons} daemons: {f.sent} sent; of the acked, {f.interrupted} interrupted "
              f"before their answer began, {f.died} ended by their "
              f"daemon's death before the model was asked, {f.asked_again} asked twice and "
              f"answered once; {f.refused_stored} refused but stored; unsettled (queued, "
              f"mid-turn) {f.unsettled}")  # fmt: skip
        for line in f.details[:50]:
            print("  " + line)
    return 1 if any(f.lost or f.duplicated for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
