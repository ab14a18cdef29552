"""`trainmedic serve` killed and stopped under load, over HTTP and in Socket Mode (short runs;
benchmarks/delivery.py runs them at full length and prints the figures)."""
import asyncio
import sys

import pytest
from faults import crash_run, sigterm_run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the worker processes")


@pytest.mark.parametrize("mode, kills", [("http", 3), ("socket", 2)])
def test_sigkill_under_load_loses_nothing_doubles_nothing_and_leaves_no_worker(tmp_path, mode, kills):
    figures = asyncio.run(crash_run(tmp_path, kills, mode=mode, seed=15))
    assert figures.events > 0 and figures.exit_codes[:-1] == [-9] * kills
    assert figures.missing == [] and figures.doubled == [], figures.lines()
    assert figures.unstored == 0, "a reply Slack has must be stored, or its buttons do nothing"
    assert figures.integrity == "ok" and figures.orphans == 0
    assert figures.exit_codes[-1] == 0


@pytest.mark.parametrize("mode", ["http", "socket"])
def test_sigterm_finishes_within_the_grace_and_the_rest_is_answered_after_a_restart(tmp_path, mode):
    out = asyncio.run(sigterm_run(tmp_path, mode=mode, grace=2))
    assert out["acked"] == 6 and out["exit_code"] == 0 and out["stop_s"] < 2 + 3
    assert out["after_signal"] != 200  # 503 over HTTP; no ack over a closed socket: Slack sends it again
    assert out["replies_before_restart"] == 0  # all six were still waiting on Slack at the signal
    assert out["missing"] == [] and out["doubled"] == []
    assert out["second_exit_code"] == 0
