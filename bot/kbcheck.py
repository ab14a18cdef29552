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


@dataclass
class Scored:
    case: str
    want: str
    got: str | None
    top3: list[str]
    confidence: str | None
    right: bool
    in_top3: bool


@dataclass
class ScoreReport:
    """How the diagnosis does on labelled logs (a folder with labels.yaml, as ../shared/real-logs)."""

    cases: list[Scored]

    def share(self, attr: str, healthy: bool = False) -> tuple[int, int]:
        pool = [c for c in self.cases if (c.want == "none") == healthy]
        return sum(getattr(c, attr) for c in pool), len(pool)

    def by_confidence(self) -> dict[str, tuple[int, int]]:
        """Per confidence word: (right, answers) over the failing logs."""
        out = {}
        for word in ("high", "medium", "low"):
            answered = [c for c in self.cases if c.want != "none" and c.confidence == word]
            out[word] = (sum(c.right for c in answered), len(answered))
        return out

    @property
    def false_alarms(self) -> list[Scored]:
        """Healthy logs answered with an entry their label does not accept (also_ok may name one:
        a healthy run that did log a real, recovered warning)."""
        return [c for c in self.cases if c.want == "none" and not c.right]


def _want(label: dict) -> str:
    """The labelled root; a healthy log is `root: none`, or an empty root (YAML null)."""
    return label["root"] or "none"


def _accepted(label: dict) -> set[str | None]:
    ok = {_want(label), *label.get("also_ok", [])}
    return {None if x == "none" else x for x in ok}


def score(diagnoser: Diagnoser, folder: Path) -> ScoreReport:
    """Diagnose every case of folder/labels.yaml and compare with its label (root, also_ok)."""
    import yaml

    labels = yaml.safe_load((folder / "labels.yaml").read_text()) or []
    cases = []
    for label in labels:
        d = diagnose_paths(diagnoser, [str(folder / label["case"])])
        got = d.root.entry.id if d.root else None
        ranked = [f.entry.id for f in d.findings[:3]] or [None]
        accepted = _accepted(label)
        cases.append(Scored(label["case"], _want(label), got, ranked, d.confidence, got in accepted,
                            bool(accepted & set(ranked))))
    return ScoreReport(cases)


def format_score(report: ScoreReport, only_misses: bool = False) -> str:
    rows = [f"{'MISS' if not c.right else 'ok  '} {c.case}: got {c.got} ({c.confidence}), want {c.want}"
            for c in report.cases if not (only_misses and c.right)]
    right, failing = report.share("right")
    top3, _ = report.share("in_top3")
    healthy = report.share("right", healthy=True)[1]
    rows.append(f"failing logs: top-1 {right}/{failing} ({right / max(failing, 1):.0%}), "
                f"top-3 {top3}/{failing} ({top3 / max(failing, 1):.0%}); "
                f"healthy logs: {len(report.false_alarms)} false alarms of {healthy}")
    rows.append("confidence   answers   right")
    for word, (ok, n) in report.by_confidence().items():
        rows.append(f"{word:<10} {n:>9} {ok:>7}" + (f"  ({ok / n:.0%})" if n else ""))
    return "\n".join(rows)
