"""Accuracy on real published job logs (kept outside the repository, in ../shared/real-logs).

Each case has a labelled root and the ids that are also acceptable; the test prints the
per-case result and fails if top-1 accuracy drops below the floor we have reached.
"""
import os
from pathlib import Path

import pytest
import yaml

FOLDER = Path(os.environ.get("TRAINMEDIC_REAL_LOGS", Path(__file__).resolve().parents[2] / "shared" / "real-logs"))
TOP1_FLOOR = 0.85


def _cases():
    labels = FOLDER / "labels.yaml"
    if not labels.is_file():
        return []
    return yaml.safe_load(labels.read_text())


def _accepted(case) -> set:
    ok = {case["root"], *case.get("also_ok", [])}
    return {None if x == "none" else x for x in ok}


@pytest.mark.skipif(not _cases(), reason=f"no labelled real logs at {FOLDER}")
def test_real_log_accuracy(kb, capsys):
    from bot.engine.diagnose import Diagnoser
    from bot.sources.files import diagnose_paths

    diagnoser = Diagnoser(kb)
    right = top3 = 0
    rows = []
    cases = _cases()
    for case in cases:
        d = diagnose_paths(diagnoser, [str(FOLDER / case["case"])])
        got = d.root.entry.id if d.root else None
        ranked = [f.entry.id for f in d.findings[:3]] or [None]
        ok = got in _accepted(case)
        right += ok
        top3 += bool(_accepted(case) & set(ranked))
        rows.append(f"{'ok  ' if ok else 'MISS'} {case['case']}: got {got}, want {case['root']}")
    with capsys.disabled():
        print("\nreal logs:\n  " + "\n  ".join(rows))
        print(f"top-1 {right}/{len(cases)}, top-3 {top3}/{len(cases)}")
    assert right / len(cases) >= TOP1_FLOOR
