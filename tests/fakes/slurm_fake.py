"""Shared body of the fake `scontrol` and `sacct`: answers from the JSON file in FAKE_SLURM_DB, in the
formats SchedMD documents, and logs every invocation to FAKE_SLURM_CALLS."""
import json
import os
import subprocess
import sys
import time


def main(tool: str) -> int:
    with open(os.environ["FAKE_SLURM_CALLS"], "a") as calls:
        calls.write(json.dumps([tool, *sys.argv[1:]]) + "\n")
    if os.environ.get("FAKE_SLURM_HANG") == tool:
        # Hang with a child, as ssh or a stuck RPC would: the caller must kill the whole group.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.environ["FAKE_SLURM_CHILD"], "w") as f:
            f.write(str(child.pid))
        time.sleep(300)
    with open(os.environ["FAKE_SLURM_DB"]) as f:
        db = json.load(f)
    jobid = sys.argv[-1] if tool == "scontrol" else sys.argv[sys.argv.index("-j") + 1]
    if tool == "scontrol":
        records = db.get("scontrol", {}).get(jobid)
        if not records:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        for record in records:
            print(" ".join(f"{k}={v}" for k, v in record.items()))
        return 0
    fields = next(a for a in sys.argv if a.startswith("--format=")).split("=", 1)[1].split(",")
    for row in db.get("sacct", {}).get(jobid, []):
        print("|".join(str(row.get(f, "")) for f in fields))
    return 0
