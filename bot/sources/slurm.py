"""A Slurm job as a log source: its accounting facts, its logs, and its nodes' kernel logs.

Safety: a job id must have one of Slurm's forms before any process starts; commands run as argv
lists (never a shell) through bot/sources/commands.py, which bounds their time, output and number;
log files are read by bot/sources/joblogs.py under TRAINMEDIC_SLURM_LOG_ROOTS, kernel logs by
bot/sources/kernel.py. With a command prefix (an `ssh` to a login node) the arguments are
shell-quoted, since ssh hands them to a remote shell.
"""
from __future__ import annotations

import asyncio
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bot.config import Settings
from bot.engine.diagnose import Diagnoser, Diagnosis, analyse
from bot.engine.timeline import Origin, attribute
from bot.kb.load import KnowledgeBase
from bot.sources import kernel
from bot.sources.cluster import Cluster, JobError
from bot.sources.files import diagnose_files
from bot.sources.joblogs import JobLogs, LogFile, Read

_JOBID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,8})?(?:\.(?:[0-9]{1,6}|batch|extern))?", re.ASCII)
SACCT_FIELDS = "JobID,JobName,User,State,ExitCode,NodeList,Elapsed,Timelimit,ReqMem,MaxRSS,MaxRSSNode,WorkDir,Start,End"
_KV = re.compile(r"(\w[\w:/]*)=(.*?)(?= \w[\w:/]*=|$)")
MAX_LOGS = 8
MAX_RECORDS = 10_000  # sacct lines (steps) kept for one job

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

    @property
    def span(self) -> tuple[str | None, str | None]:
        """When it started and ended, in Slurm's local time (None while unknown)."""
        return (self.main.get("StartTime") or self.main.get("Start"), self.main.get("EndTime") or self.main.get("End"))


def parse_scontrol(text: str) -> list[dict]:
    """`scontrol show job -o` prints one job record per line as key=value pairs."""
    return [{k: v for k, v in _KV.findall(line.strip())} for line in text.splitlines() if "JobId=" in line]


def parse_sacct(text: str) -> list[dict]:
    names = SACCT_FIELDS.split(",")
    return [dict(zip(names, line.split("|"))) for line in text.splitlines() if line.strip()]


def _lines(answer, name: str, notes: list[str]) -> str:
    """The answer's text, at most MAX_RECORDS lines, none cut in the middle."""
    text = answer.stdout.decode("utf-8", "replace")
    if answer.capped:  # the last line may be cut
        notes.append(f"{name}'s answer passed {len(answer.stdout) >> 20} MB: only its start was read")
        text = text.rsplit("\n", 1)[0]
    lines = text.split("\n", MAX_RECORDS)
    if len(lines) > MAX_RECORDS and lines[MAX_RECORDS].strip():
        notes.append(f"{name} answered more than {MAX_RECORDS} lines: only the first {MAX_RECORDS} were read")
    return "\n".join(lines[:MAX_RECORDS])


async def lookup(cluster: Cluster, jobid: str) -> tuple[Job, list[str]]:
    """(job, notes): scontrol while Slurm still remembers the job, sacct after (asked together);
    accounting steps from sacct. One of them failing or hanging is a note when the other answers."""
    sacct, scontrol = await asyncio.gather(
        cluster.run(["sacct", "-j", jobid, "--parsable2", "--noheader", f"--format={SACCT_FIELDS}"]),
        cluster.run(["scontrol", "show", "job", "-o", jobid]), return_exceptions=True)
    for answer in (sacct, scontrol):
        if isinstance(answer, BaseException) and not isinstance(answer, JobError):
            raise answer
    notes: list[str] = []
    steps = parse_sacct(_lines(sacct, "sacct", notes)) if not isinstance(sacct, JobError) and sacct.ok else []
    records = parse_scontrol(_lines(scontrol, "scontrol", notes)) if not isinstance(scontrol, JobError) else []
    failures = [a for a in (sacct, scontrol) if isinstance(a, JobError)]
    if not isinstance(sacct, JobError) and not sacct.ok:
        failures.append(JobError(sacct.reason("sacct")))  # sacct answers an unknown job with nothing, not an error
    jobs = records or [s for s in steps if "." not in s["JobID"]]
    if not jobs:
        raise failures[0] if failures else JobError(f"Slurm knows no job {jobid} (neither scontrol nor sacct has it)")
    notes += [f"{exc}; the job was read from {'scontrol' if records else 'sacct'}" for exc in failures]
    return Job(jobid, jobs, steps, "scontrol" if records else "sacct"), notes


def expand(pattern: str, record: dict, keep: str = "") -> str:
    """Slurm's filename patterns: %j %A %a %x %u %N %% (and a width like %4a); the letters in `keep`
    (a per-task %N) are left for bot/sources/joblogs.py to match."""
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
        if m.group(2) in keep:
            return m.group(0)
        value = values.get(m.group(2), m.group(0))
        return value.zfill(int(m.group(1))) if m.group(1) and value.isdigit() else value

    return re.sub(r"%%|%(\d*)([jJAaxuN])", sub, pattern)


def log_paths(job: Job) -> list[str]:
    """The job's StdOut/StdErr (patterns expanded, relative to WorkDir), each once."""
    paths: list[str] = []
    for record in job.records[:MAX_LOGS]:
        default = "slurm-%A_%a.out" if record.get("ArrayTaskId") else "slurm-%j.out"
        for key in ("StdOut", "StdErr"):
            raw = record.get(key) or (default if job.source == "sacct" and key == "StdOut" else "")
            if not raw or raw == "/dev/null":
                continue
            path = _under_workdir(expand(raw, record), record)
            if path not in paths:
                paths.append(path)
    return paths


def _under_workdir(path: str, record: dict) -> str:
    workdir = record.get("WorkDir") or ""
    return os.path.join(workdir, path) if workdir else path


def rank_patterns(job: Job, settings: Settings) -> list[str]:
    """The site's per-rank log patterns for this job, relative to its WorkDir."""
    return [_under_workdir(expand(p, job.main, keep="N"), job.main) for p in settings.slurm_rank_logs]


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
    origins: dict[str, Origin]  # name shown -> the rank/host its name gives
    notes: list[str]
    folder: tempfile.TemporaryDirectory


async def _job_logs(logs: JobLogs, job: Job, settings: Settings) -> Read:
    """StdOut/StdErr and the site's per-rank files, then what torchrun's output in them points at."""
    named = await logs.read([LogFile(p) for p in log_paths(job)])
    ranked = await logs.discover(rank_patterns(job, settings))
    linked = await logs.torchrun(Read(named.parts + ranked.parts))
    return Read(named.parts + ranked.parts + linked.parts, {**ranked.origins, **linked.origins},
                named.notes + ranked.notes + linked.notes)


async def collect(settings: Settings, jobid: str, slack_user: str | None = None, channel: str | None = None) -> Collected:
    """Look the job up, check the policy, copy its logs and its nodes' kernel logs; the caller
    diagnoses and cleans up. Commands count against `slack_user`'s limits."""
    if parse_jobid(jobid) is None:
        raise JobError(f"{jobid[:60]!r} is not a Slurm job id (forms: 123, 123_4, 123+1, 123.0, 123.batch)")
    cluster = Cluster(settings, slack_user)
    job, notes = await lookup(cluster, jobid)
    check_policy(settings, job, slack_user, channel)
    folder = tempfile.TemporaryDirectory(prefix="trainmedic-job-")
    try:
        (Path(folder.name) / "logs").mkdir()
        logs, (kernel_parts, kernel_notes) = await asyncio.gather(
            _job_logs(JobLogs(cluster, Path(folder.name) / "logs"), job, settings),
            kernel.collect(cluster, jobid, job.main.get("NodeList") or "", *job.span, Path(folder.name) / "kernel"))
    except BaseException:
        folder.cleanup()
        raise
    accounting = Path(folder.name) / "accounting"
    accounting.write_text(accounting_text(job))
    notes += logs.notes + kernel_notes
    if not logs.parts:
        notes.append("no job log could be read: diagnosed from Slurm accounting" + (" and kernel logs" if kernel_parts else " alone"))
    parts = logs.parts + kernel_parts + [(str(accounting), f"<slurm accounting of {jobid}>")]
    return Collected(job, parts, logs.origins, notes, folder)


@dataclass
class JobDiagnosis:
    jobid: str
    diagnosis: Diagnosis
    notes: list[str]


def reattribute(kb: KnowledgeBase, d: Diagnosis, origins: dict[str, Origin]) -> Diagnosis:
    """The diagnosis again, with each per-rank file's lines given the rank and host its name says."""
    return analyse(kb, attribute(d.scan, origins), d.jobid) if origins else d


def _finish(kb: KnowledgeBase, collected: Collected, d: Diagnosis) -> JobDiagnosis:
    """The diagnosis with the files' origins applied, and the job's advice."""
    d = reattribute(kb, d, collected.origins)
    progress = d.progress or {}
    notes = advice(collected.job, progress.get("checkpoint"), progress.get("iteration")) + collected.notes
    return JobDiagnosis(collected.job.jobid, d, notes)


def diagnose_job_sync(diagnoser: Diagnoser, settings: Settings, jobid: str) -> JobDiagnosis:
    """The command line's `trainmedic diagnose --job ID`: the same collection, on an event loop of its own."""
    collected = asyncio.run(collect(settings, jobid))
    try:
        d = diagnose_files(diagnoser, collected.parts, jobid)
    finally:
        collected.folder.cleanup()
    return _finish(diagnoser.kb, collected, d)


async def diagnose_job(deps, jobid: str, slack_user: str | None = None, channel: str | None = None) -> JobDiagnosis:
    """`/diagnose <jobid>`: the cluster is asked without blocking the event loop, the logs are
    scanned in the worker pool."""
    collected = await collect(deps.settings, jobid, slack_user, channel)
    try:
        d = await deps.scans.files(collected.parts, jobid=jobid, max_bytes=deps.settings.max_log_bytes)
    finally:
        collected.folder.cleanup()
    return _finish(deps.kb, collected, d)
