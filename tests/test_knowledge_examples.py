"""Every entry's examples are its tests: positives diagnose as the entry (top-1), near-misses stay
silent; the healthy corpus raises nothing. Run under every engine available here."""
import pytest

import knowledge as shipped
from bot.kb.load import entry_folders, load
from bot.kbcheck import benign_files
from bot.sources.files import diagnose_paths

KB = load(entry_folders(""))
POSITIVES = [
    pytest.param(e.id, ex, id=f"{e.id}:{ex['name'][:40]}",
                 marks=[pytest.mark.xfail(reason=ex["xfail"], strict=True)] if ex.get("xfail") else [])
    for e in KB.entries.values()
    for ex in e.data["examples"]["positive"]
]
NEAR_MISSES = [
    pytest.param(e.id, ex, id=f"{e.id}:{ex['name'][:40]}",
                 marks=[pytest.mark.xfail(reason=ex["xfail"], strict=True)] if ex.get("xfail") else [])
    for e in KB.entries.values()
    for ex in e.data["examples"]["near_miss"]
]


@pytest.mark.parametrize("entry_id, example", POSITIVES)
def test_positive_example_diagnoses_as_its_entry(diagnoser, entry_id, example):
    d = diagnoser.diagnose_text(example["log"])
    assert d.root is not None, "nothing diagnosed"
    assert d.root.entry.id == entry_id


@pytest.mark.parametrize("entry_id, example", NEAR_MISSES)
def test_near_miss_does_not_raise_its_entry(diagnoser, entry_id, example):
    d = diagnoser.diagnose_text(example["log"])
    assert entry_id not in [f.entry.id for f in d.findings]


@pytest.mark.parametrize("path", benign_files(), ids=lambda p: p.name)
def test_healthy_log_raises_nothing(diagnoser, path):
    d = diagnose_paths(diagnoser, [str(path)])
    assert [(f.entry.id, f.first.line, f.first.text) for f in d.findings] == []


def test_the_corpus_is_big_enough():
    assert len(KB.entries) >= 60
    assert len(benign_files(shipped.BENIGN)) >= 20
    for entry in KB.entries.values():
        assert len(entry.data["examples"]["positive"]) >= 3, entry.id
        assert len(entry.data["examples"]["near_miss"]) >= 2, entry.id
