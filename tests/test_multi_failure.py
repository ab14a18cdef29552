"""The real cause comes before a louder wrapper or cascade: the root must still be the cause."""
from pathlib import Path

import pytest
import yaml

CASES = yaml.safe_load((Path(__file__).parent / "cases" / "multi_failure.yaml").read_text())


def test_there_are_at_least_ten_cases():
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:60] for c in CASES])
def test_root_collateral_and_origin(diagnoser, case):
    d = diagnoser.diagnose_text(case["log"])
    roles = {f.entry.id: f.role for f in d.findings}
    assert d.root is not None and d.root.entry.id == case["root"], roles
    assert not d.cascade_only
    for entry_id in case.get("collateral", []):
        assert roles.get(entry_id) == "collateral", roles
    for key, value in case.get("initiating", {}).items():
        assert d.initiating[key] == value
