"""A knowledge entry rendered as a page for a person (terminal text)."""
from __future__ import annotations

import textwrap

from bot.kb.load import Entry


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(" ".join(text.split()), 96, initial_indent=indent, subsequent_indent=indent)


def _steps(steps: list[dict]) -> list[str]:
    out = []
    for i, step in enumerate(steps, 1):
        when = f" [only when the Xid's catalog action is {' or '.join(step['xid_actions'])}]" if "xid_actions" in step else ""
        out += _wrap(f"{i}. {step['text']}{when}")
        if "command" in step:
            out.append(f"       $ {step['command']}")
        if "code" in step:
            out += [f"       | {line}" for line in step["code"].rstrip().split("\n")]
    return out


def entry_text(entry: Entry) -> str:
    d = entry.data
    out = [f"{d['title']}  [{d['id']}]", f"category: {d['category']}   tags: {', '.join(d['tags'])}", ""]
    out += ["Summary"] + _wrap(d["summary"]) + ["", "Mechanism"] + _wrap(d["mechanism"]) + ["", "Symptoms"]
    for s in d["symptoms"]:
        out += _wrap(f"- {s['symptom']}") + _wrap(f"-> {s['meaning']}", "      ")
    out += ["", "Root causes"] + [line for c in d["root_causes"] for line in _wrap(f"- {c}")]
    out += ["", "How to confirm"] + _steps(d["confirm"])
    out += ["", "Fix"] + _wrap(d["fix"]["summary"]) + _steps(d["fix"]["steps"])
    out += ["", "Verify", f"  $ {d['verify']}", "", "Prevention"]
    out += [line for p in d["prevention"] for line in _wrap(f"- {p}")]
    out += ["", "Affected", *(f"  - {a}" for a in d["affected"])]
    if d["related"]:
        out += ["", "Related: " + ", ".join(d["related"])]
    if d["caused_by"]:
        out += ["Commonly caused by: " + ", ".join(d["caused_by"])]
    out += ["", "Fingerprints"]
    for fp in entry.fingerprints:
        out += [f"  {fp.id} ({fp.role}, strength {fp.strength}): {fp.regex}"] + _wrap(fp.meaning, "      ")
    out += ["", "References", *(f"  - {r['title']}: {r['url']}" for r in d["references"])]
    return "\n".join(out)
