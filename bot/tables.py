"""Rows of dicts as a terminal table, a markdown table, CSV or JSON (the incidents commands)."""
from __future__ import annotations

import csv
import io
import json

FORMATS = ("text", "json", "markdown", "csv")


def _cell(value) -> str:
    if value is None:
        return ""
    text = str(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:79] + "…"


def render(rows: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2, ensure_ascii=False)
    columns = columns or (list(rows[0]) if rows else [])
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    if not rows:
        return "(none)"
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells])
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    fmt_row = lambda row: "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt_row(columns)] + [fmt_row(row) for row in cells])
