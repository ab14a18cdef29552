"""A Slurm job as a log source: its accounting facts and the tails of its log files.

Safety: a job id must have one of Slurm's forms before any process starts; commands run as argv
lists (never a shell) in their own process group, killed whole at the timeout; log files are read
only under TRAINMEDIC_SLURM_LOG_ROOTS, as regular files whose real path (symlinks resolved) stays
inside a root, and only their last TRAINMEDIC_SLURM_TAIL_MB. With a command prefix (an `ssh` to a
login node) the arguments are shell-quoted, since ssh hands them to a remote shell.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bot.config import Settings
from bot.engine.diagnose import Diagnoser, Diagnosis
from bot.sources.files import diagnose_files

_JOBID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,8})?(?:\.(?:[0-9]{1,6}|batch|extern))?", re.ASCII)
SACCT_FIELDS = "JobID,JobName,User,State,ExitCode,NodeList,Elapsed,Timelimit,ReqMem,MaxRSS,MaxRSSNode,WorkDir"
_KV = re.compile(r"(\w[\w:/]*)=(.*?)(?= \w[\w:/]*=|$)")
MAX_LOGS = 8


class JobError(Exception):
    """The job cannot be diagnosed; the message says why in one line."""


def parse_jobid(text: str) -> str | None:
    """The job id if `text` is one of Slurm's forms (123, 123_4, 123+1, 123.0, 123.batch), else None."""
    return text if len(text) <= 40 and _JOBID.fullmatch(text) else None


@dataclass
class Job:
    jobid: str
    records: list[dict]  # scontrol records (one per array task / het component), or sacct job lines
    steps: list[dict] = field(default_factory=list)  # sacct lines, steps included
    source: str = "scontrol"

    @property
    def main(self) -> dict:
        return self.records[0]

    @property
    def user(self) -> str | None:
        user = self.main.get("UserId") or self.main.get("User") or ""
        return user.split("(")[0] or None


def run(settings: Settings, argv: list[str]) -> str | None:
    """stdout of a Slurm command, None when it fails; JobError when it hangs past the timeout."""
    full = list(settings.slurm_prefix) + ([shlex.quote(a) for a in argv] if settings.slurm_prefix else argv)
    try:
        proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        raise JobError(f"cannot run {argv[0]}: {exc.strerror or exc} (is Slurm on PATH?)") from None
    try:
        out, _ = proc.communicate(timeout=settings.slurm_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: an ssh and what it started too
        proc.communicate()
        raise JobError(f"{argv[0]} did not answer within {settings.slurm_timeout:g} s; Slurm may be overloaded") from None
    return out.decode("utf-8", "replace") if proc.returncode == 0 else None


def parse_scontrol(text: str) -> list[dict]:
    """`scontrol show job -o` prints one job record per line as key=value pairs."""
    return [{k: v for k, v in _KV.findall(line.strip())} for line in text.splitlines() if "JobId=" in line]


def parse_sacct(text: str) -> list[dict]:
    names = SACCT_FIELDS.split(",")
    return [dict(zip(names, line.split("|"))) for line in text.splitlines() if line.strip()]


def lookup(settings: Settings, jobid: str) -> Job:
    """scontrol while Slurm still remembers the job, sacct after; accounting steps from sacct."""
    sacct_out = run(settings, ["sacct", "-j", jobid, "--parsable2", "--noheader", f"--format={SACCT_FIELDS}"])
    steps = parse_sacct(sacct_out or "")
    records = parse_scontrol(run(settings, ["scontrol", "show", "job", "-o", jobid]) or "")
    if records:
        return Job(jobid, records, steps, "scontrol")
    jobs = [s for s in steps if "." not in s["JobID"]]
    if not jobs:
        raise JobError(f"Slurm knows no job {jobid} (neither scontrol nor sacct has it)")
    return Job(jobid, jobs, steps, "sacct")


def expand(pattern: str, record: dict) -> str:
    """Slurm's filename patterns: %j %A %a %x %u %N %% (and a width like %4a)."""
    jobid = record.get("JobId") or record.get("JobID", "").split(".")[0]
    values = {
        "j": jobid.split("_")[0], "J": jobid, "A": record.get("ArrayJobId") or jobid.split("_")[0],
        "a": record.get("ArrayTaskId") or (jobid.split("_")[1] if "_" in jobid else "4294967294"),
        "x": record.get("JobName", ""), "u": (record.get("UserId") or record.get("User") or "").split("(")[0],
        "N": (record.get("BatchHost") or record.get("NodeList") or "").split(",")[0],
    }

    def sub(m: re.Match) -> str:
        if m.group(0) == "%%":
            return "%"
        value = values.get(m.group(2), m.group(0))
        return value.zfill(int(m.group(1))) if m.group(1) and value.isdigit() else value

    return re.sub(r"%%|%(\d*)([jJAaxuN])", sub, pattern)


def log_paths(job: Job) -> list[str]:
    """The job's StdOut/StdErr (patterns expanded, relative to WorkDir), each once."""
    paths: list[str] = []
    for record in job.records[:MAX_LOGS]:
        workdir = record.get("WorkDir") or ""
        default = "slurm-%A_%a.out" if record.get("ArrayTaskId") else "slurm-%j.out"
        for key in ("StdOut", "StdErr"):
            raw = record.get(key) or (default if job.source == "sacct" and key == "StdOut" else "")
            if not raw or raw == "/dev/null":
                continue
            path = os.path.join(workdir, expand(raw, record)) if workdir else expand(raw, record)
            if path not in paths:
                paths.append(path)
    return paths


def _inside(path: str, roots: tuple[Path, ...]) -> bool:
    return any(path == str(r) or path.startswith(str(r).rstrip("/") + "/") for r in roots)


def read_tail(settings: Settings, path: str, dest: Path) -> str | None:
    """Copy the end of a job log into dest; the reason it was refused, or None when it was read."""
    if not settings.slurm_log_roots:
        return "TRAINMEDIC_SLURM_LOG_ROOTS is not set, so no job log may be read"
    if settings.slurm_prefix:  # on the login node: resolve there, then read the tail there
        resolved = (run(settings, ["realpath", "-e", "--", path]) or "").strip()
        if not resolved:
            return f"{path}: not found"
        if not _inside(resolved, settings.slurm_log_roots):
            return f"{path}: outside TRAINMEDIC_SLURM_LOG_ROOTS, not read"
        data = run(settings, ["tail", "-c", str(settings.slurm_tail_bytes), "--", resolved])
        if data is None:
            return f"{path}: cannot be read"
        dest.write_text(data)
        return None
    roots = tuple(Path(os.path.realpath(r)) for r in settings.slurm_log_roots)
    real = os.path.realpath(path)
    if not _inside(real, roots):
        return f"{path}: outside TRAINMEDIC_SLURM_LOG_ROOTS (or a symlink out of them), not read"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{path}: not a regular file, not read"
        size = info.st_size
        f.seek(max(0, size - settings.slurm_tail_bytes))
        with dest.open("wb") as out:
            while chunk := f.read(1 << 20):
                out.write(chunk)
    return None


def accounting_text(job: Job) -> str:
    """The accounting facts as log lines, so fingerprints (JobState=OUT_OF_MEMORY ...) see them too."""
    lines = []
    for r in job.records:
        keys = ("JobId", "JobName", "UserId", "JobState", "Reason", "ExitCode", "NodeList", "RunTime", "TimeLimit")
        if job.source == "sacct":
            r = {"JobId": r["JobID"], "JobName": r["JobName"], "UserId": r["User"], "JobState": r["State"],
                 "ExitCode": r["ExitCode"], "NodeList": r["NodeList"], "RunTime": r["Elapsed"], "TimeLimit": r["Timelimit"]}
        lines.append("slurm accounting: " + " ".join(f"{k}={r[k]}" for k in keys if r.get(k)))
    for s in job.steps:
        if "." in s["JobID"]:
            lines.append(f"slurm accounting: step {s['JobID']} State={s['State']} ExitCode={s['ExitCode']} "
                         f"ReqMem={s['ReqMem'] or '-'} MaxRSS={s['MaxRSS'] or '-'} MaxRSSNode={s['MaxRSSNode'] or '-'}")
    return "\n".join(lines) + "\n"


_GIB_PER_UNIT = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "": 1 / 1024**2}


def gigabytes(value: str) -> float | None:
    """sacct sizes (71234560K, 64G, 4000Mn, 8Gc; a bare number is KiB) in GiB; None when empty."""
    m = re.fullmatch(r"([\d.]+)([KMGT]?)[nc]?", (value or "").strip())
    return float(m.group(1)) * _GIB_PER_UNIT[m.group(2)] if m else None


def _seconds(value: str) -> int | None:
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", (value or "").strip())
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def _clock(seconds: int) -> str:
    d, rest = divmod(seconds, 86400)
    return (f"{d}-" if d else "") + f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def advice(job: Job, checkpoint: str | None = None, iteration: str | int | None = None) -> list[str]:
    """Facts with numbers and what to resubmit with, as Princeton's jobstats words them."""
    out = []
    state = (job.main.get("JobState") or job.main.get("State") or "").split()[0]
    nodes = job.main.get("NodeList") or ""
    elapsed = job.main.get("RunTime") or job.main.get("Elapsed") or ""
    limit = job.main.get("TimeLimit") or job.main.get("Timelimit") or ""
    out.append(f"Job {job.jobid}: {state or 'unknown state'}, exit {job.main.get('ExitCode', '?')}, "
               f"ran {elapsed or '?'} of {limit or '?'}" + (f" on {nodes}" if nodes else ""))
    peaks = [(gigabytes(s.get("MaxRSS", "")), gigabytes(s.get("ReqMem", "")), s["JobID"]) for s in job.steps]
    peaks = [p for p in peaks if p[0] is not None]
    req = next((r for _, r, _ in peaks if r), None) or gigabytes(job.main.get("MinMemoryNode", "") or "")
    if peaks:
        peak, _, step = max(peaks)
        if req and (state == "OUT_OF_MEMORY" or peak >= 0.9 * req):
            # MaxRSS is sampled (30 s by default) and misses the spike that crossed the limit.
            want = max(peak * 1.2, req * 1.25 if state == "OUT_OF_MEMORY" else 0)
            out.append(f"MaxRSS {peak:.1f}G (step {step}) vs ReqMem {req:g}G -> resubmit with --mem={math.ceil(want / 8) * 8}G")
    if state == "TIMEOUT" and _seconds(limit):
        longer = _clock(math.ceil(_seconds(limit) * 1.5 / 3600) * 3600)
        where = f" (last checkpoint {checkpoint})" if checkpoint else ""
        where += f", last iteration {iteration}" if iteration is not None else ""
        out.append(f"ran {elapsed} of a {limit} limit -> --time={longer}, or checkpoint more often and resume{where}")
    if state == "NODE_FAIL" and nodes:
        out.append(f"node failure on {nodes} -> resubmit with --exclude={nodes}; check it with scontrol show node {nodes}")
    if state == "PREEMPTED":
        out.append("preempted -> submit with --requeue and resume from the last checkpoint")
    if state == "CANCELLED":
        by = job.main.get("JobState", "").partition(" by ")[2] or (job.main.get("State", "").partition(" by ")[2])
        out.append(f"cancelled{' by uid ' + by if by else ''} (scancel) - not a failure of the job itself")
    return out


def check_policy(settings: Settings, job: Job, slack_user: str | None, channel: str | None) -> None:
    """Who may diagnose which job (TRAINMEDIC_JOB_POLICY); JobError when this user may not."""
    if settings.allowed_channels and channel not in settings.allowed_channels:
        raise JobError("/diagnose <jobid> is not enabled in this channel")
    if settings.job_policy == "owner" and slack_user is not None:
        cluster_user = settings.user_map.get(slack_user)
        if cluster_user is None or cluster_user != job.user:
            raise JobError(f"only the owner of job {job.jobid} may diagnose it (TRAINMEDIC_JOB_POLICY=owner)")


@dataclass
class Collected:
    job: Job
    parts: list[tuple[str, str]]  # (path on disk, name shown)
    notes: list[str]
    folder: tempfile.TemporaryDirectory


def collect(settings: Settings, jobid: str, slack_user: str | None = None, channel: str | None = None) -> Collected:
    """Look the job up, check the policy, copy the tails of its logs; the caller diagnoses and cleans up."""
    if parse_jobid(jobid) is None:
        raise JobError(f"{jobid[:60]!r} is not a Slurm job id (forms: 123, 123_4, 123+1, 123.0, 123.batch)")
    job = lookup(settings, jobid)
    check_policy(settings, job, slack_user, channel)
    folder = tempfile.TemporaryDirectory(prefix="trainmedic-job-")
    parts, notes = [], []
    for i, path in enumerate(log_paths(job)):
        dest = Path(folder.name) / f"log{i}"
        refused = read_tail(settings, path, dest)
        if refused:
            notes.append(refused)
        else:
            parts.append((str(dest), path))
    accounting = Path(folder.name) / "accounting"
    accounting.write_text(accounting_text(job))
    parts.append((str(accounting), f"<slurm accounting of {jobid}>"))
    if len(parts) == 1:
        notes.append("no job log could be read: diagnosed from Slurm accounting alone")
    return Collected(job, parts, notes, folder)


@dataclass
class JobDiagnosis:
    jobid: str
    diagnosis: Diagnosis
    notes: list[str]


def _finish(collected: Collected, d: Diagnosis) -> JobDiagnosis:
    progress = d.progress or {}
    notes = advice(collected.job, progress.get("checkpoint"), progress.get("iteration")) + collected.notes
    return JobDiagnosis(collected.job.jobid, d, notes)


def diagnose_job_sync(diagnoser: Diagnoser, settings: Settings, jobid: str) -> JobDiagnosis:
    """The command line's `trainmedic diagnose --job ID`."""
    collected = collect(settings, jobid)
    try:
        d = diagnose_files(diagnoser, collected.parts, jobid)
    finally:
        collected.folder.cleanup()
    return _finish(collected, d)


async def diagnose_job(deps, jobid: str, slack_user: str | None = None, channel: str | None = None) -> JobDiagnosis:
    """`/diagnose <jobid>`: Slurm is asked from a thread, the logs are scanned in the worker pool."""
    import asyncio

    collected = await asyncio.to_thread(collect, deps.settings, jobid, slack_user, channel)
    try:
        d = await deps.scans.files(collected.parts, jobid=jobid, max_bytes=deps.settings.max_log_bytes)
    finally:
        collected.folder.cleanup()
    return _finish(collected, d)
