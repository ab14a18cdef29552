"""The streaming scan: line numbers, chunk boundaries, odd bytes, both engines, bounded evidence."""
import gzip
import io

import pytest
from conftest import ENGINES, entry_yaml, write_entries

from bot.engine.diagnose import Diagnoser
from bot.engine import scan
from bot.engine.scan import EVIDENCE_CHARS
from bot.kb.load import load
from bot.match import engines
from bot.sources.files import diagnose_streams

BOOM = "KABOOM at step (?P<step>[0-9]+)"


@pytest.fixture(scope="module")
def tiny_kb(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kb")
    write_entries(
        folder,
        entry_yaml("boom", BOOM),
        entry_yaml("after-shock", r"aftershock detected", role="cascade", strength=0.6),
    )
    return load([folder])


def _diagnose(kb, text: bytes, engine: str, chunk: int = 1 << 16):
    return diagnose_streams(Diagnoser(kb, chunk_bytes=chunk, engine_name=engine), [("log", io.BytesIO(text))])


def _log(n_lines: int = 300, boom_at: int = 250) -> bytes:
    lines = []
    for i in range(1, n_lines + 1):
        if i == boom_at:
            lines.append(f"[rank5]: KABOOM at step {i}")
        elif i == boom_at + 10:
            lines.append("[rank0]: aftershock detected")
        else:
            lines.append(f"[rank{i % 8}]: iteration {i}/ 1000 | loss 2.{i:03d} | lr 1e-4")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunk", [61, 257, 4096, 1 << 20])
def test_line_numbers_and_roles_do_not_depend_on_chunking_or_engine(tiny_kb, engine, chunk):
    d = _diagnose(tiny_kb, _log(), engine, chunk)
    assert d.root.entry.id == "boom"
    assert [h.line for h in d.root.hits] == [250]
    assert d.root.hits[0].rank == 5
    assert d.root.groups == {"step": "250"}
    assert [(f.entry.id, f.role, f.first.line) for f in d.findings[1:]] == [("after-shock", "collateral", 260)]
    assert d.scan.lines == 300
    assert d.progress == {"iteration": 249, "checkpoint": None}
    assert d.initiating == {"rank": 5, "host": None, "line": 250, "file": 0}


@pytest.mark.parametrize("engine", ENGINES)
def test_carriage_returns_of_progress_bars_start_lines_but_do_not_count(tiny_kb, engine):
    text = b"epoch 1\r 10%|#   | 1/10 [00:01<00:09]\r 20%|##  | 2/10 [00:02<00:08]KABOOM at step 2\nnext\n"
    d = _diagnose(tiny_kb, text, engine)
    assert d.root.first.line == 1
    assert d.root.first.text.endswith("KABOOM at step 2")
    assert d.scan.lines == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chunk_after_a_longer_one_with_carriage_returns_is_read_from_its_own_bytes(tiny_kb, engine):
    # the newline copy of a chunk goes to a buffer kept between chunks, still holding the first
    # chunk's bytes past the second one's end
    first = b"".join(b"%d\r" % i for i in range(100)) + b"KABOOM at step 1\n"
    second = b"x\rKABOOM at step 2\n"
    d = _diagnose(tiny_kb, first + second, engine, chunk=len(first) + 4)
    assert [h.line for h in d.root.hits] == [1, 2]
    assert [h.text[-1] for h in d.root.hits] == ["1", "2"]
    assert d.scan.hits[d.root.first.fingerprint].count == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_crlf_and_cr_only_files(tiny_kb, engine):
    crlf = b"a\r\nb\r\nKABOOM at step 3\r\n"
    assert _diagnose(tiny_kb, crlf, engine).root.first.line == 3
    cr_only = b"a\rb\rKABOOM at step 3\r"
    d = _diagnose(tiny_kb, cr_only, engine)
    assert d.root.entry.id == "boom"  # found even though the file has no newline at all


@pytest.mark.parametrize("engine", ENGINES)
def test_a_100k_character_line_is_scanned_and_the_evidence_clipped(tiny_kb, engine):
    line = "x" * 60_000 + " KABOOM at step 7 " + "y" * 40_000
    d = _diagnose(tiny_kb, f"first\n{line}\nlast\n".encode(), engine)
    hit = d.root.first
    assert hit.line == 2
    assert "KABOOM at step 7" in hit.text
    assert len(hit.text) <= EVIDENCE_CHARS + 2


def test_a_line_longer_than_the_buffer_is_split_not_lost(tiny_kb):
    text = b"z" * 5000 + b"\nKABOOM at step 1\n"
    d = _diagnose(tiny_kb, text, "re2", chunk=512)
    assert d.root.first.line == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_broken_utf8_and_nul_bytes(tiny_kb, engine):
    text = b"\xff\xfe\xc3(garbage\n\x00\x00\x00\x00\nKABOOM at step 9 \xe2\x82\n"
    d = _diagnose(tiny_kb, text, engine)
    assert d.root.first.line == 3
    assert "\ufffd" in d.root.first.text  # undecodable bytes shown, not fatal


def test_empty_input(tiny_kb):
    d = _diagnose(tiny_kb, b"", "re2")
    assert d.root is None and d.findings == [] and d.scan.lines == 0 and d.scan.bytes == 0


def test_no_match_keeps_the_likely_error_lines(tiny_kb):
    text = b"start\nWARNING something odd\nTraceback (most recent call last):\n  File \"t.py\", line 1\nValueError: bad value\nerror: the job failed\n"
    d = _diagnose(tiny_kb, text, "re2")
    assert d.root is None
    assert [(m.line, m.text) for m in d.likely_errors()] == [(5, "ValueError: bad value"), (6, "error: the job failed")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunk", [97, 700, 1 << 16])
def test_the_first_error_lines_of_a_noisy_log_are_kept_whatever_the_chunking(tiny_kb, engine, chunk):
    # the engine reports a chunk's first error line only; the scan looks for the next ones itself
    lines = [f"step {i} ok" if i % 3 else f"[rank{i % 4}] ERROR retry {i} failed" for i in range(1, 200)]
    lines[4] = "a terror-free line: preferror and errors are other words"
    d = _diagnose(tiny_kb, ("\n".join(lines) + "\n").encode(), engine, chunk)
    assert [m.line for m in d.scan.first_errors] == [3, 6, 9]
    assert d.scan.first_errors[1].text == "[rank2] ERROR retry 6 failed"


def test_secrets_never_reach_the_evidence(tiny_kb):
    text = b"KABOOM at step 1 while uploading with token=hf_abcdefghijklmnopqrstuvwxyz123456\n"
    d = _diagnose(tiny_kb, text, "re2")
    assert "hf_abc" not in d.root.first.text and "[REDACTED]" in d.root.first.text


def test_gzip_is_read_transparently_and_truncation_reported(tiny_kb):
    whole = gzip.compress(_log())
    d = _diagnose(tiny_kb, whole, "re2")
    assert d.root.first.line == 250 and not d.warnings
    cut = _diagnose(tiny_kb, whole[: len(whole) // 2], "re2")
    assert cut.warnings and "truncated" in cut.warnings[0]


def test_several_files_are_one_job_with_per_file_lines(tiny_kb):
    streams = [("rank0.log", io.BytesIO(b"ok\nok\n")), ("rank5.log", io.BytesIO(b"ok\n[rank5]: KABOOM at step 4\n"))]
    d = diagnose_streams(Diagnoser(tiny_kb, engine_name="re2"), streams)
    assert d.root.first.file == 1 and d.root.first.line == 2
    assert d.scan.lines == 4


def test_memory_per_fingerprint_is_bounded(tiny_kb):
    text = "".join(f"[rank{i % 64}]: KABOOM at step {i}\n" for i in range(20_000)).encode()
    d = _diagnose(tiny_kb, text, "re2")
    fph = next(iter(d.scan.hits.values()))
    assert fph.count == 20_000
    assert len(fph.hits) == 10  # first five and last five kept
    assert len(fph.ranks) == 64


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("failure_at_mb", [0.3, 1.0, 1.9])
def test_progress_before_a_failure_in_big_chunks(tiny_kb, engine, failure_at_mb):
    """Iteration lines fill the log; the one right before the failure is reported, wherever chunks end."""
    lines, size, it, before = [], 0, 0, None
    while size < 3 << 20:
        it += 1
        line = f"[rank0]: iteration {it:8d}/  900000 | lm loss: 1.9E+00 |"
        if before is None and size + len(line) >= failure_at_mb * (1 << 20):
            before = it - 1
            line = "[rank2]: KABOOM at step 1"
        lines.append(line)
        size += len(line) + 1
    d = _diagnose(tiny_kb, ("\n".join(lines) + "\n").encode(), engine, chunk=1 << 20)
    assert d.progress["iteration"] == before


@pytest.mark.parametrize("engine", ENGINES)
def test_lines_the_engine_reports_but_the_pattern_rejects_are_not_hits(tiny_kb, engine):
    """Hyperscan looks for a required literal ("KABOOM at step "); a chunk's many lines holding it
    without a step number are confirmed away in growing batches, and the real ones after them kept."""
    lines = [f"[rank{i % 8}]: KABOOM at step unknown" for i in range(500)]
    lines += [f"[rank{i}]: KABOOM at step {1000 + i}" for i in range(7)]
    d = _diagnose(tiny_kb, ("\n".join(lines) + "\n").encode(), engine)
    (fp, fph), = ((fp, fph) for fp, fph in d.scan.hits.items() if fp.entry == "boom")
    assert fph.count == 7
    assert [h.line for h in fph.hits] == [501, 502, 503, 504, 505, 506, 507]
    assert fph.hits[0].groups["step"] == "1000"
    assert d.root.entry.id == "boom" and d.root.ranks == list(range(7))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_job_of_rank_files_keeps_its_first_and_last_hits_and_every_rank(tiny_kb, engine):
    """A job keeps five first hits in all: the files after the one that gave them count their
    lines, keep the last ones and read their ranks, and what is kept is still confirmed."""
    streams = []
    for rank in range(6):
        lines = [f"[rank{rank}]: iteration {i}/ 90 | loss 2.0" for i in range(40)]
        lines += [f"[rank{rank}]: KABOOM at step {100 * rank + i}" for i in range(4)]
        lines.append(f"[rank{rank}]: KABOOM at step unknown")  # the engine's literal, not the pattern
        streams.append((f"rank{rank}.log", io.BytesIO(("\n".join(lines) + "\n").encode())))
    d = diagnose_streams(Diagnoser(tiny_kb, engine_name=engine), streams)
    (fph,) = (fph for fp, fph in d.scan.hits.items() if fp.entry == "boom")
    assert [(h.file, h.groups["step"]) for h in fph.first] == [(0, "0"), (0, "1"), (0, "2"), (0, "3"), (1, "100")]
    # a line the pattern rejects may take a last place and be dropped when confirmed
    last = [(h.file, h.groups["step"]) for h in fph.last]
    assert len(last) >= 4 and last[-4:] == [(5, "500"), (5, "501"), (5, "502"), (5, "503")]
    assert fph.ranks == set(range(6))
    assert fph.count >= 24


@pytest.mark.parametrize("engine", ENGINES)
def test_every_rank_is_counted_after_one_rank_repeated_a_thousand_times(tiny_kb, engine):
    """Spread reads slow down once repeats stop naming new ranks (every SPREAD_EVERY-th is read), and
    read every line again from the first new rank one of those finds: fewer than SPREAD_EVERY are missed."""
    lines = [f"[rank0]: KABOOM at step {i}" for i in range(3000)]
    lines += [f"[rank{r}]: KABOOM at step {5000 + r}" for r in range(1, 300)]
    d = _diagnose(tiny_kb, ("\n".join(lines) + "\n").encode(), engine)
    (fph,) = (fph for fp, fph in d.scan.hits.items() if fp.entry == "boom")
    assert fph.count == 3299 and fph.ranks <= set(range(300))
    assert len(fph.ranks) > 300 - scan.SPREAD_EVERY and set(range(20, 300)) <= fph.ranks


def test_the_re2_fallback_compiles_three_times_the_shipped_fingerprints(kb):
    # sites layer their own entries over the shipped ones; RE2's default memory held about 720 patterns
    patterns = [fp.pattern for fp in kb.fingerprints] * 3
    engine = engines.RE2Engine(patterns)
    line = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert engine.scan(line, 0, len(line))


@pytest.mark.parametrize("line, entry", [("run.sh: line 12: 40213 段错误 （核心已转储） python train.py", "segfault"),
                                         ("run.sh: line 12: 40213 总线错误 （核心已转储） python train.py", "shm-exhausted")])
def test_a_full_width_parenthesis_matches_under_every_engine(diagnoser, line, entry):
    d = diagnoser.diagnose_text(f"epoch 3 step 120 loss 1.92\n{line}\n")
    assert d.root is not None and d.root.entry.id == entry
