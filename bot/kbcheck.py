"""`trainmedic kb check`: every entry's examples and the benign corpus, run through the real engine."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import knowledge as shipped
from bot.engine.diagnose import Diagnoser, Diagnosis
from bot.kb import rules
from bot.kb.load import KnowledgeBase
from bot.match import engines
from bot.sources.files import diagnose_paths


@dataclass
class EntryReport:
    id: str
    fingerprints: int
    detectors: int
    positives: int = 0
    positives_ok: int = 0
    near_misses: int = 0
    near_misses_ok: int = 0
    xfail: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    entries: list[EntryReport]
    benign_files: int
    benign_failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.benign_failures and not any(e.failures for e in self.entries)


def _check_entry(diagnoser: Diagnoser, entry_id: str) -> EntryReport:
    entry = diagnoser.kb.get(entry_id)
    report = EntryReport(entry_id, len(entry.fingerprints), len(entry.detectors))
    report.failures += [f"command rule: {p}" for p in rules.problems(entry.data)]
    for ex in entry.data["examples"]["positive"]:
        d = diagnoser.diagnose_text(ex["log"], name=ex["name"])
        got = d.root.entry.id if d.root else None
        passed = got == entry_id
        if ex.get("xfail"):
            report.xfail += 1
            continue
        report.positives += 1
        hidden = hidden_by_redaction(d) if passed else []
        report.positives_ok += passed and not hidden
        if not passed:
            report.failures.append(f"positive {ex['name']!r}: diagnosed as {got or 'nothing'}")
        report.failures += [f"positive {ex['name']!r}: redaction hides what {fp} matched: {text!r}" for fp, text in hidden]
    for ex in entry.data["examples"]["near_miss"]:
        d = diagnoser.diagnose_text(ex["log"], name=ex["name"])
        hit = [f.entry.id for f in d.findings if f.entry.id == entry_id]
        if ex.get("xfail"):
            report.xfail += 1
            continue
        report.near_misses += 1
        report.near_misses_ok += not hit
        if hit:
            report.failures.append(f"near-miss {ex['name']!r}: matched {entry_id}")
    return report


def hidden_by_redaction(d: Diagnosis) -> list[tuple[str, str]]:
    """Root evidence lines (as shown: redacted) that no longer match the fingerprint that found them."""
    return [(h.fingerprint.id, h.text) for h in d.root.hits
            if h.fingerprint.detector is None and "…" not in h.text
            and not engines.re2_compile(h.fingerprint.pattern, text=True).search(h.text)]


def benign_files(folder: Path = shipped.BENIGN) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".log", ".txt", ".out", ".gz"))


def check(kb: KnowledgeBase, benign: Path = shipped.BENIGN) -> CheckReport:
    diagnoser = Diagnoser(kb)
    entries = [_check_entry(diagnoser, entry_id) for entry_id in sorted(kb.entries)]
    failures = []
    files = benign_files(benign) if benign.is_dir() else []
    for path in files:
        d = diagnose_paths(diagnoser, [str(path)])
        if d.findings:
            names = ", ".join(f"{f.entry.id} at line {f.first.line}" for f in d.findings)
            failures.append(f"{path.name}: healthy log matched {names}")
    return CheckReport(entries, len(files), failures)


def format_report(report: CheckReport) -> str:
    rows = [f"{'entry':32} {'fps':>4} {'positive':>9} {'near-miss':>10} {'xfail':>6}  status"]
    for e in report.entries:
        status = "ok" if not e.failures else "FAIL"
        rows.append(
            f"{e.id:32} {e.fingerprints:>4} {e.positives_ok:>4}/{e.positives:<4} {e.near_misses_ok:>5}/{e.near_misses:<4} {e.xfail:>6}  {status}"
        )
        rows += [f"    - {msg}" for msg in e.failures]
    total_fp = sum(e.fingerprints for e in report.entries)
    total_det = sum(e.detectors for e in report.entries)
    total_pos = sum(e.positives for e in report.entries)
    total_nm = sum(e.near_misses for e in report.entries)
    rows.append("")
    rows.append(
        f"{len(report.entries)} entries, {total_fp} fingerprints, {total_det} progress detectors, "
        f"{total_pos} positive and {total_nm} near-miss examples, "
        f"{report.benign_files} benign logs"
    )
    rows += [f"benign FAIL: {msg}" for msg in report.benign_failures]
    rows.append("kb check: " + ("ok" if report.ok else "FAILED"))
    return "\n".join(rows)
