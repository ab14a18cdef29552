"""The rules for commands (knowledge/README.md) hold for every shipped entry, and each rule can fail."""
import pytest

from bot.kb import rules


def _entry(*fix, confirm=()):
    return {"confirm": [dict(c) for c in confirm], "fix": {"summary": "s", "steps": [dict(s) for s in fix]}}


def test_every_shipped_entry_follows_the_command_rules(kb):
    broken = {e.id: rules.problems(e.data) for e in kb.entries.values()}
    broken = {k: v for k, v in broken.items() if v}
    assert not broken, "\n".join(f"{k}: {p}" for k, v in sorted(broken.items()) for p in v)


IDLE = {"text": "check that no job runs there", "command": "squeue -w <node> && nvidia-smi --query-compute-apps=pid --format=csv"}


@pytest.mark.parametrize("steps, needle", [
    ([IDLE, {"text": "reset", "command": "sudo nvidia-smi -r -i 0 || sudo reboot"}], "chained"),
    ([IDLE, {"text": "drain and reboot", "command": "scontrol update nodename=n1 state=drain reason=x && sudo reboot"}], "chained"),
    ([{"text": "reset", "command": "sudo nvidia-smi -r -i 0"}], "nothing runs there"),
    ([{"text": "reboot", "command": "sudo scontrol reboot n1"}], "nothing runs there"),
    ([{"text": "clear", "command": "sudo dmesg -C"}], "destroys evidence"),
    ([{"text": "reset counters", "command": "sudo perfquery -R -a"}], "destroys evidence"),
    ([{"text": "check", "command": "ibqueryerrors 2>/dev/null"}, {"text": "clear", "command": "sudo ibdiagnet -r --pc"}], "destroys evidence"),
    ([{"text": "anomaly mode", "command": 'python -c "import torch; torch.autograd.set_detect_anomaly(True)"'}], "prints nothing"),
    ([{"text": "record", "command": "python - <<'EOF'\nprint(1)\nEOF"}], "heredoc"),
    ([{"text": "spawn", "command": 'torch.multiprocessing.set_start_method("spawn", force=True)'}], "Python"),
    ([{"text": "import", "command": "from torch.distributed.elastic.multiprocessing.errors import record"}], "Python"),
    ([{"text": "run", "command": "torchrun --nproc_per_node=8 train.py ..."}], "cannot be pasted"),
    ([{"text": "restarts", "command": "sacct -j 1 --format=JobID,State,Restarts"}], "24.11"),
])
def test_should_flag(steps, needle):
    found = rules.problems(_entry(*steps))
    assert any(needle in p for p in found), found


@pytest.mark.parametrize("steps, confirm", [
    ([IDLE, {"text": "reset the GPU", "command": "sudo nvidia-smi -r -i 0"}], ()),
    ([{"text": "reboot", "command": "sudo reboot"}], (IDLE,)),
    ([{"text": "save", "command": "sudo dmesg -T > dmesg-$(hostname).txt"}, {"text": "clear", "command": "sudo dmesg -C"}], ()),
    ([{"text": "save then clear", "command": "sudo perfquery -x -a | tee counters.txt && sudo perfquery -R -a"}], ()),
    ([{"text": "drain", "command": 'sudo scontrol update NodeName=<node> State=DRAIN Reason="Xid 79"'}], ()),
    ([{"text": "visible?", "command": 'python -c "import torch; print(torch.cuda.is_available())"'}], ()),
    ([{"text": "exit status", "command": 'python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"'}], ()),
    ([{"text": "spawn", "code": 'torch.multiprocessing.set_start_method("spawn", force=True)'}], ()),
    ([{"text": "run", "command": "torchrun --nproc_per_node=8 train.py <your train.py args>"}], ()),
    ([{"text": "restarts, Slurm 24.11 and later", "command": "sacct -j 1 --format=JobID,State,Restarts"}], ()),
    ([{"text": "grep", "command": "grep -E 'Xid|fallen off' /var/log/syslog | tail -5"}], ()),
])
def test_should_not_flag(steps, confirm):
    assert rules.problems(_entry(*steps, confirm=confirm)) == []


def test_each_xid_action_selection_is_checked_on_its_own():
    """An idle check shown only for RESET_GPU does not cover a reboot shown for RESTART_BM."""
    idle = dict(IDLE, xid_actions=["RESET_GPU"])
    reboot = {"text": "reboot", "command": "sudo systemctl reboot", "xid_actions": ["RESET_GPU", "RESTART_BM"]}
    found = rules.problems(_entry(idle, reboot))
    assert any("(Xid action RESTART_BM)" in p and "nothing runs there" in p for p in found), found
    assert not rules.problems(_entry(dict(IDLE, xid_actions=["RESET_GPU", "RESTART_BM"]), reboot))
