"""The precedence rules of knowledge/README.md between overlapping entries."""
from pathlib import Path

import pytest
import yaml

CASES = yaml.safe_load((Path(__file__).parent / "cases" / "precedence.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:60] for c in CASES])
def test_precedence(diagnoser, case):
    d = diagnoser.diagnose_text(case["log"])
    roles = {f.entry.id: f.role for f in d.findings}
    assert d.root is not None and d.root.entry.id == case["root"], roles
    for entry_id in case.get("collateral", []):
        assert roles.get(entry_id) == "collateral", roles
