import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.engine.diagnose import Diagnoser
from bot.kb.load import entry_folders, load
from bot.match import engines

# Every engine available here; CI (x86_64) runs both, so the RE2 fallback stays tested.
ENGINES = ["re2"] + (["hyperscan"] if engines.hyperscan is not None else [])


@pytest.fixture(autouse=True)
def _own_history_file(tmp_path, monkeypatch):
    """Every test (and every CLI it starts) writes incidents to a file of its own."""
    monkeypatch.setenv("TRAINMEDIC_DB", str(tmp_path / "incidents.db"))


@pytest.fixture(scope="session")
def kb():
    return load(entry_folders(""))  # the shipped entries only, whatever the environment says


@pytest.fixture(scope="session", params=ENGINES)
def diagnoser(request, kb):
    return Diagnoser(kb, engine_name=request.param)


@pytest.fixture(scope="session")
def small_chunk_diagnoser(kb):
    """Tiny chunks put line and chunk boundaries everywhere."""
    return Diagnoser(kb, chunk_bytes=257, engine_name="re2")


GOES_ON = "skipping it\n" * 3  # lines after an error line: the log did not end on it


def run_cli(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args], input=stdin, capture_output=True, env=env, timeout=120
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def entry_yaml(entry_id: str, regex: str, role: str = "root", strength: float = 0.9, **extra) -> dict:
    """A minimal valid knowledge entry, for tests that build their own knowledge base."""
    log = extra.pop("positive_log", None)
    data = {
        "id": entry_id, "title": f"Test entry {entry_id}", "category": "code", "tags": ["test"],
        "summary": "s", "mechanism": "m",
        "fingerprints": [{"id": "main", "regex": regex, "role": role, "strength": strength, "meaning": "m"}],
        "symptoms": [{"symptom": "s", "meaning": "m"}], "root_causes": ["r"], "confirm": [{"text": "t"}],
        "fix": {"summary": "fix {value|nothing}", "steps": [{"text": "t", "command": "echo {jobid}"}]},
        "verify": "sacct -j {jobid}", "prevention": ["p"], "affected": ["a"], "related": [], "caused_by": [],
        "references": [{"title": "t", "url": "https://example.org"}],
        "examples": {"positive": [{"name": f"p{i}", "log": log or "x\n"} for i in range(3)],
                     "near_miss": [{"name": f"n{i}", "log": "nothing here\n"} for i in range(2)]},
    }
    data.update(extra)
    return data


def write_entries(folder: Path, *entries: dict) -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    for e in entries:
        (folder / f"{e['id']}.yaml").write_text(yaml.safe_dump(e, sort_keys=False))
    return folder


FAKES = Path(__file__).parent / "fakes"


@dataclass
class FakeSlurm:
    """The fake cluster of tests/fakes: its answers in a JSON file, every command it ran in another."""

    root: Path
    db: Path
    calls: Path

    def add(self, jobid: str, scontrol: list | None = None, sacct: list | None = None) -> None:
        data = json.loads(self.db.read_text())
        if scontrol is not None:
            data["scontrol"][jobid] = scontrol
        if sacct is not None:
            data["sacct"][jobid] = sacct
        self.db.write_text(json.dumps(data))

    def invocations(self) -> list:
        return [json.loads(line) for line in self.calls.read_text().splitlines()] if self.calls.exists() else []


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """Fake Slurm commands first on PATH, and a log root (scratch/) the job logs may be read from."""
    root = tmp_path / "scratch"
    root.mkdir()
    db = tmp_path / "slurm.json"
    db.write_text(json.dumps({"scontrol": {}, "sacct": {}}))
    monkeypatch.setenv("PATH", f"{FAKES}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DB", str(db))
    monkeypatch.setenv("FAKE_SLURM_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_SLURM_CHILD", str(tmp_path / "child.pid"))
    monkeypatch.setenv("TRAINMEDIC_SLURM_LOG_ROOTS", str(root))
    return FakeSlurm(root, db, tmp_path / "calls.jsonl")


@pytest.fixture(scope="module")
def scans():
    """A scan worker pool for the Slack tests of one module (spawned processes: start-up costs)."""
    from bot.sources.workers import ScanPool

    pool = ScanPool(workers=1)
    yield pool
    pool.close()
