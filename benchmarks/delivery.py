"""Delivery under faults at full length: `trainmedic serve` killed with SIGKILL at random moments
under load (HTTP and Socket Mode), stopped with SIGTERM while work waits on Slack, and serving
through a Slack outage (the Web API down, then answering 503, then 429).

    .venv/bin/python benchmarks/delivery.py [--kills 30] [--rate 10] [--seed 1] [--outage 30]

Prints, per mode: events sent, sends Slack would have retried, replies, missing, doubled, replies
Slack has that the history lacks, orphaned worker processes, integrity_check, restart times.
Exit status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from faults import crash_run, outage_run, sigterm_run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--rate", type=float, default=10.0, help="events a second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="http,socket")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds down, then as many answering 503/429")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="trainmedic-delivery-") as tmp:
        for mode in args.modes.split(","):
            started = time.monotonic()
            figures = asyncio.run(crash_run(Path(tmp), args.kills, mode=mode, rate=args.rate, seed=args.seed))
            print(f"SIGKILL x{args.kills} ({time.monotonic() - started:.0f} s)")
            print("\n".join("  " + line for line in figures.lines()))
            ok &= figures.ok
            out = asyncio.run(sigterm_run(Path(tmp), mode=mode))
            print(f"SIGTERM ({mode}): {out['acked']} acked in flight, exit {out['exit_code']} after "
                  f"{out['stop_s']:.2f} s, request after the signal got {out['after_signal'] or 'no ack'}, "
                  f"missing {len(out['missing'])}, doubled {len(out['doubled'])} after the restart")
            ok &= out["exit_code"] == 0 and not out["missing"] and not out["doubled"]
            for status in (503, 429):
                out = asyncio.run(outage_run(Path(tmp), mode=mode, down_s=args.outage if mode == "http" else 0,
                                             status_s=args.outage, status=status))
                print(f"outage ({mode}): {out['events']} events while Slack was {'down %.0f s, then ' % out['down_s'] if out['down_s'] else ''}"
                      f"answering {status} for {out['status_s']:.0f} s; {out['posted_during']} replies during it, all "
                      f"{out['events'] - len(out['missing'])} after {out['all_replies_after_s']:.1f} s, "
                      f"doubled {len(out['doubled'])}, false failure notices {out['false_failures']}")
                ok &= not out["missing"] and not out["doubled"] and not out["false_failures"]
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
