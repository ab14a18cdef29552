"""Many per-rank files scanned by several processes give the diagnosis one process gives."""
import gzip

import pytest

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
