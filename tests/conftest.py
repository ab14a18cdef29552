import subprocess
import sys
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
