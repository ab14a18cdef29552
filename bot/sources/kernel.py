"""The kernel log of every node of a job, for a window around its end, as evidence with its host.

Each node is asked in parallel through TRAINMEDIC_NODE_COMMAND (an ssh to the node, or an srun
step inside a live allocation), itself behind the Slurm command prefix: `journalctl` for the
kernel's messages of every boot in the window (`-k` would mean the current boot only, and a node
that fell over has often rebooted since), `dmesg` where there is no journal. A node that does not
answer within TRAINMEDIC_NODE_TIMEOUT is named as such, never taken as healthy. The lines are
rewritten as syslog lines of the node's Slurm name (`Mar  3 03:12:04 gpu-node-17 kernel: ...`), so
each hit carries its host and a time on the same clock as the ranks' logs.
"""
from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta
from pathlib import Path

from bot.sources.cluster import Cluster, JobError
from bot.sources.joblogs import DISK

MAX_NODES = 512
AFTER_END = timedelta(minutes=5)  # the kernel may report a fault after the job step already ended
LISTED_SILENT = 8  # silent nodes named one by one; the rest are counted
_SLURM_TIME = "%Y-%m-%dT%H:%M:%S"
_ISO_LINE = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)\S*\s(.*)")
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def window(start: str | None, end: str | None, minutes: int) -> tuple[str, str | None]:
    """journalctl's --since and --until for a job: `minutes` before its end (not before it started)
    to a little after; for a job still running, the last `minutes`. Slurm's times are the cluster's
    local time, which is how journalctl on the node reads them too."""
    try:
        ended = datetime.strptime(end or "", _SLURM_TIME)
    except ValueError:
        return f"-{minutes}min", None
    since = ended - timedelta(minutes=minutes)
    try:
        since = max(since, datetime.strptime(start or "", _SLURM_TIME))
    except ValueError:
        pass
    return since.strftime("%Y-%m-%d %H:%M:%S"), (ended + AFTER_END).strftime("%Y-%m-%d %H:%M:%S")


async def node_names(cluster: Cluster, nodelist: str) -> list[str]:
    """`scontrol show hostnames` of a NodeList (gpu-node-[01-08,12])."""
    if not nodelist or nodelist.startswith("None"):
        return []
    answer = await cluster.run(["scontrol", "show", "hostnames", nodelist])
    if not answer.ok:
        raise JobError(answer.reason("scontrol show hostnames"))
    return [n for n in answer.stdout.decode("utf-8", "replace").split() if n]


def _syslog(line: bytes, node: str, journal: bool, since: datetime | None, until: datetime | None) -> bytes | None:
    m = _ISO_LINE.fullmatch(line.rstrip(b"\r\n"))
    if m is None:
        return line  # a continuation line: kept as it is
    y, mo, d, hh, mi, ss = (int(x) for x in m.groups()[:6])
    rest = m.group(7)
    if journal:
        rest = rest.split(b" ", 1)[-1]  # the journal's own host name: the Slurm name replaces it
    else:
        rest = b"kernel: " + rest
        at = datetime(y, mo, d, hh, mi, ss)
        if (since and at < since) or (until and at > until):
            return None
    return f"{_MONTHS[mo - 1]} {d:>2} {hh:02d}:{mi:02d}:{ss:02d} {node} ".encode() + rest + b"\n"


def rewrite(raw: Path, dest: Path, node: str, journal: bool, span: tuple[str, str | None]) -> None:
    """Kernel lines from `journalctl -o short-iso` or `dmesg --time-format=iso` as syslog lines of `node`
    (dmesg has no window of its own: its lines outside the window are dropped here)."""
    since = until = None
    if not journal and span[1]:
        since, until = (datetime.strptime(t, "%Y-%m-%d %H:%M:%S") for t in span)
    with raw.open("rb") as src, dest.open("wb") as out:
        for line in src:
            kept = _syslog(line, node, journal, since, until)
            if kept is not None:
                out.write(kept)
    raw.unlink()


async def _fetch(cluster: Cluster, jobid: str, node: str, span: tuple[str, str | None],
                 folder: Path, i: int) -> tuple[Path | None, str | None]:
    """(the node's kernel log as syslog lines, None) or (None, why it could not be read)."""
    s = cluster.settings
    raw, dest = folder / f"kernel{i}.raw", folder / f"kernel{i}"
    journal = ["journalctl", "-q", "--no-pager", "-o", "short-iso", "_TRANSPORT=kernel", f"--since={span[0]}"]
    journal += [f"--until={span[1]}"] if span[1] else []
    try:
        answer = await cluster.on_node(node, jobid, journal, raw, s.kernel_log_bytes)
        from_journal = answer.ok and (raw.stat().st_size > 0 or not answer.stderr)
        if not from_journal:
            answer = await cluster.on_node(node, jobid, ["dmesg", "--time-format=iso"], raw, s.kernel_log_bytes)
            if not answer.ok:
                return None, answer.reason("journalctl and dmesg")
    except JobError as exc:
        return None, str(exc)
    await asyncio.get_running_loop().run_in_executor(DISK, rewrite, raw, dest, node, from_journal, span)
    return dest, None


async def collect(cluster: Cluster, jobid: str, nodelist: str, start: str | None, end: str | None,
                  folder: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(parts to diagnose, notes): every node's kernel log, read in parallel."""
    s = cluster.settings
    if not s.node_command:
        return [], ["node kernel logs not read: TRAINMEDIC_NODE_COMMAND is not set"]
    try:
        nodes = await node_names(cluster, nodelist)
    except JobError as exc:
        return [], [f"node kernel logs not read: {exc}"]
    notes = []
    if len(nodes) > MAX_NODES:
        notes.append(f"kernel logs of {len(nodes) - MAX_NODES} more node(s) not read (more than {MAX_NODES} nodes)")
        nodes = nodes[:MAX_NODES]
    folder.mkdir(exist_ok=True)
    span = window(start, end, s.kernel_window_min)
    results = await asyncio.gather(*(_fetch(cluster, jobid, n, span, folder, i) for i, n in enumerate(nodes)))
    parts = [(str(dest), f"<kernel log of {n}>") for n, (dest, _) in zip(nodes, results) if dest]
    silent = [(n, why) for n, (_, why) in zip(nodes, results) if why]
    if nodes:
        notes.append(f"kernel logs: {len(parts)} of {len(nodes)} node(s) read"
                     + (f"; {len(silent)} did not answer and are not known to be healthy" if silent else ""))
    notes += [f"{n}: kernel log not read: {why}" for n, why in silent[:LISTED_SILENT]]
    if len(silent) > LISTED_SILENT:
        notes.append(f"... and {len(silent) - LISTED_SILENT} more node(s) whose kernel log was not read")
    return parts, notes
