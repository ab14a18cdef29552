"""Shared body of the fake `scontrol`, `sacct`, `journalctl`, `dmesg` and `srun`: answers from the JSON
file in FAKE_SLURM_DB, in the formats SchedMD and systemd document, and logs every invocation to
FAKE_SLURM_CALLS. A node's commands know which node they run on from FAKE_NODE (set by the fake
`fake-node-ssh` or `srun`).

Faults, as a broken cluster shows them:
  FAKE_SLURM_HANG=tool     the tool hangs with a child in its own process group
  FAKE_SLURM_SETSID=tool   the tool starts a grandchild in a new session that keeps stdout open, then hangs
  FAKE_SACCT_FLOOD=bytes   sacct answers with that many bytes (its last act is to touch FAKE_SLURM_CHILD.done)
  db["hang_nodes"], db["fail_nodes"], db["no_journal"]   per-node journalctl faults
"""
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta


def _log(tool: str) -> None:
    with open(os.environ["FAKE_SLURM_CALLS"], "a") as calls:
        calls.write(json.dumps([tool, *sys.argv[1:]] + ([f"@{os.environ['FAKE_NODE']}"] if "FAKE_NODE" in os.environ else [])) + "\n")


def _hang(tool: str) -> None:
    if os.environ.get("FAKE_SLURM_HANG") == tool:
        # Hang with a child, as ssh or a stuck RPC would: the caller must kill the whole group.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.environ["FAKE_SLURM_CHILD"], "w") as f:
            f.write(str(child.pid))
        time.sleep(300)
    if os.environ.get("FAKE_SLURM_SETSID") == tool:
        # A grandchild that leaves the session and keeps our stdout open: killpg cannot reach it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        with open(os.environ["FAKE_SLURM_CHILD"], "w") as f:
            f.write(str(child.pid))
        time.sleep(300)


def expand_hostlist(text: str) -> list[str]:
    """gpu-node-[01-03,07],login1 -> gpu-node-01 gpu-node-02 gpu-node-03 gpu-node-07 login1."""
    out = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            out.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{n:0{len(lo)}d}")
    return out


def _db() -> dict:
    with open(os.environ["FAKE_SLURM_DB"]) as f:
        return json.load(f)


def scontrol() -> int:
    if sys.argv[1:3] == ["show", "hostnames"]:
        print("\n".join(expand_hostlist(sys.argv[3])))
        return 0
    records = _db().get("scontrol", {}).get(sys.argv[-1])
    if not records:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    for record in records:
        print(" ".join(f"{k}={v}" for k, v in record.items()))
    return 0


def sacct() -> int:
    flood = int(os.environ.get("FAKE_SACCT_FLOOD") or 0)
    if flood:
        line = b"1|x|alice|RUNNING|0:0|n1|00:01|01:00|1G|1K|n1|/tmp||\n" * 16384
        for _ in range(flood // len(line) + 1):
            sys.stdout.buffer.write(line)
        sys.stdout.flush()
        open(os.environ["FAKE_SLURM_CHILD"] + ".done", "w").close()
        return 0
    jobid = sys.argv[sys.argv.index("-j") + 1]
    fields = next(a for a in sys.argv if a.startswith("--format=")).split("=", 1)[1].split(",")
    for row in _db().get("sacct", {}).get(jobid, []):
        print("|".join(str(row.get(f, "")) for f in fields))
    return 0


def _window(args: list[str]) -> tuple[datetime | None, datetime | None]:
    """--since/--until as journalctl reads them: a local time, or minutes before now (FAKE_NOW if set)."""
    def at(name):
        value = next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)
        if value and (m := re.fullmatch(r"-(\d+)min", value)):
            now = datetime.strptime(os.environ["FAKE_NOW"], "%Y-%m-%dT%H:%M:%S") if "FAKE_NOW" in os.environ else datetime.now()
            return now - timedelta(minutes=int(m.group(1)))
        return datetime.strptime(value, "%Y-%m-%d %H:%M:%S") if value else None
    return at("since"), at("until")


def journalctl() -> int:
    db, node = _db(), os.environ.get("FAKE_NODE", "")
    if node in db.get("hang_nodes", []):
        time.sleep(300)
    if node in db.get("fail_nodes", []):
        print("Failed to open journal: Permission denied", file=sys.stderr)
        return 1
    if node in db.get("no_journal", []):
        print("sh: 1: journalctl: not found", file=sys.stderr)
        return 127
    since, until = _window(sys.argv[1:])
    for line in db.get("kernel", {}).get(node, []):  # "2024-03-03T03:12:04+0000 host kernel: ..."
        at = datetime.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")
        if (since is None or at >= since) and (until is None or at <= until):
            print(line)
    return 0


def dmesg() -> int:
    db, node = _db(), os.environ.get("FAKE_NODE", "")
    if node in db.get("fail_nodes", []):
        print("dmesg: read kernel buffer failed: Operation not permitted", file=sys.stderr)
        return 1
    for line in db.get("kernel", {}).get(node, []):  # dmesg --time-format=iso has no host field
        stamp, _, rest = line.partition(" ")
        print(f"{stamp[:19]},000000+00:00 {rest.split(' kernel: ', 1)[-1]}")
    return 0


def srun() -> int:
    """`srun --jobid=J --overlap --nodelist=N -N1 -n1 CMD...`: CMD runs on node N, as srun execs it."""
    args = sys.argv[1:]
    node = next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist="))
    command = args[next(i for i, a in enumerate(args) if not a.startswith("-")):]
    os.execvpe(command[0], command, {**os.environ, "FAKE_NODE": node})


def main(tool: str) -> int:
    _log(tool)
    _hang(tool)
    return {"scontrol": scontrol, "sacct": sacct, "journalctl": journalctl, "dmesg": dmesg, "srun": srun}[tool]()
