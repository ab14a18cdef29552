"""A failed run is never answered with silence, wrappers never win over their child, and the
reply uses what the log says (issue: diagnosis that holds on logs nobody here has seen)."""
import json

import pytest
from conftest import run_cli, write

TABLE = """\
E0501 10:00:05.123000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: {code}) local_rank: 0 (pid: 4242) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_10:00:05
  host      : gpu-node-17
  rank      : 5 (local_rank: 0)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
PROGRESS = "".join(f"[2024-05-01 09:{i // 60:02d}:{i % 60:02d},000] INFO step={i} loss={2.5 - i / 1000:.3f}\n" for i in range(200))
CHILD = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    main()
  File "/workspace/model.py", line 61, in forward
    x = self.proj(batch)
RuntimeError: Found dtype Half but expected Float
"""


def test_an_unknown_exception_under_childfailederror_is_the_answer(diagnoser):
    d = diagnoser.diagnose_text(PROGRESS + CHILD + TABLE.format(code=1))
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert not d.cascade_only
    assert d.root.first.text == "RuntimeError: Found dtype Half but expected Float"
    assert d.root.groups["exception"] == "RuntimeError"
    roles = {f.entry.id: f.role for f in d.findings}
    assert roles["torchelastic-child-failed"] == "collateral"
    # torchrun's table names where it happened when the child's own line does not
    assert d.initiating["rank"] == 5 and d.initiating["host"] == "gpu-node-17"
    assert d.progress["iteration"] == 199


def test_an_exception_that_ends_the_log_is_the_answer(diagnoser):
    d = diagnoser.diagnose_text(PROGRESS + CHILD)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.score < 0.5  # an honest, low confidence


def test_a_handled_exception_in_a_healthy_run_stays_silent(diagnoser):
    handled = "WARNING could not log to wandb, will retry:\n" + CHILD
    d = diagnoser.diagnose_text(PROGRESS + handled + PROGRESS.replace("09:", "10:") + "Training completed.\n")
    assert d.root is None and d.findings == []


def test_an_error_line_without_a_traceback_is_not_an_uncaught_exception(diagnoser):
    d = diagnoser.diagnose_text(PROGRESS + "ERROR: ConfigMergeError: bad value in config, using the default\n")
    assert d.root is None


def test_a_runner_stamped_exception_line_that_ends_a_cut_paste_is_the_answer(diagnoser):
    # a job runner stamps the time on every line it relays; the paste lost the traceback above
    tail = ("2022-01-23 02:08:36.029 raise ReadError(\"unexpected end of data\")\n"
            "2022-01-23 02:08:36.029 tarfile.ReadError: unexpected end of data @ train/00000022.tar\n")
    d = diagnoser.diagnose_text(tail)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups["exception"] == "tarfile.ReadError"
    # a logger's record about an error keeps its level word after the time: not an uncaught exception
    logged = "2022-01-23 02:08:36.029 ERROR tarfile.ReadError: unexpected end of data, skipping shard\n"
    assert diagnoser.diagnose_text(PROGRESS + logged).root is None


def test_the_wrapper_alone_is_a_consequence(diagnoser):
    d = diagnoser.diagnose_text(PROGRESS + TABLE.format(code=1))
    assert d.root is not None and d.root.entry.id == "torchelastic-child-failed" and d.cascade_only


def test_an_informative_consequence_is_not_replaced_by_an_unknown_exception(diagnoser):
    log = PROGRESS + """Traceback (most recent call last):
  File "/home/u/train.py", line 201, in <module>
    dist.barrier(group=cpu_group)
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.1.4.22]:43021: Connection reset by peer
RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "nccl-timeout"


def test_an_evidence_line_appears_once(tmp_path):
    line = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.15 GiB of which 310.00 MiB is free.\n")
    log = write(tmp_path / "oom.log", line)
    out = json.loads(run_cli("diagnose", "--no-record", "--format", "json", str(log)).stdout)
    shown = [e["text"] for f in out["findings"] for e in f["evidence"]] + [e["text"] for e in out["likely_errors"]]
    assert shown.count(line.strip()) == 1, shown
    text = run_cli("diagnose", "--no-record", str(log)).stdout.decode()
    assert text.count("CUDA out of memory. Tried to allocate 2.00 GiB") == 1


def test_the_fix_names_the_node_the_log_names(diagnoser):
    log = "Jun 02 03:12:07 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=88123, name=python, GPU has fallen off the bus.\n"
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.initiating["host"] == "gpu-node-17"
    commands = [d.fill(s["command"], d.root) for s in d.root.entry.data["fix"]["steps"] if "command" in s]
    assert any("gpu-node-17" in c for c in commands), commands
    assert not any("<node>" in c for c in commands), commands


def test_a_bare_killed_at_the_end_names_the_oom_killer(diagnoser):
    d = diagnoser.diagnose_text(PROGRESS + "Killed\n")
    assert d.root is not None and d.root.entry.id == "host-oom-kill"
    assert d.confidence == "low"
    assert any("journalctl -k" in s.get("command", "") for s in d.root.entry.data["confirm"])


def test_a_killed_word_mid_run_is_not_a_death(diagnoser):
    d = diagnoser.diagnose_text("Killed\n" + PROGRESS + "Training completed.\n")
    assert d.root is None


@pytest.mark.parametrize("code, signal, entry, confidence", [
    (-9, "Signal 9 (SIGKILL)", "host-oom-kill", "low"),  # a kill from outside: most often the OOM killer
    (-11, "Signal 11 (SIGSEGV)", "segfault", "medium"),  # the child did segfault; where is the question
    (-6, "Signal 6 (SIGABRT)", "process-aborted", "low"),
    (-15, "Signal 15 (SIGTERM)", "job-cancelled", "low"),  # terminated from outside: then look for who
])
def test_the_exit_code_in_torchruns_table_names_how_the_child_died(diagnoser, code, signal, entry, confidence):
    table = TABLE.format(code=code).replace(
        "traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        f"traceback : {signal} received by PID 4242")
    d = diagnoser.diagnose_text(PROGRESS + table)
    assert d.root is not None and d.root.entry.id == entry
    assert d.confidence == confidence
    assert d.initiating["rank"] == 5 and d.initiating["host"] == "gpu-node-17"
    assert {f.entry.id: f.role for f in d.findings}["torchelastic-child-failed"] == "collateral"


@pytest.mark.parametrize("report, entry", [
    ("[2024-03-01 10:00:01,000] [ERROR] [launch.py:324:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
     "'--local_rank=0'] exits with return code = -9", "host-oom-kill"),
    ("mpirun noticed that process rank 1 with PID 4242 on node gpu-node-17 exited on signal 6 (Aborted).",
     "process-aborted"),
    ("mpirun noticed that process rank 3 with PID 4250 on node gpu-node-17 exited on signal 8 (Floating point exception).",
     "segfault"),  # SIGFPE: a native crash, debugged as a segfault is
    ("mpirun noticed that process rank 0 with PID 4211 on node gpu-node-17 exited on signal 7 (Bus error).",
     "shm-exhausted"),
])
def test_a_signal_a_launcher_reports_names_how_the_child_died(diagnoser, report, entry):
    d = diagnoser.diagnose_text(PROGRESS + report + "\n")
    assert d.root is not None and d.root.entry.id == entry and d.confidence == "low"
    assert d.root.first.text == report  # the launcher's line is the evidence


def test_a_plain_exit_code_leaves_the_wrapper_as_the_answer(diagnoser):
    report = ("[2024-03-01 10:00:01,000] [ERROR] [launch.py:324:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
              "'--local_rank=0'] exits with return code = 1")
    d = diagnoser.diagnose_text(PROGRESS + report + "\n")
    assert d.root is not None and d.root.entry.id == "launcher-subprocess-failed" and d.cascade_only


def test_a_failure_the_launcher_restarted_from_is_not_the_answer(diagnoser):
    restart = (
        "E0611 02:20:09.402000 881 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 0 (pid: 9021) of binary: /usr/bin/python3\n"
        "[2024-06-11 02:20:10,001] torch.distributed.elastic.agent.server.api: [INFO] [default] Worker group FAILED. "
        "2/3 attempts left; will restart worker group\n")
    d = diagnoser.diagnose_text(PROGRESS + restart + PROGRESS.replace("09:", "10:"))
    assert d.root is None and d.findings == []
    # without the restart the same line ends the run and names the kill
    assert diagnoser.diagnose_text(PROGRESS + restart.splitlines(True)[0]).root.entry.id == "host-oom-kill"


IGNORED = """\
Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3a2c1d0ee0>
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1479, in __del__
    self._shutdown_workers()
AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'
"""


def test_an_exception_python_reported_as_ignored_ended_nothing(diagnoser):
    """Raised in __del__ at exit, Python prints it under "Exception ignored in" and goes on."""
    assert diagnoser.diagnose_text(PROGRESS + "Training completed.\n" + IGNORED).root is None
    # the same exception without the header did end the run
    unignored = IGNORED.split("\n", 1)[1]
    assert diagnoser.diagnose_text(PROGRESS + unignored).root.entry.id == "python-user-code-error"


def test_a_windows_crash_exit_code_is_a_segfault(diagnoser):
    """0xC0000005 (access violation), printed as an unsigned exit code by a wrapper."""
    report = ("subprocess.CalledProcessError: Command '['C:\\\\Python310\\\\python.exe', 'train.py']' "
              "returned non-zero exit status 3221225477.")
    d = diagnoser.diagnose_text(PROGRESS + report + "\n")
    assert d.root is not None and d.root.entry.id == "segfault"
    plain = report.replace("3221225477", "1")
    assert diagnoser.diagnose_text(PROGRESS + plain + "\n").root.entry.id == "launcher-subprocess-failed"


def test_the_end_of_a_rich_traceback_whose_header_was_cut_off_is_a_traceback(diagnoser):
    rich = """\
│ /opt/conda/lib/python3.10/site-packages/peft/tuners/lora.py:512 in forward                       │
│                                                                                                  │
│   511 │   │   │   result = self.base_layer(x)                                                    │
│ ❱ 512 │   │   │   result += self.lora_B(self.lora_A(x)) * self.scaling                           │
│   513 │   │   return result                                                                      │
╰──────────────────────────────────────────────────────────────────────────────────────────────────╯
RuntimeError: expected scalar type Half but found Float
"""
    d = diagnoser.diagnose_text(PROGRESS + rich)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.first.text.startswith("RuntimeError: expected scalar type Half")
    # without the frame arrow the same lines are no traceback: an error line the run went on after is no crash
    assert diagnoser.diagnose_text(PROGRESS + rich.replace("❱", " ") + PROGRESS).root is None


def test_a_bare_exception_under_childfailederror_is_the_answer(diagnoser):
    """`raise Exception("...")` prints a bare `Exception:` line: still the child's own error."""
    bare = CHILD.replace("RuntimeError: Found dtype Half but expected Float", "Exception: expected value at line 1 column 1")
    d = diagnoser.diagnose_text(PROGRESS + bare + TABLE.format(code=1))
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.first.text == "Exception: expected value at line 1 column 1"
    assert d.root.groups["exception"] == "Exception"


HYDRA = """\
Error executing job with overrides: ['trainer.devices=4']
Error in call to target 'pipeline.sample.build_sampler':
ValueError("unknown sampler 'ddim2', expected one of ['ddim', 'ddpm']")
full_key: sampler

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_hydras_short_report_of_a_task_that_raised_is_the_answer(diagnoser):
    """Hydra prints the repr of the task's exception and no traceback unless HYDRA_FULL_ERROR is set."""
    d = diagnoser.diagnose_text(PROGRESS + HYDRA)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.first.text.startswith("ValueError(\"unknown sampler 'ddim2'")
    assert d.root.groups["exception"] == "ValueError"
    # the same repr printed by the program itself, with no uncaught-exception report, ended nothing
    assert diagnoser.diagnose_text(PROGRESS + HYDRA.splitlines()[2] + "\n" + PROGRESS).root is None


def test_an_exception_whose_traceback_was_cut_off_counts_when_the_launcher_reports_the_failure(diagnoser):
    cut = "FileExistsError: [Errno 17] File exists:\n'/scratch/data/eegbci/S043'\n\n"
    srun = "srun: error: nid008637: task 3: Exited with exit code 1\nsrun: error: nid008637: tasks 0-2: Terminated\n"
    d = diagnoser.diagnose_text(PROGRESS + cut + srun)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups["exception"] == "FileExistsError"
    # no traceback, no failure report, and the log goes on past its last lines
    assert diagnoser.diagnose_text(PROGRESS + cut + "retrying with a new folder\n" * 3 + PROGRESS).root is None


@pytest.mark.parametrize("last", [
    "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
    # (a corrupt safetensors header such as HeaderTooLarge is checkpoint-corrupt's; a missing tensor is not)
    "[rank0]: safetensors_rust.SafetensorError: File does not contain tensor lm_head.weight",
])
def test_a_paste_that_ends_on_an_uncaught_exception_line_is_answered(diagnoser, last):
    """Someone pastes the bottom of a log without the traceback: the run ended on that line."""
    d = diagnoser.diagnose_text(PROGRESS + last + "\n")
    assert d.root is not None and d.root.entry.id == "python-user-code-error" and d.confidence == "low"
    assert d.root.first.text == last
    # a logger's line about an exception is not Python's report of an uncaught one
    assert diagnoser.diagnose_text(PROGRESS + "ERROR: " + last + "\n").root is None


@pytest.mark.parametrize("ending", [
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15",
    "KeyboardInterrupt",
])
def test_a_run_stopped_from_outside_is_a_cancellation_not_a_code_error(diagnoser, ending):
    log = (PROGRESS + "Traceback (most recent call last):\n  File \"/usr/bin/torchrun\", line 8, in <module>\n"
           "    sys.exit(main())\n" + ending + "\n")
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "job-cancelled" and d.confidence == "low"
    assert "python-user-code-error" not in {f.entry.id for f in d.findings}


def test_a_sigterm_after_the_time_limit_is_the_time_limit(diagnoser):
    log = (PROGRESS + "slurmstepd: error: *** JOB 88120 ON gpu-b11 CANCELLED AT 2024-02-10T06:00:12 DUE TO TIME LIMIT ***\n"
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 9120 got signal: 15\n")
    assert diagnoser.diagnose_text(log).root.entry.id == "slurm-time-limit"


JAX_ON_CPU = "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. Falling back to cpu.\n"
TF_SKIP = ("2024-05-22 11:40:38.241124: W tensorflow/core/common_runtime/gpu/gpu_device.cc:2251] Cannot dlopen some GPU "
           "libraries.\nSkipping registering GPU devices...\n")


def test_a_run_that_falls_back_to_the_cpu_and_goes_on_is_answered_by_the_fallback(diagnoser):
    d = diagnoser.diagnose_text(JAX_ON_CPU + PROGRESS)
    assert d.root is not None and d.root.entry.id == "no-gpu-visible" and d.confidence == "low"


def test_tensorflows_gpu_warnings_alone_in_a_healthy_run_are_no_failure(diagnoser):
    # transformers and tensorflow-datasets import TensorFlow into PyTorch and JAX jobs, whose GPU is fine
    d = diagnoser.diagnose_text(TF_SKIP + PROGRESS + "Evaluation finished: accuracy 0.812\n")
    assert d.root is None and d.findings == []


def test_an_exception_that_ended_a_run_on_the_cpu_is_the_answer_and_the_fallback_is_related(diagnoser):
    d = diagnoser.diagnose_text(JAX_ON_CPU + TF_SKIP + PROGRESS + CHILD + "\nExited with exit code 1.\n")
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert {f.entry.id: f.role for f in d.findings}["no-gpu-visible"] == "related"


def test_a_run_on_the_cpu_that_its_owner_killed_is_answered_by_the_fallback(diagnoser):
    d = diagnoser.diagnose_text(JAX_ON_CPU + TF_SKIP + PROGRESS + "TERM_OWNER: job killed by owner.\nExited with exit code 130.\n")
    assert d.root is not None and d.root.entry.id == "no-gpu-visible"
    assert {f.entry.id: f.role for f in d.findings}["job-cancelled"] == "collateral"


DYNAMO = "".join(f"[2023-11-29 11:05:1{i},310] torch._dynamo.convert_frame: [WARNING] {line}\n" for i, line in enumerate([
    "WON'T CONVERT forward /workspace/model.py line 88", "due to: ", "Traceback (most recent call last):",
    "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
    "FileNotFoundError: [Errno 2] No such file or directory: 'ldconfig'"]))


def test_an_exception_a_warning_quotes_is_no_failure(diagnoser):
    # torch.compile falls back to eager and training goes on until the time limit
    d = diagnoser.diagnose_text(DYNAMO + PROGRESS + "TERM_RUNLIMIT: job killed after reaching LSF run time limit.\n")
    assert d.root is not None and d.root.entry.id == "slurm-time-limit"
    assert "file-not-found" not in {f.entry.id for f in d.findings}
    assert diagnoser.diagnose_text(DYNAMO + PROGRESS + "Training completed.\n").root is None


def test_the_same_exception_raised_is_the_answer(diagnoser):
    raised = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n" \
             "FileNotFoundError: [Errno 2] No such file or directory: 'ldconfig'\n"
    d = diagnoser.diagnose_text(PROGRESS + raised)
    assert d.root is not None and d.root.entry.id == "file-not-found"


def test_a_paste_that_starts_inside_a_traceback_is_a_traceback(diagnoser):
    # the header was cut off: the frames still say the exception was raised through them
    frames = ('[rank0]:   File "/opt/levanter/src/levanter/utils/jax_utils.py", line 75, in multihost_broadcast_sync\n'
              '[rank0]:     client.wait_at_barrier("sync0", timeout_in_ms=120000)\n'
              '[rank0]: jaxlib.xla_extension.XlaRuntimeError: INVALID_ARGUMENT: barrier id sync0 already used.\n')
    d = diagnoser.diagnose_text(frames + "[rank0]: Additional GRPC error information from remote target\n" * 4)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.first.text.startswith("[rank0]: jaxlib.xla_extension.XlaRuntimeError")


def test_an_exception_after_the_last_progress_line_ended_the_run_however_long_the_dump_after_it(diagnoser):
    # a runtime prints a long native error dump after the Python exception: more than 40 lines
    dump = "".join(f"        rtStreamSynchronize execute failed, reason=[device fault {i}][FILE:stream.cc]\n" for i in range(60))
    d = diagnoser.diagnose_text(PROGRESS + CHILD + dump)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    # the same exception with training going on after it was handled
    assert diagnoser.diagnose_text(PROGRESS + CHILD + dump + PROGRESS.replace("09:", "10:") + dump).root is None


RAY_DRIVER = ("(pid=4411) Update policy: 100%|██████████| 5/5 [01:53<00:00, 22.6s/it]\n"
              "Traceback (most recent call last):\n"
              '  File "/workspace/rl/trainer/main.py", line 94, in run\n'
              "    trainer.fit()\n"
              "ray.exceptions.RayTaskError({inner}): ray::WorkerDict.compute_log_probs() (pid=4502, ip=10.0.0.2, "
              "actor_id=11af29bb9fed89a5977131d901000000)\n"
              '  File "/workspace/rl/workers/fsdp_workers.py", line 585, in compute_log_probs\n'
              "    output = self.actor.compute_log_prob(data=data)\n")


def test_the_builtin_exception_a_ray_wrapper_names_is_the_childs_error(diagnoser):
    # the paste stops inside the remote traceback, before the child's own "IndexError: ..." line
    d = diagnoser.diagnose_text(RAY_DRIVER.format(inner="IndexError"))
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == "IndexError"
    # a type Ray itself raises for a dead actor is no exception of the child's code
    d = diagnoser.diagnose_text(RAY_DRIVER.format(inner="ActorDiedError"))
    assert d.root is not None and d.root.entry.id == "ray-worker-died"


def test_an_exception_before_the_others_time_out_started_it(diagnoser):
    # rank 1 dies of an error no entry knows; the others wait in a broadcast until the watchdog fires
    log = PROGRESS + """[rank1]: Traceback (most recent call last):
[rank1]:   File "/workspace/ppo/trainer.py", line 512, in load_state
[rank1]:     torch.set_rng_state(state["rng"])
[rank1]: RuntimeError: Invalid mt19937 state
[rank0]:[E ProcessGroupNCCL.cpp:456] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank0]: what():  [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=696, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1802763 milliseconds before timing out.
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.first.text.endswith("RuntimeError: Invalid mt19937 state")
    # the same exception handled early in the run, with training logged after it: the time-out stands
    handled = log.replace(PROGRESS, "").replace("[rank0]:[E", PROGRESS + "[rank0]:[E", 1)
    assert diagnoser.diagnose_text(handled).root.entry.id == "nccl-timeout"


def test_a_notebook_paste_that_stops_before_the_exception_line_names_it_from_the_header(diagnoser):
    cell = """---------------------------------------------------------------------------
KeyError                                  Traceback (most recent call last)
Cell In[7], line 3
      1 for batch in loader:
----> 3     loss = model(batch["pixel_values"], batch["labels"])
File ~/envs/vit/lib/python3.11/site-packages/transformers/feature_extraction_utils.py:87, in BatchFeature.__getitem__(self, item)
     85 if isinstance(item, str):
---> 87     return self.data[item]
"""
    d = diagnoser.diagnose_text(cell)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == "KeyError"


def test_a_notebook_paste_cut_below_its_header_counts_ipythons_frame_arrows_as_a_traceback(diagnoser):
    cell = """/usr/local/lib/python3.10/dist-packages/datasets/builder.py in _download(self, url)
    412         if bad_splits:
--> 413             raise NonMatchingSplitsSizesError(str(bad_splits))
    414

NonMatchingSplitsSizesError: [{'expected': SplitInfo(name='train', num_bytes=2254180000), 'recorded': SplitInfo(name='train', num_bytes=2126051000)}]
* Expected: 2.10 GiB
* Got: 1.98 GiB
See the dataset card for mirrors.
"""
    d = diagnoser.diagnose_text(cell)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == "NonMatchingSplitsSizesError"


def test_a_private_exception_class_that_ends_the_run_is_the_answer(diagnoser):
    log = PROGRESS + """Traceback (most recent call last):
  File "/workspace/quantize.py", line 41, in <module>
    scale = torch.linalg.cholesky(hessian)
torch._C._LinAlgError: linalg.cholesky: The factorization could not be completed because the input is not positive-definite (the leading minor of order 4096 is not positive-definite).
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == "torch._C._LinAlgError"


@pytest.mark.parametrize("last", [
    "pyarrow.lib.ArrowInvalid: Empty CSV file",
    "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
    "[rank0]: subprocess.TimeoutExpired: Command '['nvidia-smi']' timed out after 30 seconds",
    "pyarrow.lib.ArrowTypeError: Expected bytes, got a 'int' object",  # known to the scan as well
])
def test_a_module_qualified_exception_class_without_an_error_suffix_ends_the_run(diagnoser, last):
    log = PROGRESS + f"""Traceback (most recent call last):
  File "/workspace/prepare.py", line 31, in <module>
    run(reader)
  File "/usr/lib/python3.10/multiprocessing/pool.py", line 868, in next
    raise value
{last}
"""
    d = diagnoser.diagnose_text(log + "wandb: Waiting for W&B process to finish... (failed 1).\n")
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == last.split(": ", 2)[-2].removeprefix("[rank0]: ")
    assert [h.line for h in d.root.hits] == [log.count("\n")]  # its own line, once


def test_a_module_qualified_exception_that_ends_a_paste_without_its_traceback_is_the_answer(diagnoser):
    warnings = "".join(f"W0110 12:27:0{i}.332000 158 torch/_dynamo/convert_frame.py:1551] [2/{i}] torch._dynamo hit "
                       f"config.recompile_limit (8)\n" for i in range(4))
    last = "torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True.\n"
    d = diagnoser.diagnose_text(PROGRESS + warnings + "\n" + last)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    assert d.root.groups.get("exception") == "torch._dynamo.exc.FailOnRecompileLimitHit"
    assert diagnoser.diagnose_text(PROGRESS + warnings + last + PROGRESS).root is None  # training went on


LOGGED = """Could not load the native library: 'NoneType' object has no attribute 'split'
Traceback (most recent call last):
  File "/opt/venv/lib/python3.12/site-packages/quantlib/cextension.py", line 85, in <module>
    lib = get_native_library()
  File "/opt/venv/lib/python3.12/site-packages/quantlib/cuda_specs.py", line 24, in get_cuda_version_tuple
    major, minor = map(int, torch.version.cuda.split("."))
AttributeError: 'NoneType' object has no attribute 'split'
"""


def test_a_traceback_a_handler_logged_under_the_error_and_went_on_from_is_no_failure(diagnoser):
    went_on = LOGGED + "\nSetup failed; falling back to the slow path.\nDevice set to use cuda:0\nGenerating 16 samples\nDone.\n"
    assert diagnoser.diagnose_text(PROGRESS + went_on).root is None
    # the same handler re-raising: Python prints the traceback again, under no quoting line
    reraised = LOGGED + "\nDuring startup.\n" + LOGGED.split("\n", 1)[1] + "\n".join(["", "", "", ""])
    d = diagnoser.diagnose_text(PROGRESS + reraised)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    # and a paste that ends on the logged traceback still names it: nothing shows the run went on
    d = diagnoser.diagnose_text(PROGRESS + LOGGED)
    assert d.root is not None and d.root.entry.id == "python-user-code-error"
    # an ERROR record of the message is code that logs and raises: Python's report of it follows
    logged_error = "E0511 13:34:09.379575 231 cextension.py:64] " + LOGGED
    d = diagnoser.diagnose_text(PROGRESS + logged_error + "\nJob in error state, exit code 1\n\n>seq1\nMKTAYIAK\n")
    assert d.root is not None and d.root.entry.id == "python-user-code-error"


def test_an_unknown_wording_of_a_refused_path_is_permission_denied_by_its_class(diagnoser):
    log = PROGRESS + """Traceback (most recent call last):
  File "/workspace/train.py", line 57, in prepare_run_dir
    raise PermissionError(f"run directory {path} is owned by another user")
PermissionError: run directory /scratch/team/runs/exp-0007 is owned by another user
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "permission-denied" and d.confidence == "low"
    assert "exp-0007" in d.root.first.text


def test_the_class_a_ray_wrapper_names_picks_the_entry_that_explains_it(diagnoser):
    log = """(_train_tune pid=41172) Global seed set to 1
2024-10-02 09:52:35,231\tERROR tune_controller.py:1502 -- Trial task failed for trial _train_tune_0a1b2_00000
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/ray/_private/worker.py", line 2667, in get
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(FileNotFoundError): ray::ImplicitFunc.train() (pid=41172, ip=10.0.0.7, repr=_train_tune)
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "file-not-found"
    assert d.root.groups.get("exception") == "FileNotFoundError"


def test_an_error_logged_before_the_worker_group_succeeded_ended_nothing(diagnoser):
    log = """[2025-01-22 17:40:02,551] torch.distributed.elastic.agent.server.api: [INFO] [default] worker group successfully finished. Waiting 300 seconds for other agents to finish.
E0122 17:45:02.901000 140021 torch/distributed/elastic/agent/server/api.py:1191] Error waiting on exit barrier. Elapsed: 300.35 seconds
E0122 17:45:02.901000 140021 torch/distributed/elastic/agent/server/api.py:1191] Traceback (most recent call last):
E0122 17:45:02.901000 140021 torch/distributed/elastic/agent/server/api.py:1191]     store.wait([last_member_key])
E0122 17:45:02.901000 140021 torch/distributed/elastic/agent/server/api.py:1191] torch.distributed.DistStoreError: Stop_waiting response is expected
[2025-01-22 17:45:03,004] torch.distributed.elastic.agent.server.api: [INFO] Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish
"""
    assert diagnoser.diagnose_text(log).root is None


def test_a_paste_cut_inside_a_traceback_names_its_last_frame(diagnoser):
    log = PROGRESS + """Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    main()
  File "/workspace/train.py", line 61, in main
    trainer.fit(model, datamodule=dm)
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "python-user-code-error" and d.confidence == "low"
    assert d.root.first.line == 204 and 'line 61, in main' in d.root.first.text


def test_a_paste_cut_inside_a_traceback_through_a_known_function_names_that_entry(diagnoser):
    log = PROGRESS + """Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    main()
  File "/workspace/train.py", line 31, in main
    dist.init_process_group("nccl")
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 1305, in init_process_group
    store, rank, world_size = next(rendezvous_iterator)
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/rendezvous.py", line 246, in _env_rendezvous_handler
    store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout)
"""
    d = diagnoser.diagnose_text(log)
    assert d.root is not None and d.root.entry.id == "rendezvous-failure"
    # the same frames with training logged after them: no traceback was cut there, nothing failed
    assert diagnoser.diagnose_text(log + PROGRESS).root is None


@pytest.mark.parametrize("ending", [
    '  File "/workspace/train.py", line 61 in main\n',  # faulthandler's dump of a live process: no comma
    '  File "/workspace/train.py", line 61, in main\n    trainer.fit(model)\nstep 5 loss 1.2\n',
])
def test_a_log_that_does_not_end_inside_a_traceback_names_no_cut_frame(diagnoser, ending):
    assert diagnoser.diagnose_text(PROGRESS + ending).root is None
