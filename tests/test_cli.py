"""The command line as a user (or another tool) runs it: formats, the JSON contract, exit codes."""
import gzip
import json
import sys
from pathlib import Path

import pytest
from conftest import GOES_ON, run_cli, write

OOM_LOG = """\
[2024-09-11 17:40:02,118] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda
[rank0]: iteration     4100/  500000 | consumed samples: 524800 | lm loss: 1.904E+00 |
[rank0]: saving checkpoint at iteration    4000 to /ckpt/gpt-7b
[rank0]: iteration     4110/  500000 | consumed samples: 526080 | lm loss: 1.903E+00 |
slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4812345.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.
srun: error: gpu-a100-17: task 5: Out Of Memory
srun: error: gpu-a100-17: tasks 0-4,6-7: Terminated
"""


def _json(args, **kw):
    proc = run_cli("diagnose", "--format", "json", *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_contract(tmp_path):
    out = _json([str(write(tmp_path / "job.log", OOM_LOG)), "--job", "4812345", "--no-record"])
    assert set(out) >= {"root", "findings", "initiating", "progress", "incident", "lines_scanned", "bytes_scanned"}
    assert out["root"] == "slurm-cgroup-oom"
    root = out["findings"][0]
    assert set(root) >= {"entry", "title", "role", "score", "evidence", "fix", "verify", "related"}
    assert root["entry"] == "slurm-cgroup-oom" and root["role"] == "root"
    assert 0.0 <= root["score"] <= 1.0
    assert root["evidence"][0] == {
        "line": 5,
        "text": "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4812345.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.",
        "rank": None, "host": None, "time": None,
    }
    assert root["verify"].startswith("sacct -j 4812345 ")
    assert all(isinstance(x, str) for x in root["related"])
    assert out["initiating"] == {"rank": 5, "host": "gpu-a100-17", "line": 5}
    assert out["progress"] == {"iteration": 4110, "checkpoint": "/ckpt/gpt-7b"}
    assert out["incident"] is None
    assert out["lines_scanned"] == 7
    assert out["bytes_scanned"] == len(OOM_LOG.encode())


def test_text_report_puts_the_verdict_first(tmp_path):
    proc = run_cli("diagnose", str(write(tmp_path / "job.log", OOM_LOG)))
    assert proc.returncode == 0
    lines = proc.stdout.decode().splitlines()
    assert "slurm-cgroup-oom" in lines[0]
    text = proc.stdout.decode()
    for part in ("Evidence:", "line 5:", "Started at: rank 5, host gpu-a100-17, line 5", "Fix:", "Verify:",
                 "last iteration 4110", "last checkpoint /ckpt/gpt-7b"):
        assert part in text
    assert text.index("Evidence:") < text.index("Fix:") < text.index("Verify:")


def test_markdown_format(tmp_path):
    proc = run_cli("diagnose", "--format", "markdown", str(write(tmp_path / "job.log", OOM_LOG)))
    assert proc.stdout.decode().startswith("## ")
    assert "### Evidence" in proc.stdout.decode()


def test_stdin_and_gzip(tmp_path):
    assert _json(["-"], stdin=OOM_LOG.encode())["root"] == "slurm-cgroup-oom"
    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress(OOM_LOG.encode()))
    assert _json([str(gz)])["root"] == "slurm-cgroup-oom"


def test_several_files_are_one_job(tmp_path):
    a = write(tmp_path / "rank0.log", "[rank0]: iteration 10/ 100 | loss 1.0 |\n")
    b = write(tmp_path / "rank5.log", OOM_LOG)
    out = _json([str(a), str(b)])
    assert out["root"] == "slurm-cgroup-oom"
    assert out["findings"][0]["evidence"][0]["file"] == str(b)
    assert out["lines_scanned"] == 8


def test_nothing_found_is_said_plainly(tmp_path):
    # An error line with no traceback, no known fingerprint and a log that goes on: nothing to name, the lines to read.
    log = write(tmp_path / "x.log", "starting\nwarmup done\nWeirdLibError: flux capacitor\n" + GOES_ON)
    proc = run_cli("diagnose", str(log))
    assert proc.returncode == 0
    text = proc.stdout.decode()
    assert text.startswith("No known failure found.")
    assert "3: WeirdLibError: flux capacitor" in text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.log", "cannot open it"),
        (lambda p: p, "is a folder"),
        (lambda p: (p / "model.bin").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8) and p / "model.bin",
         "not a text log"),
        (lambda p: (p / "ckpt.pt").write_bytes(b"PK\x03\x04" + bytes(500)) and p / "ckpt.pt", "zip archive"),
        (lambda p: (p / "noise.bin").write_bytes(bytes(range(32)) * 300) and p / "noise.bin", "not a text log"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(tmp_path, make, message):
    proc = run_cli("diagnose", str(make(tmp_path)))
    assert proc.returncode == 2
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in proc.stderr.decode()


def test_bad_usage_exits_2():
    assert run_cli("diagnose").returncode == 2
    assert run_cli("diagnose", "--format", "yaml", "x").returncode == 2


def test_odd_but_valid_text_inputs(tmp_path):
    empty = write(tmp_path / "empty.log", "")
    assert _json([str(empty)])["root"] is None
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(gzip.compress(OOM_LOG.encode() * 50)[:300])
    out = _json([str(truncated)])
    assert any("truncated" in w for w in out["warnings"])


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "trainmedic"
    assert script.exists()


def test_kb_list_show_and_check():
    listing = run_cli("kb", "list", "--format", "json")
    ids = [e["id"] for e in json.loads(listing.stdout)]
    assert "slurm-cgroup-oom" in ids and len(ids) >= 60
    show = run_cli("kb", "show", "slurm-cgroup-oom").stdout.decode()
    for part in ("Summary", "Mechanism", "Symptoms", "How to confirm", "Fix", "Verify", "Fingerprints", "References"):
        assert part in show
    missing = run_cli("kb", "show", "no-such-entry")
    assert missing.returncode == 2 and b"kb list" in missing.stderr
    check = run_cli("kb", "check")
    assert check.returncode == 0, check.stdout.decode()[-2000:]
    assert b"kb check: ok" in check.stdout


def test_kb_check_fails_on_a_broken_site_entry(tmp_path):
    import os

    import yaml
    from conftest import entry_yaml

    bad = entry_yaml("site-bad", r"will never match this", positive_log="no match in here\n")
    (tmp_path / "site-bad.yaml").write_text(yaml.safe_dump(bad))
    proc = run_cli("kb", "check", env={**os.environ, "TRAINMEDIC_KB_PATH": str(tmp_path)})
    assert proc.returncode == 1
    assert b"site-bad" in proc.stdout and b"FAIL" in proc.stdout


def test_a_broken_site_entry_is_a_one_line_error(tmp_path):
    import os

    (tmp_path / "oops.yaml").write_text("id: oops\n")
    proc = run_cli("kb", "list", env={**os.environ, "TRAINMEDIC_KB_PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1 and "oops.yaml" in proc.stderr.decode()


def test_diagnoses_are_recorded_and_repeats_linked(tmp_path):
    log = str(write(tmp_path / "job.log", OOM_LOG))
    first = _json([log, "--job", "1"])["incident"]
    second = _json([log, "--job", "2"])["incident"]
    assert first["count"] == 1 and second["count"] == 2
    assert second["previous"] == [{"id": first["id"], "at": second["previous"][0]["at"], "where": "job 1 on gpu-a100-17"}]
    text = run_cli("diagnose", log).stdout.decode()
    assert "Seen 3 times since" in text and f"#{first['id']}" in text


def test_an_unwritable_history_does_not_lose_the_diagnosis(tmp_path):
    import os

    env = {**os.environ, "TRAINMEDIC_DB": str(tmp_path / "no" / "such" / "dir" / "x.db")}
    (tmp_path / "no").write_text("a file where a folder should be")
    proc = run_cli("diagnose", "--format", "json", str(write(tmp_path / "job.log", OOM_LOG)), env=env)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["root"] == "slurm-cgroup-oom"
    assert b"incident not recorded" in proc.stderr


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "csv"])
def test_incidents_commands_in_every_format(tmp_path, fmt):
    log = str(write(tmp_path / "job.log", OOM_LOG))
    for job in ("11", "12"):
        assert run_cli("diagnose", log, "--job", job).returncode == 0
    for args in (["list"], ["show", "1"], ["stats"], ["search", "oom-kill"], ["export"]):
        proc = run_cli("incidents", *args, "--format", fmt)
        assert proc.returncode == 0, (args, proc.stderr)
        out = proc.stdout.decode()
        if fmt == "json":
            json.loads(out)
        assert "slurm-cgroup-oom" in out, (args, out)
    listing = run_cli("incidents", "list", "--format", "csv").stdout.decode().splitlines()
    assert listing[0] == "id,at,entry,status,host,job,signature" and len(listing) == 3
    stats = json.loads(run_cli("incidents", "stats", "--format", "json").stdout)
    assert stats["by_entry"][0] == {**stats["by_entry"][0], "entry": "slurm-cgroup-oom", "incidents": 2}
    missing = run_cli("incidents", "show", "999")
    assert missing.returncode == 2 and b"no incident 999" in missing.stderr


def test_export_feedback_writes_kb_examples(tmp_path):
    import yaml

    from bot.history.store import History

    log = str(write(tmp_path / "job.log", OOM_LOG))
    incident = _json([log])["incident"]
    history = History()
    history.mark_wrong(incident["id"], "host-oom-kill", user="U1", note="it was the node")
    history.close()
    out = run_cli("incidents", "export", "--feedback")
    [example] = yaml.safe_load(out.stdout)
    assert example["entry"] == "host-oom-kill" and "oom-kill event" in example["log"]
    assert "diagnosed slurm-cgroup-oom" in example["name"]


def test_kb_score_counts_a_null_root_as_a_healthy_log(tmp_path):
    write(tmp_path / "oom.log", OOM_LOG)
    write(tmp_path / "fine.log", "[rank0]: iteration 10/ 10 | lm loss: 1.9 |\ntraining finished\n")
    write(tmp_path / "also-fine.log", "epoch 3 done, saving model\n")
    write(tmp_path / "labels.yaml", "- {case: oom.log, root: slurm-cgroup-oom}\n"
                                    "- {case: fine.log, root: null}\n- {case: also-fine.log, root: none}\n")
    proc = run_cli("kb", "score", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert b"failing logs: top-1 1/1 (100%)" in proc.stdout
    assert b"healthy logs: 0 false alarms of 2" in proc.stdout


def test_kb_score_counts_a_healthy_log_answered_as_its_label_allows_as_no_false_alarm(tmp_path):
    write(tmp_path / "oom.log", OOM_LOG)
    write(tmp_path / "ok.log", OOM_LOG)
    write(tmp_path / "labels.yaml", "- {case: oom.log, root: none}\n"
                                    "- {case: ok.log, root: none, also_ok: [slurm-cgroup-oom]}\n")
    proc = run_cli("kb", "score", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert b"healthy logs: 1 false alarms of 2" in proc.stdout
