"""The loader refuses a bad entry with a message that names the file, the field and the remedy."""
import pytest
from conftest import entry_yaml, write_entries

from bot.kb.load import KnowledgeError, entry_folders, load


def _load(folder):
    return load([folder])


def test_a_valid_folder_loads(tmp_path):
    kb = _load(write_entries(tmp_path, entry_yaml("alpha", r"alpha failed")))
    assert list(kb.entries) == ["alpha"]
    assert kb.fingerprints[0].entry == "alpha"


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda e: e.update(colour="red"), ["field (top level)", "unknown field", "colour", "remove or rename"]),
        (lambda e: e.pop("verify"), ["'verify' is a required property", "add it"]),
        (lambda e: e.update(related=["no-such-entry"]), ["field related[0]", "no-such-entry", "fix the id"]),
        (lambda e: e.update(caused_by=["ghost"]), ["field caused_by[0]", "ghost"]),
        (lambda e: e["fingerprints"][0].update(regex=r"(?<=x)oom"), ["fingerprints[0].regex", "RE2 cannot compile"]),
        (lambda e: e["fingerprints"][0].update(regex=r"(a)\1"), ["fingerprints[0].regex", "RE2 cannot compile"]),
        (lambda e: e["fingerprints"][0].update(regex=r"x*"), ["fingerprints[0].regex", "empty string"]),
        (lambda e: e["fingerprints"][0].update(regex=r"段错误 *[(（]core"), ["fingerprints[0].regex", "'（'", "alternative"]),
        (lambda e: e["fingerprints"][0].update(role="maybe"), ["fingerprints[0].role", "maybe"]),
        (lambda e: e["fingerprints"][0].update(role="cascade", condition=True), ["fingerprints[0].condition", "only a root"]),
        (lambda e: e["fingerprints"][0].update(role="confirm", frame=True), ["fingerprints[0].frame", "only a root"]),
        (lambda e: e["fingerprints"].append(dict(e["fingerprints"][0])), ["fingerprints[1].id", "duplicate"]),
        (lambda e: e.update(detectors=[{"id": "climb", "kind": "loss-spike", "role": "root", "strength": 0.3,
                                        "meaning": "a loss that climbs", "types": ["KeyError"]}]),
         ["detectors[0].types", "only a last-exception detector"]),
        (lambda e: e["examples"].update(positive=[]), ["examples.positive", "too short"]),
    ],
)
def test_bad_entries_are_refused_with_a_precise_message(tmp_path, mutate, words):
    entry = entry_yaml("alpha", r"alpha failed")
    mutate(entry)
    write_entries(tmp_path, entry)
    with pytest.raises(KnowledgeError) as err:
        _load(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "alpha.yaml") in message
    for word in words:
        assert word in message


def test_id_must_match_the_file_name(tmp_path):
    write_entries(tmp_path, entry_yaml("alpha", "a+b"))
    (tmp_path / "alpha.yaml").rename(tmp_path / "beta.yaml")
    with pytest.raises(KnowledgeError, match="differs from the file name"):
        _load(tmp_path)


def test_yml_files_are_not_silently_ignored(tmp_path):
    write_entries(tmp_path, entry_yaml("alpha", "a+b"))
    (tmp_path / "alpha.yaml").rename(tmp_path / "alpha.yml")
    with pytest.raises(KnowledgeError, match="rename it to alpha.yaml"):
        _load(tmp_path)


def test_broken_yaml_names_the_file(tmp_path):
    (tmp_path / "alpha.yaml").write_text("id: [unclosed\n")
    with pytest.raises(KnowledgeError, match="cannot read it as YAML"):
        _load(tmp_path)


def test_site_folder_overrides_a_shipped_entry_and_adds_new_ones(tmp_path, monkeypatch):
    site = write_entries(
        tmp_path,
        entry_yaml("cuda-oom", r"SITE SPECIFIC OOM WORDING", title="Our cluster's OOM"),
        entry_yaml("site-only", r"site only failure"),
    )
    monkeypatch.setenv("TRAINMEDIC_KB_PATH", str(site))
    kb = load()
    assert kb.get("cuda-oom").title == "Our cluster's OOM"
    assert kb.get("site-only").source == site / "site-only.yaml"
    assert "slurm-cgroup-oom" in kb.entries  # the shipped ones stay


def test_missing_site_folder_is_reported(tmp_path):
    with pytest.raises(KnowledgeError, match="TRAINMEDIC_KB_PATH"):
        load(entry_folders(str(tmp_path / "nope")))


def test_unknown_id_lookup_says_how_to_list(kb):
    with pytest.raises(KnowledgeError, match="kb list"):
        kb.get("no-such-entry")
