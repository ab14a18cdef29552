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


CAUGHT_IMPORT = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/fastkernels/backend.py", line 21, in <module>
    from fastkernels import _C
ImportError: cannot import name '_C' from 'fastkernels' (/opt/conda/lib/python3.11/site-packages/fastkernels/__init__.py)

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/cpp_extension.py", line 2104, in _run_ninja_build
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/workspace/train.py", line 12, in <module>
    from fastkernels.backend import fused_adam
RuntimeError: Error building extension 'fastkernels_cuda'
"""


def test_what_a_handler_raised_is_the_failure_not_the_exception_it_caught(diagnoser):
    # the prebuilt kernel's ImportError was caught (a JIT build is the fallback): the build failed
    d = diagnoser.diagnose_text(CAUGHT_IMPORT)
    assert d.root is not None and d.root.entry.id == "extension-abi-mismatch"
    assert "module-not-found" in [f.entry.id for f in d.findings]


def test_a_caught_failure_stays_the_root_when_its_handler_raised_nothing_known(diagnoser):
    log = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 40, in step
    loss = model(batch).loss
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free.

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/workspace/train.py", line 44, in step
    raise RuntimeError("batch 311 failed after shrinking twice")
RuntimeError: batch 311 failed after shrinking twice
"""
    assert diagnoser.diagnose_text(log).root.entry.id == "cuda-oom"
