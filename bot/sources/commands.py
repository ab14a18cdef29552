"""Running cluster commands so that none can hang the bot, flood its memory or starve other users.

Each command is a new session (`start_new_session`), reads its output from pipes we own, up to a
byte cap, and ends at its timeout: the whole session is killed and our ends of the pipes are
closed, so a grandchild that left the session (`setsid`) and keeps stdout open cannot hold us.
Commands run as asyncio subprocesses, never on the event loop's default thread pool (aiohttp
resolves Slack's address there), and a command waits for a slot: at most `total` in flight, and
at most `per_user` for one user, so one hung cluster or one busy user never slows a pasted log.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

READ_CHUNK = 1 << 20
STDERR_KEPT = 4096  # bytes of stderr kept for the one-line reason; the rest is drained and dropped
EXIT_GRACE = 0.5  # seconds the pipes may stay open after the command exited (a lingering grandchild)
REAP_WAIT = 2.0  # seconds we wait for a killed command to be reaped (a process stuck in I/O may not die)


class CommandError(Exception):
    """A command could not be run or did not finish; the message says which and why in one line."""


@dataclass
class Output:
    stdout: bytes  # empty when the output went to a file
    stderr: str  # its first line, for the reason
    returncode: int | None  # None when the command was killed
    capped: bool = False  # stdout passed the cap and was cut there

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self, name: str) -> str:
        return f"{name} failed (exit {self.returncode})" + (f": {self.stderr}" if self.stderr else "")


def remote(prefix: tuple[str, ...], argv: list[str]) -> list[str]:
    """argv run through a prefix such as `ssh login01`, which hands its arguments to a remote shell
    (so they are shell-quoted); without a prefix argv is run as it is."""
    return list(prefix) + [shlex.quote(a) for a in argv] if prefix else list(argv)


class Runner:
    """Runs commands under a total and a per-user limit of commands in flight."""

    def __init__(self, total: int, per_user: int) -> None:
        self._total = asyncio.Semaphore(total)
        self._per_user = per_user
        self._users: dict[str, asyncio.Semaphore] = {}
        self._active: dict[str, int] = {}  # commands of each user waiting or running

    async def run(self, argv: list[str], timeout: float, cap: int, user: str | None = None,
                  dest: Path | None = None, name: str | None = None) -> Output:
        """Run argv; stdout (at most `cap` bytes) is returned, or written to `dest` when given.
        CommandError (naming it `name`) when it cannot start, when no slot frees within `timeout`,
        or when it runs past it."""
        name = name or os.path.basename(argv[0])
        deadline = time.monotonic() + timeout
        key = user or "-"
        mine = self._users.setdefault(key, asyncio.Semaphore(self._per_user))
        self._active[key] = self._active.get(key, 0) + 1
        try:
            async with self._slot(mine, name, timeout):
                return await _run(argv, name, max(0.0, deadline - time.monotonic()), timeout, cap, dest)
        finally:
            self._active[key] -= 1
            if not self._active[key]:  # forget idle users
                del self._active[key], self._users[key]

    @contextlib.asynccontextmanager
    async def _slot(self, mine: asyncio.Semaphore, name: str, timeout: float):
        try:
            async with asyncio.timeout(timeout):
                await mine.acquire()
                try:
                    await self._total.acquire()
                except BaseException:
                    mine.release()
                    raise
        except TimeoutError:
            raise CommandError(f"{name} was not started: too many commands in flight for {timeout:g} s") from None
        try:
            yield
        finally:
            self._total.release()
            mine.release()


_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner(total: int, per_user: int) -> Runner:
    """The runner of the running event loop: the limits hold across every request it serves."""
    loop = asyncio.get_running_loop()
    if loop not in _runners:
        _runners[loop] = Runner(total, per_user)
    return _runners[loop]


async def _pipe(loop: asyncio.AbstractEventLoop, fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    return reader, transport


async def _copy(reader: asyncio.StreamReader, cap: int, sink: BinaryIO | None, kept: bytearray) -> bool:
    """Read until EOF or `cap` bytes; True when the cap was reached (more may have followed)."""
    got = 0
    while chunk := await reader.read(READ_CHUNK):
        piece = chunk[: cap - got]
        got += len(piece)
        if sink is not None:
            sink.write(piece)
        else:
            kept += piece
        if got >= cap:
            return True
    return False


async def _drain(reader: asyncio.StreamReader, kept: bytearray) -> None:
    while chunk := await reader.read(READ_CHUNK):
        kept += chunk[: max(0, STDERR_KEPT - len(kept))]


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the command's whole session: an ssh and what it started
    except (ProcessLookupError, PermissionError):
        pass


async def _run(argv: list[str], name: str, left: float, timeout: float, cap: int, dest: Path | None) -> Output:
    loop = asyncio.get_running_loop()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_w,
                                                    stderr=err_w, start_new_session=True)
    except OSError as exc:
        os.close(out_r), os.close(err_r)
        raise CommandError(f"cannot run {os.path.basename(argv[0])}: {exc.strerror or exc} (is it on PATH?)") from None
    finally:
        os.close(out_w), os.close(err_w)
    out, out_t = await _pipe(loop, out_r)
    err, err_t = await _pipe(loop, err_r)
    kept, err_kept = bytearray(), bytearray()
    sink = dest.open("wb") if dest is not None else None
    copy = asyncio.ensure_future(_copy(out, cap, sink, kept))
    drain = asyncio.ensure_future(_drain(err, err_kept))
    exited = asyncio.ensure_future(proc.wait())
    capped = timed_out = False
    try:
        async with asyncio.timeout(left):
            await asyncio.wait([copy, exited], return_when=asyncio.FIRST_COMPLETED)
            if copy.done():
                capped = copy.result()  # at the cap we have enough: the command is ended below
                if not capped:
                    await exited
                    await asyncio.wait([drain], timeout=EXIT_GRACE)
            else:  # it exited: what it wrote is in the pipes; a grandchild holding them open is not waited for
                await asyncio.wait([copy, drain], timeout=EXIT_GRACE)
                capped = copy.done() and copy.result()
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            _kill(proc.pid)
        for task in (copy, drain):
            task.cancel()
        out_t.close()
        err_t.close()
        if sink is not None:
            sink.close()
        await asyncio.wait([exited], timeout=REAP_WAIT)
    if timed_out:
        raise CommandError(f"{name} did not answer within {timeout:g} s")
    stderr = bytes(err_kept).decode("utf-8", "replace").strip().split("\n")[0][:300]
    code = 0 if capped else proc.returncode  # a capped command was answering when we ended it
    return Output(bytes(kept), stderr, code, capped)
