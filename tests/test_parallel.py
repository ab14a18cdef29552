"""Many per-rank files scanned by several processes give the diagnosis one process gives."""
import gzip

import pytest

from bot.engine import trends
from bot.sources import parallel
from bot.sources.files import InputError, diagnose_files, scan_files


def _rank_file(folder, rank: int, failure: str = "") -> tuple[str, str]:
    lines = [f"[rank{rank}]: iteration {i:6d}/  90000 | lm loss: {2.0 - i / 1e5:.6E} | loss scale: 65536.0 | grad norm: 0.41 |"
             for i in range(1, 400)]
    lines.insert(200, f"[rank{rank}]: [2024-10-10 06:49:17,123] [INFO] saving checkpoint at iteration 200 to /ckpt/run7/iter_0000200")
    lines.insert(300, f"[rank{rank}]: wandb: Network error (ReadTimeout), entering retry loop.")
    if failure:
        lines.append(failure)
    path = folder / f"rank{rank:03d}.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path), path.name


def _summary(d):
    return (d.root.entry.id if d.root else None, d.initiating, d.progress, d.scan.lines, d.scan.bytes, d.scan.files,
            [(f.entry.id, f.role, [(h.file, h.line, h.text) for h in f.hits], f.ranks) for f in d.findings],
            d.warnings, [(m.file, m.line, m.text) for m in d.likely_errors()])


def test_a_parallel_scan_gives_the_same_diagnosis(diagnoser, tmp_path):
    oom = "[rank37]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 5 has a total capacity of 79.15 GiB"
    files = [_rank_file(tmp_path, r, oom if r == 37 else "") for r in range(64)]
    gz = tmp_path / "rank064.log.gz"
    gz.write_bytes(gzip.compress(b"[rank64]: wandb: Network error (ReadTimeout), entering retry loop.\n" * 50)[:-20])
    files.append((str(gz), gz.name))
    alone = diagnoser.analyse(scan_files(diagnoser, files, None))
    together = diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=3))
    assert _summary(together) == _summary(alone)
    assert together.root.entry.id == "cuda-oom" and together.root.first.file == 37
    assert together.progress == {"iteration": 399, "checkpoint": "/ckpt/run7/iter_0000200"}
    assert any("truncated" in w for w in together.warnings)
    assert sorted(next(f for f in together.findings if f.entry.id == "cuda-oom").ranks) == [37]


def test_what_each_files_last_lines_say_survives_the_merge_of_workers(diagnoser, tmp_path):
    """A file's last 4 KiB are read in the worker that scans it (a traceback a handler logged and went
    on from; an exception whose class has no Error suffix): their line numbers move with the merge."""
    logged = ("Could not load the native library: 'NoneType' object has no attribute 'split'\n"
              "Traceback (most recent call last):\n  File \"/opt/lib/cext.py\", line 85, in <module>\n"
              "    lib = load()\nAttributeError: 'NoneType' object has no attribute 'split'\n"
              "Falling back to the slow path.\nDevice set to use cuda:0\nstep 400 done\nstep 401 done")
    raised = ("Traceback (most recent call last):\n  File \"/workspace/prep.py\", line 31, in <module>\n"
              "    run(reader)\npyarrow.lib.ArrowInvalid: Empty CSV file")
    files = [_rank_file(tmp_path, r, {40: logged, 41: raised}.get(r, "")) for r in range(48)]
    alone = diagnoser.analyse(scan_files(diagnoser, files, None))
    together = diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=3))
    assert _summary(together) == _summary(alone)
    assert together.root.entry.id == "python-user-code-error"
    assert (together.root.first.file, together.root.groups["exception"]) == (41, "pyarrow.lib.ArrowInvalid")
    assert not any(f.first.file == 40 for f in together.findings)


def test_a_binary_among_the_files_is_the_same_clear_error(diagnoser, tmp_path):
    files = [_rank_file(tmp_path, r) for r in range(4)]
    (tmp_path / "core").write_bytes(b"\x7fELF" + bytes(5000))
    files.insert(2, (str(tmp_path / "core"), "core"))
    with pytest.raises(InputError, match="core: this is an ELF executable"):
        parallel.scan(diagnoser, files, None, workers=2)


def test_small_jobs_stdin_and_missing_files_stay_in_this_process(diagnoser, tmp_path):
    files = [_rank_file(tmp_path, r) for r in range(8)]
    assert parallel.workers_for(files) == 1  # 8 small files: starting processes costs more
    assert parallel.workers_for([("-", "<stdin>")] * 2) == 1
    assert parallel.workers_for(files + [(str(tmp_path / "gone.log"), "gone.log")]) == 1
    with pytest.raises(InputError, match="gone.log: cannot open it"):
        diagnose_files(diagnoser, files + [(str(tmp_path / "gone.log"), "gone.log")])


def _big_log(path, lines: int = 30000, failure: str = "") -> tuple[str, str]:
    """One file of a 64-rank job: progress, every rank's checkpoints, retries, handled errors."""
    out = []
    for i in range(lines):
        r = i % 64
        if i % 97 == 0:
            out.append(f"[rank{r}]: [2024-10-10 06:{i // 600 % 60:02d}:{i // 10 % 60:02d},123] [INFO] saving checkpoint at iteration {i} to /ckpt/run7/iter_{i:07d}")
        elif i % 89 == 0:
            out.append(f"[rank{r}]: wandb: Network error (ReadTimeout), entering retry loop.")
        elif i % 1009 == 0:
            out.append(f"[rank{r}]: ValueError: could not parse sample {i}, skipping")
        else:
            out.append(f"[rank{r}]:  iteration {i:8d}/  100000 | lm loss: {2.0 - i / 1e6:.6E} | loss scale: 65536.0 | grad norm: 0.41 |")
    path.write_text("\n".join(out) + "\n" + failure)
    return str(path), path.name


def test_a_big_file_cut_into_pieces_gives_the_same_diagnosis(diagnoser, tmp_path):
    oom = "[rank37]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 5 has a total capacity of 79.15 GiB\n"
    files = [_big_log(tmp_path / "job.log", failure=oom)]
    alone = diagnoser.analyse(scan_files(diagnoser, files, None))
    cuts = parallel.line_starts(files[0][0], 3)
    assert len(cuts) == 4 and all(open(files[0][0], "rb").read()[c - 1:c] == b"\n" for c in cuts[1:-1])
    together = diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=3))
    assert _summary(together) == _summary(alone)
    assert together.root.entry.id == "cuda-oom" and together.root.first.line == 30001
    assert together.progress == alone.progress and together.progress["iteration"] == 29999


def test_the_trend_series_of_a_file_in_pieces_carries_over_the_cuts(diagnoser, tmp_path):
    """The loss scale falls to its floor exactly where the last piece starts: that it was higher
    before is known only from the pieces before it, through the replay of their values."""
    fall = 40002  # lines of equal length: the third cut lands on this line's start
    lines = [f"[rank0]:  iteration {i:8d}/  100000 | lm loss: {2.0:.6E} | loss scale: {65536.0 if i < fall else 1.0:9.1f} | "
             f"grad norm: 0.41 | number of skipped iterations: {int(i >= fall):3d} |" for i in range(1, 60001)]
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    start = sum(len(line) + 1 for line in lines[:fall - 1])
    assert parallel.line_starts(str(path), 3)[2] == start
    files = [(str(path), path.name)]
    alone = diagnoser.analyse(scan_files(diagnoser, files, None))
    together = diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=3))
    assert {f.entry.id for f in together.findings} == {f.entry.id for f in alone.findings} == {"fp16-loss-scale"}
    # the windows read fall elsewhere in pieces: the same judgement, quoted at a line past the fall
    floor = next(h for h in together.root.hits if "to its floor 1" in h.text)
    assert floor.line >= fall and "loss scale:       1.0" in floor.text
    # the last piece alone never saw the scale higher than 1: no floor without the replay
    with open(path, "rb") as f:
        f.seek(start)
        piece = diagnoser.scanner.scan_piece(f, start)
    summary = trends.Summary()
    piece.recording.replay(summary, 0)
    assert not [t for t in summary.judge(None, None, None) if t.kind == trends.SCALE_FLOOR_KIND]


def test_a_gzip_file_or_a_capped_scan_is_not_cut(diagnoser, tmp_path):
    path, _ = _big_log(tmp_path / "job.log")
    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read()))
    files = [(str(gz), gz.name)]
    assert _summary(diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=2))) == \
        _summary(diagnoser.analyse(scan_files(diagnoser, files, None)))
    capped = parallel.scan(diagnoser, [(path, "job.log")], 1 << 20, workers=2)
    assert capped.bytes == 1 << 20 and any("cap" in w for w in capped.warnings)


def test_a_binary_file_alone_is_refused_before_it_is_cut(diagnoser, tmp_path):
    (tmp_path / "core").write_bytes(b"\x7fELF" + bytes(50000))
    with pytest.raises(InputError, match="core: this is an ELF executable"):
        parallel.scan(diagnoser, [(str(tmp_path / "core"), "core")], None, workers=2)


def test_line_starts_step_over_a_line_longer_than_a_read(tmp_path):
    path = tmp_path / "long.log"
    path.write_bytes(b"a\n" + b"x" * 300_000 + b"\nb\n" + b"y" * 10 + b"\n")
    cuts = parallel.line_starts(str(path), 4)
    assert cuts[0] == 0 and cuts[-1] == path.stat().st_size
    assert all(path.read_bytes()[c - 1:c] == b"\n" for c in cuts[1:-1]) and cuts == sorted(set(cuts))


def test_one_big_plain_file_gets_several_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_BYTES", 1 << 10)
    monkeypatch.setattr(parallel, "_busy", lambda: 0)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda _pid: {0, 1})
    path, name = _big_log(tmp_path / "job.log", lines=200)
    assert parallel.workers_for([(path, name)]) == 2
    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress(b"x\n" * 5000))
    assert parallel.workers_for([(str(gz), gz.name)]) == 1


def test_a_parallel_job_of_rank_files_keeps_every_ranks_hits_counted(diagnoser, tmp_path):
    """Workers' results merge keeping five first and five last hits: a rank whose lines fall
    between them is still among the ranks the failure was seen on."""
    files = []
    for rank in range(16):
        lines = [f"[rank{rank}]: iteration {i}/ 90 | lm loss: 2.0 |" for i in range(30)]
        lines.append(f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
        (tmp_path / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
        files.append((str(tmp_path / f"rank{rank}.log"), f"rank{rank}.log"))
    d = diagnoser.analyse(parallel.scan(diagnoser, files, None, workers=2))
    assert d.root.entry.id == "cuda-oom"
    assert d.root.ranks == list(range(16))
