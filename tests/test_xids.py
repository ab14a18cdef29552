"""The Xid table (knowledge/xids.yaml): loaded and checked, routed by the entries, and driving the fix."""
import json
import re

import pytest
import yaml

import knowledge
from bot.kb import xids as xid_table
from tests.conftest import run_cli

GPU_ENTRIES = {"gpu-xid", "gpu-ecc", "nvlink-error", "gpu-gsp-timeout"}
DRAIN = re.compile(r"State=DRAIN")
REBOOT = re.compile(r"\b(reboot|systemctl reboot)\b")
RESET = re.compile(r"nvidia-smi\s+-r\b")
IDLE = re.compile(r"squeue -w|--query-compute-apps")


def kernel_line(xid: int) -> str:
    prefix = "Jun 02 03:12:07 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00):"
    if 144 <= xid <= 150:  # NVLink5 Xids name the unit and say Fatal or Nonfatal; no pid
        return f"{prefix} {xid}, RLW_REMAP Fatal XC0 i0 Link 03 (0x00000001 0x00000040 0x0 0x0 0x0 0x0)\n"
    return f"{prefix} {xid}, pid=88123, name=python, Ch 00000010\n"


def steps_for(diagnoser, log: str):
    d = diagnoser.diagnose_text(log)
    assert d.root is not None, log
    return d, d.steps(d.root)


def test_the_table_lists_every_catalog_xid_with_its_actions():
    table = xid_table.load()
    assert sorted(table.xids) == list(range(1, 173))
    assert table.xids[142].mnemonic == "ROBUST_CHANNEL_NVENC3_ERROR" and table.xids[142].entry != "gpu-ecc"
    assert {n: table.xids[n].action for n in (63, 79, 92, 94, 109, 121, 136, 156)} == {
        63: "IGNORE", 79: "RESTART_BM", 92: "IGNORE", 94: "RESTART_APP", 109: "RESET_GPU", 121: "IGNORE",
        136: "RESET_GPU", 156: "RESET_GPU"}
    assert table.xids[171].action == table.xids[172].action == "WORKFLOW_XID_48"  # detail added to an Xid 48
    assert table.xids[171].entry == table.xids[172].entry == "gpu-ecc"
    assert table.xids[162].immediate is None and table.xids[162].action == xid_table.UNLISTED
    assert table.worst(["63", "64"]).number == 64 and table.worst(["63"]).number == 63
    assert table.worst(["999", "abc"]) is None


def test_the_table_ships_in_the_wheel():
    data = (knowledge.ROOT.parent / "pyproject.toml").read_text()
    assert '"xids.yaml"' in data and '"xids.schema.json"' in data


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["xids"][62].update(immediate="REBOOT_NOW"), "xids[62] (Xid 63).immediate: 'REBOOT_NOW' is not one of the actions"),
    (lambda d: d["xids"].append(dict(d["xids"][78])), "Xid 79): listed twice"),
    (lambda d: d["xids"][78].pop("mnemonic"), "xids[78] (Xid 79): 'mnemonic' is a required property"),
    (lambda d: d["xids"][78].update(applies=["V100"]), "xids[78] (Xid 79).applies[0]"),
    (lambda d: d["xids"][170].update(**{"with": 999}), "Xid 171).with: no row for Xid 999"),
    (lambda d: d["actions"].pop(), "add the class NO_XID"),
])
def test_a_bad_row_is_refused_with_a_message_naming_it(tmp_path, mutate, needle):
    data = yaml.safe_load(knowledge.XIDS.read_text())
    mutate(data)
    bad = tmp_path / "xids.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(xid_table.XidTableError) as err:
        xid_table.load(bad)
    assert needle in str(err.value) and str(bad) in str(err.value)


def test_every_routed_xid_is_diagnosed_as_its_entry_and_the_others_by_no_gpu_entry(kb, diagnoser):
    wrong = []
    for xid in kb.xids.xids.values():
        d = diagnoser.diagnose_text(kernel_line(xid.number))
        got = d.root.entry.id if d.root else None
        if xid.entry and xid.action == xid_table.UNLISTED:  # no catalog action: routed, strength by its name
            ok = got == xid.entry
        elif xid.entry and xid.action == "IGNORE":
            ok = got in (xid.entry, None) and (d.root is None or d.root.score < 0.5)
        elif xid.entry:
            ok = got == xid.entry and d.root.score >= 0.5
        else:
            ok = got not in GPU_ENTRIES
        if not ok:
            wrong.append(f"Xid {xid.number} ({xid.action}, table: {xid.entry}): got {got} {d.root.score if d.root else ''}")
    assert not wrong, "\n".join(wrong)


def test_a_lone_ignore_class_xid_never_drains_or_reboots(diagnoser):
    for xid in (63, 92, 38):
        d, steps = steps_for(diagnoser, kernel_line(xid))
        commands = " ".join(s["command"] or "" for s in steps)
        assert d.root.score < 0.5, xid
        assert not DRAIN.search(commands) and not REBOOT.search(commands), (xid, commands)
        assert any("IGNORE" in s["text"] for s in steps), xid
    d, steps = steps_for(diagnoser, kernel_line(63))
    assert "reset the gpu when convenient" in " ".join(s["text"] for s in steps).lower()


def test_xid_79_drains_then_reboots_in_separate_steps_after_an_idle_check(diagnoser):
    d, steps = steps_for(diagnoser, kernel_line(79))
    assert d.root.entry.id == "gpu-xid"
    commands = [s["command"] or "" for s in steps]
    drain = next(i for i, c in enumerate(commands) if DRAIN.search(c))
    idle = next(i for i, c in enumerate(commands) if IDLE.search(c))
    reboot = next(i for i, c in enumerate(commands) if REBOOT.search(c))
    assert drain < idle < reboot
    assert commands[reboot].strip() == "sudo systemctl reboot"  # never chained to anything
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in d.fill(d.root.entry.data["fix"]["summary"], d.root)
    assert "RESTART_BM" in d.fill(d.root.entry.data["fix"]["summary"], d.root)


def test_a_reset_gpu_xid_resets_after_the_idle_check_and_reboots_only_as_a_fallback(diagnoser):
    for xid, entry in ((109, "gpu-xid"), (95, "gpu-ecc"), (119, "gpu-gsp-timeout"), (136, "nvlink-error")):
        d, steps = steps_for(diagnoser, kernel_line(xid))
        assert d.root.entry.id == entry, xid
        commands = [s["command"] or "" for s in steps]
        idle = next(i for i, c in enumerate(commands) if IDLE.search(c))
        reset = next(i for i, c in enumerate(commands) if RESET.search(c))
        assert idle < reset, xid
        assert not re.search(r"\|\||&&", commands[reset]), commands[reset]


def test_a_restart_app_xid_keeps_the_node(diagnoser):
    for xid in (8, 94):
        d, steps = steps_for(diagnoser, kernel_line(xid))
        commands = " ".join(s["command"] or "" for s in steps)
        assert not DRAIN.search(commands) and "--exclude" not in commands, (xid, commands)
        assert "sbatch train.sbatch" in commands, xid
    d, steps = steps_for(diagnoser, kernel_line(94))
    assert "reset the GPU when convenient" in " ".join(s["text"] for s in steps)


def test_the_watchdog_unknown_error_alone_names_no_xid_and_does_not_drain(diagnoser):
    log = ("[rank3]:[E602 03:12:08.902] ProcessGroupNCCL.cpp:1537 [PG 0 Rank 3] Process group watchdog thread "
           "terminated with exception: CUDA error: unknown error\n")
    d, steps = steps_for(diagnoser, log)
    assert d.root.entry.id == "gpu-xid"
    commands = " ".join(s["command"] or "" for s in steps)
    assert not DRAIN.search(commands) and "journalctl -k" in commands


def test_the_worst_xid_of_a_finding_decides(diagnoser):
    d, steps = steps_for(diagnoser, kernel_line(63) + kernel_line(64))
    assert d.xid(d.root).number == 64
    assert DRAIN.search(" ".join(s["command"] or "" for s in steps))


def test_json_findings_carry_the_filled_steps(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("step 10 loss 1.2\n" + kernel_line(79))
    out = run_cli("diagnose", "--format", "json", "--no-record", "--job", "4242", str(log))
    assert out.returncode == 0, out.stderr
    finding = json.loads(out.stdout.decode())["findings"][0]
    assert finding["entry"] == "gpu-xid" and "RESTART_BM" in finding["fix"]
    assert all(set(s) == {"text", "command", "code"} for s in finding["steps"])
    drain = next(s for s in finding["steps"] if s["command"] and "State=DRAIN" in s["command"])
    assert "Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS job 4242" in drain["command"]
    assert not any("{" in (s["command"] or "") + s["text"] for s in finding["steps"])


def test_text_and_markdown_show_the_same_selected_steps(tmp_path):
    log = tmp_path / "node.log"
    log.write_text(kernel_line(63))
    for fmt in ("text", "markdown"):
        out = run_cli("diagnose", "--format", fmt, "--no-record", str(log))
        assert out.returncode == 0, out.stderr
        text = out.stdout.decode()
        assert "IGNORE" in text and "State=DRAIN" not in text and "reboot" not in text


def test_a_table_that_passed_its_schema_check_is_not_checked_again(tmp_path, monkeypatch):
    """The check is a quarter of start-up; the loader's cache of validated texts records a pass."""
    from bot.kb.load import _ValidatedCache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = tmp_path / "xids.yaml"
    good.write_text(knowledge.XIDS.read_text())
    cache = _ValidatedCache()
    xid_table.load(good, cache)
    cache.save()
    with monkeypatch.context() as m:
        m.setattr(xid_table, "_validator", lambda: pytest.fail("validated twice"))
        assert xid_table.load(good, _ValidatedCache()).xids[79].mnemonic
    # a changed table is checked (and refused) whatever passed before
    data = yaml.safe_load(good.read_text())
    data["xids"][78].pop("mnemonic")
    good.write_text(yaml.safe_dump(data))
    with pytest.raises(xid_table.XidTableError, match="'mnemonic' is a required property"):
        xid_table.load(good, _ValidatedCache())
