"""The Xid table (knowledge/xids.yaml): every Xid of NVIDIA's catalog with its resolution buckets.

The GPU entries choose their fix steps by the catalog action of the Xid a log shows; this module
loads and checks the table and answers which Xid of several decides, and what it means in words.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

import knowledge as shipped

NO_XID = "NO_XID"  # the class of a finding whose log names no Xid number
UNLISTED = "UNLISTED"  # the class of an Xid the catalog gives no action for


class XidTableError(ValueError):
    """A table that cannot be used; the message names the file, the row and the remedy."""


@dataclass(frozen=True)
class Xid:
    number: int
    mnemonic: str
    meaning: str
    action: str  # the bucket the fix steps follow: the immediate action, or that of the Xid it adds to
    immediate: str | None
    investigatory: str | None
    applies: tuple[str, ...]
    entry: str | None


@dataclass(frozen=True)
class XidTable:
    xids: dict[int, Xid]
    actions: dict[str, str]  # bucket -> what it asks for, most disruptive first
    source: str

    def worst(self, numbers: list[str]) -> Xid | None:
        """Of the Xid numbers a log shows, the one whose action is the most disruptive (then the first)."""
        known = [self.xids[int(n)] for n in numbers if n.isdigit() and int(n) in self.xids]
        order = list(self.actions)
        return min(known, key=lambda x: order.index(x.action), default=None)

    def placeholders(self, xid: Xid) -> dict[str, str]:
        """What {xid}, {xid_mnemonic}, {xid_action}, {xid_means}, {xid_meaning} and {xid_investigate} say."""
        out = {"xid": str(xid.number), "xid_mnemonic": xid.mnemonic, "xid_meaning": xid.meaning,
               "xid_action": xid.action, "xid_means": self.actions[xid.action]}
        if xid.investigatory:
            out["xid_investigate"] = xid.investigatory
        return out


@cache
def _validator():
    import jsonschema  # only needed while loading

    return jsonschema.Draft202012Validator(json.loads(shipped.XIDS_SCHEMA.read_text()))


def _row_name(data: dict, path) -> str:
    parts = list(path)
    if len(parts) >= 2 and parts[0] == "xids" and isinstance(parts[1], int):
        row = data["xids"][parts[1]]
        number = row.get("xid") if isinstance(row, dict) else None
        rest = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[2:])
        return f"xids[{parts[1]}]" + (f" (Xid {number})" if number is not None else "") + rest
    return ".".join(str(p) for p in parts) or "(top level)"


def _schema_check(path: Path, text: str, data: dict, validated=None) -> None:
    """Validate against the schema, unless this very text passed before: the check (and importing
    jsonschema) is a quarter of the command line's start-up. `validated` is the loader's cache of
    validated texts (bot/kb/load.py), keyed here by the schema and the table's text."""
    key = validated.key(shipped.XIDS_SCHEMA.read_text(encoding="utf-8") + text) if validated is not None else None
    if key is not None and validated.get(key) is not None:
        return
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        hint = " (a row has either `meaning` or `unused: true`)" if err.validator == "oneOf" else ""
        raise XidTableError(f"{path}: {_row_name(data, err.absolute_path)}: {err.message}{hint}; "
                            "knowledge/xids.schema.json lists the fields")
    if key is not None:
        validated.put(key, True)


def _rows(path: Path, data: dict) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for i, row in enumerate(data["xids"]):
        if row["xid"] in rows:
            raise XidTableError(f"{path}: xids[{i}] (Xid {row['xid']}): listed twice; keep one row per Xid")
        if row.get("immediate") and row["immediate"] not in data["_actions"]:
            raise XidTableError(f"{path}: xids[{i}] (Xid {row['xid']}).immediate: {row['immediate']!r} is not one of the "
                                f"actions at the top of the file; add it there or fix the spelling")
        if "with" in row and row["with"] not in {r["xid"] for r in data["xids"]}:
            raise XidTableError(f"{path}: xids[{i}] (Xid {row['xid']}).with: no row for Xid {row['with']}")
        rows[row["xid"]] = row
    return rows


def _action(row: dict, rows: dict[int, dict]) -> str:
    if row.get("immediate"):
        return row["immediate"]
    if "with" in row:
        return _action(rows[row["with"]], rows)
    return UNLISTED


def load(path: Path | None = None, validated=None) -> XidTable:
    """Read and check the table; raise XidTableError naming the row and what to fix. With the
    loader's cache of validated texts (`validated`), a table that passed before is not checked again."""
    path = path or shipped.XIDS
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise XidTableError(f"{path}: cannot read it as YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise XidTableError(f"{path}: the file must hold one mapping (source, actions, xids)")
    _schema_check(path, text, data, validated)
    actions = {a["name"]: a["means"] for a in data["actions"]}
    for needed in (NO_XID, UNLISTED):
        if needed not in actions:
            raise XidTableError(f"{path}: actions: add the class {needed} (the steps of a log without an Xid, "
                                "or with one the catalog gives no action for)")
    rows = _rows(path, {**data, "_actions": actions})
    xids = {
        n: Xid(n, row["mnemonic"], row.get("meaning", "unused on Ampere and newer GPUs (deprecated, or V100 and older)"),
               _action(row, rows), row.get("immediate"), row.get("investigatory"), tuple(row["applies"]), row.get("entry"))
        for n, row in sorted(rows.items())
    }
    return XidTable(xids, actions, data["source"])
