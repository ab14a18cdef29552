"""Fault runs against `trainmedic serve` as a real process, over HTTP or Socket Mode, with FakeSlack
playing Slack (and Slack's retries: a request that got no 2xx, or an envelope that got no ack, is
sent again until it is acknowledged). Used short by tests/test_slack_faults.py and at full length
by benchmarks/delivery.py, which prints the figures.

- `crash_run`: events at a steady rate, the bot killed with SIGKILL at a random moment, restarted,
  N times; then every event must have exactly one reply, every reply must be stored (its buttons
  work), the database must pass `PRAGMA integrity_check`, and no worker process may outlive its bot.
- `outage_run`: Slack's Web API unreachable for a while, then answering 503 (or 429) for a while,
  while events keep coming; every reply must arrive afterwards, exactly once.
- `sigterm_run`: work in flight (Slack slow to answer), SIGTERM, exit 0 within the grace period, a
  request after the signal refused with 503, and after a restart every acknowledged event answered once.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from slack_fake import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, FakeSlack
from slackbot import event_body, message, signed_headers

PASTE = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total "
         "capacity of 79.15 GiB of which 1.71 GiB is free.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> set[int]:
    """Live processes whose parent is `pid` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Event:
    event_id: str
    body: str
    acked: bool = False
    sends: int = 0


@dataclass
class Figures:
    mode: str
    iterations: int = 0
    events: int = 0
    resent: int = 0  # sends Slack would have retried (no 2xx, no ack)
    replies: int = 0
    missing: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    unstored: int = 0  # replies Slack has that the history does not know (their buttons would do nothing)
    orphans: int = 0
    integrity: str = ""
    restart_s: list[float] = field(default_factory=list)
    catch_up_s: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.doubled and not self.unstored and not self.orphans \
            and self.integrity == "ok"

    def lines(self) -> list[str]:
        return [f"mode {self.mode}: {self.iterations} kills, {self.events} events, {self.resent} sends retried",
                f"replies {self.replies}, missing {len(self.missing)}, doubled {len(self.doubled)}, "
                f"unstored {self.unstored}, orphaned processes {self.orphans}, integrity_check {self.integrity}",
                f"restart to ready: median {statistics.median(self.restart_s or [0]):.2f} s, "
                f"max {max(self.restart_s or [0]):.2f} s; last event to last reply {self.catch_up_s:.1f} s"]


class Bot:
    """One `trainmedic serve` process on `db`, HTTP or Socket Mode."""

    def __init__(self, fake: FakeSlack, db: Path, mode: str, **env: str) -> None:
        self.fake, self.db, self.mode, self.env = fake, db, mode, env
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.log = db.with_suffix(".log").open("ab")

    async def start(self, http: aiohttp.ClientSession) -> float:
        started = time.monotonic()
        sockets = len(self.fake.sockets)
        env = {**os.environ, "SLACK_BOT_TOKEN": BOT_TOKEN, "TRAINMEDIC_SLACK_API_URL": self.fake.api_url,
               "TRAINMEDIC_DB": str(self.db), "SLACK_SIGNING_SECRET": SIGNING_SECRET, **self.env}
        args = ["--socket-mode"] if self.mode == "socket" else []
        if self.mode == "socket":
            env["SLACK_APP_TOKEN"] = APP_TOKEN
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "serve", "--port", str(self.port), "--host", "127.0.0.1", *args,
            env=env, stdout=self.log, stderr=self.log)
        while not await self.healthy(http) or (self.mode == "socket" and len(self.fake.sockets) <= sockets):
            if self.proc.returncode is not None:
                raise AssertionError(f"the bot exited with {self.proc.returncode}: see {self.log.name}")
            if time.monotonic() - started > 60:
                raise AssertionError("the bot did not become ready in 60 s")
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def healthy(self, http: aiohttp.ClientSession) -> bool:
        try:
            async with http.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    async def send(self, http: aiohttp.ClientSession, event: Event, envelope_ids: itertools.count) -> int | None:
        """Deliver as Slack does; the HTTP status, or 200 once the envelope is acked (None: no answer)."""
        event.sends += 1
        if self.mode == "http":
            headers = {"Content-Type": "application/json", **signed_headers(event.body)}
            if event.sends > 1:
                headers["X-Slack-Retry-Num"] = str(event.sends - 1)
            try:
                async with http.post(f"http://127.0.0.1:{self.port}/slack/events", data=event.body,
                                     headers=headers) as resp:
                    return resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return None
        envelope = f"env-{next(envelope_ids)}"
        try:
            await self.fake.send_envelope(json.loads(event.body), envelope)
        except (ConnectionError, RuntimeError, IndexError):
            return None
        for _ in range(60):  # Slack waits 3 s for the ack
            if self.fake.acked(envelope):
                return 200
            await asyncio.sleep(0.05)
        return None

    def kill(self) -> set[int]:
        """SIGKILL; returns the bot's children (scan workers, resource tracker) as they were."""
        kids = children(self.proc.pid)
        self.proc.kill()
        return kids

    async def wait(self) -> int:
        return await self.proc.wait()


@asynccontextmanager
async def talking_to(fake: FakeSlack, bot: Bot):
    """An HTTP session for the run; at its end the bot is killed if still up and FakeSlack stopped."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        try:
            yield http
        finally:
            if bot.proc is not None and bot.proc.returncode is None:
                bot.proc.kill()
                await bot.proc.wait()
            await fake.stop()


async def replies_for(fake: FakeSlack, want: set[str], timeout: float) -> tuple[list[str], list[str]]:
    """Wait until every wanted reply key was posted; (missing, doubled) a second after."""
    deadline = time.monotonic() + timeout
    while not want <= set(fake.reply_keys()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # would anything come twice?
    keys = fake.reply_keys()
    return sorted(want - set(keys)), sorted({k for k in keys if keys.count(k) > 1})


async def _sender(bot: Bot, http, events: list[Event], todo: list[Event], rate: float, envelope_ids, figures: Figures):
    """New events at `rate` a second, and Slack's retries of those without a 2xx or an ack."""
    fresh = (Event(f"EvCRASH{n:05d}", "") for n in itertools.count(len(events)))
    while True:
        if todo:
            event = todo.pop(0)
            figures.resent += 1
        else:
            event = next(fresh)
            event.body = event_body(message(PASTE, ts=f"1700001000.{len(events):06d}", channel=f"C0CH{len(events) % 8}"),
                                    event.event_id)
            events.append(event)
        status = await bot.send(http, event, envelope_ids)
        if status == 200:
            event.acked = True
        else:
            todo.append(event)
        await asyncio.sleep(1 / rate)


async def crash_run(tmp: Path, iterations: int, mode: str = "http", rate: float = 10.0, seed: int = 0,
                    alive_s: tuple[float, float] = (0.3, 2.5)) -> Figures:
    rng = random.Random(seed)
    fake = await FakeSlack().start()
    db = tmp / f"crash-{mode}.db"
    figures = Figures(mode)
    events: list[Event] = []
    todo: list[Event] = []
    envelope_ids = itertools.count(1)
    bot = Bot(fake, db, mode)
    async with talking_to(fake, bot) as http:
        for _ in range(iterations):
            figures.restart_s.append(await bot.start(http))
            sender = asyncio.create_task(_sender(bot, http, events, todo, rate, envelope_ids, figures))
            await asyncio.sleep(rng.uniform(*alive_s))
            kids = bot.kill()
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            figures.exit_codes.append(await bot.wait())
            figures.iterations += 1
            await asyncio.sleep(1.5)  # a worker notices its parent is gone within a second
            figures.orphans += sum(alive(pid) for pid in kids)
        figures.restart_s.append(await bot.start(http))
        todo += [e for e in events if not e.acked and e not in todo]
        while todo:  # Slack retries what got no 2xx
            event = todo.pop(0)
            figures.resent += 1
            if await bot.send(http, event, envelope_ids) == 200:
                event.acked = True
            else:
                todo.append(event)
        last_event = time.monotonic()
        figures.missing, figures.doubled = await replies_for(fake, {f"event:{e.event_id}#1" for e in events}, 120)
        figures.catch_up_s = time.monotonic() - last_event - 1.0
        bot.proc.send_signal(signal.SIGTERM)
        figures.exit_codes.append(await bot.wait())
    figures.events, figures.replies = len(events), len(fake.reply_keys())
    figures.integrity, figures.unstored = _check_db(db, fake)
    return figures


def _check_db(db: Path, fake: FakeSlack) -> tuple[str, int]:
    conn = sqlite3.connect(db)
    try:
        integrity = conn.execute("pragma integrity_check").fetchone()[0]
        stored = {r[0] for r in conn.execute("select ts from slack_messages")}
    finally:
        conn.close()
    return integrity, sum(m["ts"] not in stored for m in fake.posted() if m.get("metadata"))


async def sigterm_run(tmp: Path, mode: str = "http", in_flight: int = 6, grace: int = 2) -> dict:
    """Mentions whose thread Slack is slow to return, SIGTERM while they wait, then a restart."""
    fake = await FakeSlack().start()
    fake.thread = [{"ts": "1700000000.000001", "user": "U1", "text": PASTE}]
    fake.slow["conversations.replies"] = [grace + 4.0] * in_flight
    db = tmp / f"sigterm-{mode}.db"
    bot = Bot(fake, db, mode, TRAINMEDIC_SHUTDOWN_GRACE=str(grace))
    envelope_ids = itertools.count(1)
    out: dict = {"mode": mode}
    events = [Event(f"EvTERM{i}", event_body({"type": "app_mention", "channel": "C0INCIDENTS", "user": "U2",
                                              "text": "<@UBOT> what broke?", "ts": f"1700000000.{i + 10:06d}",
                                              "thread_ts": "1700000000.000001"}, f"EvTERM{i}"))
              for i in range(in_flight)]
    async with talking_to(fake, bot) as http:
        await bot.start(http)
        out["acked"] = sum([await bot.send(http, e, envelope_ids) == 200 for e in events])
        while len(fake.called("conversations.replies")) < min(in_flight, 4):  # listeners are waiting on Slack
            await asyncio.sleep(0.05)
        stopping = time.monotonic()
        bot.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        late = Event("EvLATE", event_body(message(PASTE, ts="1700000300.000001"), "EvLATE"))
        out["after_signal"] = await bot.send(http, late, envelope_ids)
        out["exit_code"] = await bot.wait()
        out["stop_s"] = time.monotonic() - stopping
        out["replies_before_restart"] = len(fake.reply_keys())
        await bot.start(http)
        if out["after_signal"] != 200:  # Slack retries it
            while await bot.send(http, late, envelope_ids) != 200:
                await asyncio.sleep(0.2)
        out["missing"], out["doubled"] = await replies_for(fake, {f"event:{e.event_id}#1" for e in events + [late]}, 60)
        bot.proc.send_signal(signal.SIGTERM)
        out["second_exit_code"] = await bot.wait()
    return out


async def outage_run(tmp: Path, mode: str = "http", down_s: float = 30.0, status_s: float = 30.0, status: int = 503,
                     events: int = 20) -> dict:
    """Events sent while the Web API is down, then while it answers `status`; when does every reply arrive?"""
    fake = await FakeSlack().start()
    bot = Bot(fake, tmp / f"outage-{mode}-{status}.db", mode)
    envelope_ids = itertools.count(1)
    batch = [Event(f"EvOUT{status}x{i}", event_body(message(PASTE, ts=f"1700002000.{i:06d}", channel=f"C0CH{i % 4}"),
                                                    f"EvOUT{status}x{i}")) for i in range(events)]
    out: dict = {"mode": mode, "events": events, "down_s": down_s, "status": status, "status_s": status_s}
    async with talking_to(fake, bot) as http:
        await bot.start(http)
        if mode == "http":  # a Socket Mode bot cannot hear Slack while Slack is down
            await fake.go_down()
        else:
            fake.outage = status
        started = time.monotonic()
        for i, event in enumerate(batch):
            out.setdefault("acks", []).append(await bot.send(http, event, envelope_ids))
            await asyncio.sleep((down_s + status_s) / events / 2)
        await asyncio.sleep(max(0.0, started + down_s - time.monotonic()))
        if mode == "http":
            await fake.come_up()
        fake.outage, fake.retry_after = status, 5
        await asyncio.sleep(status_s)
        out["posted_during"] = len(fake.posted())
        fake.outage = None
        recovered = time.monotonic()
        out["missing"], out["doubled"] = await replies_for(fake, {f"event:{e.event_id}#1" for e in batch}, 180)
        out["all_replies_after_s"] = time.monotonic() - recovered - 1.0
        out["false_failures"] = sum("could not answer" in m["text"] for m in fake.posted())
        bot.proc.send_signal(signal.SIGTERM)
        out["exit_code"] = await bot.wait()
    return out
