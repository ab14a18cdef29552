"""A job's log files, read under the path rules, as copies of their tails in the job's folder.

Which files: the StdOut/StdErr Slurm names, the per-rank files of the site's patterns
(TRAINMEDIC_SLURM_RANK_LOGS, e.g. `logs/%j/rank%t.log`: %t names the rank, %N the host of every
line in the file), and what torchrun's own output points at: the error files of its failure
table and the per-rank stdout/stderr of its `--log-dir` (`<dir>/attempt_<n>/<local rank>/`).
The rules: only under TRAINMEDIC_SLURM_LOG_ROOTS, no symlink out of them, regular files only
(anything else is refused with its reason, before it is read), the tail only, at most
TRAINMEDIC_SLURM_MAX_FILES files and TRAINMEDIC_SLURM_JOB_MB bytes for the job. Local files are
read on a small pool of our own (a hung file system blocks a thread there, never the event loop);
behind a command prefix the login node's `find`, `stat`, `realpath` and `tail` do it.
"""
from __future__ import annotations

import asyncio
import json
import mmap
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bot.engine.timeline import Origin
from bot.sources.cluster import Cluster, JobError

MAX_REFS = 64  # torchrun error files and log folders followed from one job's logs
ERROR_FILE_BYTES = 1 << 20
DISK = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainmedic-joblogs")
_WILD = re.compile(r"%[tNns]|[*?]")
_TORCHRUN = re.compile(rb"log directory set to: (/\S+)|error_file\s*:\s*(/\S+)")
_TABLE_RANK = re.compile(rb"\brank\s*:\s*(\d+)")
_TABLE_HOST = re.compile(rb"\bhost\s*:\s*([A-Za-z0-9][\w.-]*)")
_NCCL_HOST = re.compile(rb"^(?:\[[^\]\n]*\]:? ?)?([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL ", re.MULTILINE)  # host:pid:tid [dev]
_ATTEMPT = re.compile(r"/attempt_(\d+)/(\d+)/(?:stdout|stderr)\.log$")
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
_REMOTE_KINDS = {"directory": "a folder", "fifo": "a named pipe", "socket": "a socket",
                 "character special file": "a character device", "block special file": "a block device"}


@dataclass(frozen=True)
class LogFile:
    path: str
    origin: Origin | None = None
    error_file: bool = False  # a torchelastic error.json: its message and traceback are read as text

    @property
    def name(self) -> str:
        return self.path


@dataclass
class Read:
    """What was read: copies to diagnose, the origin of each, and why anything was not read."""

    parts: list[tuple[str, str]] = field(default_factory=list)  # (copy on disk, name shown)
    origins: dict[str, Origin] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _short_host(host: str) -> str:
    """torchrun names the host by its FQDN; Slurm and NCCL by its short name."""
    return host if host[:1].isdigit() else host.split(".")[0]


class JobLogs:
    """Reads one job's files into `folder`, within the job's file and byte budget."""

    def __init__(self, cluster: Cluster, folder: Path) -> None:
        self.cluster = cluster
        self.settings = cluster.settings
        self.folder = folder
        self.files_left = self.settings.slurm_max_files
        self.bytes_left = self.settings.slurm_job_bytes
        self.seen: set[str] = set()
        self.copies = 0

    @property
    def _roots(self) -> tuple[str, ...]:
        if self.settings.slurm_prefix:  # the roots name folders of the login node, as it resolves them
            return tuple(str(r) for r in self.settings.slurm_log_roots)
        return tuple(os.path.realpath(r) for r in self.settings.slurm_log_roots)

    async def read(self, files: list[LogFile]) -> Read:
        """Copy the tail of each file; refused and skipped files are notes, the others still read."""
        out = Read()
        files = [f for f in files if f.path not in self.seen]
        self.seen |= {f.path for f in files}
        if not files:
            return out
        if not self.settings.slurm_log_roots:
            out.notes.append("TRAINMEDIC_SLURM_LOG_ROOTS is not set, so no job log may be read")
            return out
        if len(files) > self.files_left:
            out.notes.append(f"{len(files) - self.files_left} more log file(s) not read "
                             f"(TRAINMEDIC_SLURM_MAX_FILES={self.settings.slurm_max_files}), e.g. {files[self.files_left].path}")
            files = files[: self.files_left]
        self.files_left -= len(files)
        tail = max(1 << 16, min(self.settings.slurm_tail_bytes, self.bytes_left // max(1, len(files))))
        reader = self._remote if self.settings.slurm_prefix else self._local
        try:
            copies = await reader(files, tail)
        except JobError as exc:  # the login node did not answer: these files are notes, the job goes on
            out.notes += [f"{f.path}: not read: {exc}" for f in files]
            return out
        for f, (dest, refused) in zip(files, copies):
            if refused:
                out.notes.append(refused)
                continue
            self.bytes_left -= dest.stat().st_size
            if f.error_file:
                await self._in_pool(_error_file_text, dest)
            out.parts.append((str(dest), f.name))
            origin = f.origin
            if origin and origin.rank is not None and origin.host is None:
                origin = Origin(origin.rank, await self._in_pool(_nccl_host, dest))
            if origin:
                out.origins[f.name] = origin
        return out

    def _dest(self) -> Path:
        self.copies += 1
        dest = self.folder / f"log{self.copies}"
        dest.touch()
        return dest

    async def _in_pool(self, fn, *args):
        """Run fn on our own disk pool; a file system that hangs past the timeout is given up on."""
        future = asyncio.get_running_loop().run_in_executor(DISK, fn, *args)
        return await asyncio.wait_for(future, self.settings.slurm_timeout)

    async def _local(self, files: list[LogFile], tail: int) -> list[tuple[Path, str | None]]:
        async def copy(f: LogFile, dest: Path) -> tuple[Path, str | None]:
            try:
                return dest, await self._in_pool(_copy_tail, f.path, dest, tail, self._roots)
            except TimeoutError:
                return dest, f"{f.path}: the file system did not answer within {self.settings.slurm_timeout:g} s, not read"

        return await asyncio.gather(*(copy(f, self._dest()) for f in files))

    async def _remote(self, files: list[LogFile], tail: int) -> list[tuple[Path, str | None]]:
        """On the login node: one `stat` and one `realpath` for all files, then a `tail` each."""
        paths = [f.path for f in files]
        kinds = dict(_split0(await self.cluster.run(["stat", "-L", "--printf", r"%n\t%F\0", "--", *paths])))
        regular = [p for p in paths if kinds.get(p) == "regular file"]
        resolved = (await self.cluster.run(["realpath", "-e", "-z", "--", *regular])).stdout.split(b"\0") if regular else []
        real = dict(zip(regular, (r.decode("utf-8", "replace") for r in resolved)))
        out = [(self._dest(), _remote_refusal(p, kinds.get(p), real.get(p), self._roots)) for p in paths]
        tails = [self.cluster.run(["tail", "-c", str(tail), "--", real[p]], dest=dest, cap=tail)
                 for p, (dest, refused) in zip(paths, out) if not refused]
        results = iter(await asyncio.gather(*tails, return_exceptions=True))
        return [(dest, refused or _tail_refusal(p, next(results))) for p, (dest, refused) in zip(paths, out)]

    async def discover(self, patterns: list[str]) -> Read:
        """Per-rank files matching the site's patterns (Slurm's job placeholders already expanded)."""
        found, notes = [], []
        for pattern in patterns:
            try:
                files, note = await self._matching(pattern)
            except JobError as exc:
                files, note = [], f"{pattern}: {exc}"
            found += files
            notes += [note] if note else []
        read = await self.read(found)
        read.notes[:0] = notes
        return read

    async def _matching(self, pattern: str) -> tuple[list[LogFile], str | None]:
        parts = pattern.split("/")
        wild = next((i for i, p in enumerate(parts) if _WILD.search(p)), None)
        if wild is None:
            return [LogFile(pattern)], None
        base = "/".join(parts[:wild]) or "/"
        if not _inside(os.path.normpath(base) if self.settings.slurm_prefix else os.path.realpath(base), self._roots):
            return [], f"{pattern}: outside TRAINMEDIC_SLURM_LOG_ROOTS, not searched"
        depth = len(parts) - wild
        glob = "/".join(parts[:wild] + [_WILD.sub("*", p) for p in parts[wild:]])
        answer = await self.cluster.run(["find", "-H", base, "-mindepth", str(depth), "-maxdepth", str(depth),
                                         "-type", "f", "-path", glob, "-print0"])
        if not answer.ok and not answer.stdout:
            return [], f"{pattern}: {answer.stderr or 'nothing found'}"
        shape = re.compile("/".join(re.escape(p) for p in parts[:wild]) + "/" + "/".join(map(_part_regex, parts[wild:])))
        files = []
        for raw in sorted(answer.stdout.split(b"\0")):
            path = raw.decode("utf-8", "replace")
            if m := shape.fullmatch(path):
                rank, host = m.groupdict().get("rank"), m.groupdict().get("host")
                files.append(LogFile(path, Origin(int(rank) if rank else None, host)))
        return files, None if files else f"{pattern}: no file matches"

    async def torchrun(self, read: Read) -> Read:
        """The files torchrun's output in `read` points at: error files of its failure table, with the
        rank and host the table gives, and the per-rank logs of its log folder."""
        errors: list[LogFile] = []
        folders: list[str] = []
        for copy, _ in read.parts:
            found_errors, found_folders = await self._in_pool(_torchrun_refs, copy)
            errors += found_errors
            folders += found_folders
        by_dir = {os.path.dirname(e.path): e.origin for e in errors}
        logs: list[LogFile] = []
        for folder in dict.fromkeys(folders[:MAX_REFS]):
            logs += await self._folder_logs(folder, by_dir)
        return await self.read(errors[:MAX_REFS] + logs)

    async def _folder_logs(self, folder: str, by_dir: dict[str, Origin | None]) -> list[LogFile]:
        """stdout.log/stderr.log of the last attempt in a torchrun log folder."""
        files, _ = await self._matching(f"{folder}/attempt_*/*/*.log")
        attempts = [(m, f) for f in files if (m := _ATTEMPT.search(f.path))]
        last = max((int(m.group(1)) for m, _ in attempts), default=None)
        return [LogFile(f.path, by_dir.get(os.path.dirname(f.path))) for m, f in attempts if int(m.group(1)) == last]


def _part_regex(part: str) -> str:
    out, i = [], 0
    for m in _WILD.finditer(part):
        out.append(re.escape(part[i:m.start()]))
        out.append({"%t": r"(?P<rank>\d+)", "%N": r"(?P<host>[^/]+)", "%n": r"\d+", "%s": r"\d+",
                    "*": r"[^/]*", "?": r"[^/]"}[m.group(0)])
        i = m.end()
    return "".join(out) + re.escape(part[i:])


def _split0(output) -> list[tuple[str, str]]:
    """`stat --printf '%n\\t%F\\0'` answers: (path, kind) for each path that exists."""
    pairs = []
    for item in output.stdout.split(b"\0"):
        name, _, kind = item.decode("utf-8", "replace").rpartition("\t")
        if name:
            pairs.append((name, kind))
    return pairs


def _remote_refusal(path: str, kind: str | None, real: str | None, roots: tuple[str, ...]) -> str | None:
    if kind is None:
        return f"{path}: not found"
    if kind != "regular file":
        return f"{path}: is {_REMOTE_KINDS.get(kind, kind)}, not a regular file, not read"
    if not real or not _inside(real, roots):
        return f"{path}: outside TRAINMEDIC_SLURM_LOG_ROOTS (or a symlink out of them), not read"
    return None


def _tail_refusal(path: str, result) -> str | None:
    if isinstance(result, JobError):
        return f"{path}: {result}"
    if isinstance(result, BaseException):
        raise result
    return None if result.ok else f"{path}: cannot be read ({result.stderr or 'tail failed'})"


def _copy_tail(path: str, dest: Path, tail: int, roots: tuple[str, ...]) -> str | None:
    """Copy the last `tail` bytes of a local file; the reason it was refused, or None. The checks
    are made on the open descriptor, which is closed whatever happens."""
    real = os.path.realpath(path)
    if not _inside(real, roots):
        return f"{path}: outside TRAINMEDIC_SLURM_LOG_ROOTS (or a symlink out of them), not read"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{path}: is {_KINDS.get(stat.S_IFMT(info.st_mode), 'not a file')}, not a regular file, not read"
        os.lseek(fd, max(0, info.st_size - tail), os.SEEK_SET)
        left = tail
        with dest.open("wb") as out:
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
    finally:
        os.close(fd)
    return None


def _nccl_host(copy: Path) -> str | None:
    """The host a one-rank file was written on, from NCCL's `host:pid:tid [dev] NCCL` prefix."""
    with copy.open("rb") as f:
        m = _NCCL_HOST.search(f.read(1 << 20))
    return m.group(1).decode("utf-8", "replace") if m else None


def _torchrun_refs(copy: str) -> tuple[list[LogFile], list[str]]:
    """Error files (with the rank and host of their failure-table entry) and log folders named in a log."""
    errors, folders = [], []
    with open(copy, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return errors, folders
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
            for m in _TORCHRUN.finditer(text):
                if m.group(1):
                    folders.append(m.group(1).decode("utf-8", "replace"))
                    continue
                entry = text[max(0, m.start() - 600):m.start()]  # the table lines above error_file
                ranks, hosts = _TABLE_RANK.findall(entry), _TABLE_HOST.findall(entry)
                origin = Origin(int(ranks[-1]) if ranks else None,
                                _short_host(hosts[-1].decode()) if hosts else None)
                errors.append(LogFile(m.group(2).decode("utf-8", "replace"), origin, error_file=True))
    return errors, folders


def _error_file_text(copy: Path) -> None:
    """A torchelastic error.json rewritten as the text it holds: the message and the traceback."""
    raw = copy.read_bytes()[:ERROR_FILE_BYTES]
    try:
        data = json.loads(raw)
    except ValueError:
        return  # not JSON: scanned as it is
    message = data.get("message", data) if isinstance(data, dict) else data
    if isinstance(message, dict):
        info = message.get("extraInfo") or {}
        text = "\n".join(str(x) for x in (message.get("message"), info.get("py_callstack")) if x)
    else:
        text = str(message)
    copy.write_text(text + "\n")
