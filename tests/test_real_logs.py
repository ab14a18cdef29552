"""Accuracy on real published job logs (kept outside the repository, in ../shared/real-logs).

Each case has a labelled root and the ids that are also acceptable; the test prints the per-case
result, top-1/top-3, false alarms and how often each confidence word was right, and fails if
top-1 accuracy drops below the floor we have reached.
"""
import os
from pathlib import Path

import pytest

FOLDER = Path(os.environ.get("TRAINMEDIC_REAL_LOGS", Path(__file__).resolve().parents[2] / "shared" / "real-logs"))
TOP1_FLOOR = 0.85


@pytest.mark.skipif(not (FOLDER / "labels.yaml").is_file(), reason=f"no labelled real logs at {FOLDER}")
def test_real_log_accuracy(kb, capsys):
    from bot.engine.diagnose import Diagnoser
    from bot.kbcheck import format_score, score

    report = score(Diagnoser(kb), FOLDER)
    with capsys.disabled():
        print("\nreal logs:\n" + format_score(report))
    right, total = report.share("right")
    assert right / total >= TOP1_FLOOR
    assert not report.false_alarms
