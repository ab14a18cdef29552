"""Load and validate the knowledge base: shipped entries, with site folders layered on top."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

import knowledge as shipped
from bot import __version__
from bot.config import cache_dir, write_cache
from bot.kb import xids as xid_table
from bot.match import engines

ROLES = ("root", "cascade", "confirm")


class KnowledgeError(Exception):
    """An entry that cannot be used; the message names the file, the field and the remedy."""


@dataclass(frozen=True)
class Fingerprint:
    entry: str
    id: str
    regex: str
    role: str
    strength: float
    meaning: str
    ignorecase: bool = False
    ends_run: bool = False  # a confirmation saying the process died (knowledge/README.md)
    recovers: bool = False  # the line says the failure before it was recovered from
    condition: bool = False  # a root line that states a condition (no GPU in use), no failure by itself
    logged_loss: bool = False  # the line logs a NaN/Inf loss value: a finite loss logged after it was recovered from
    frame: bool = False  # a traceback frame: a root only when the run's unmatched last exception was raised through it
    types: tuple[str, ...] = ()  # a last-exception detector's exception classes (none: any other)
    detector: str | None = None  # a bot/engine/trends.py kind instead of a regex
    group: str | None = None  # fingerprints sharing a group are one failure for linking repeats
    group_by: list[str] = field(default_factory=list, hash=False, compare=False)  # captures that tell failures apart

    @property
    def pattern(self) -> engines.Pattern:
        return engines.Pattern(self.regex, self.ignorecase)


@dataclass(frozen=True)
class Entry:
    id: str
    data: dict[str, Any]
    source: Path
    fingerprints: tuple[Fingerprint, ...] = field(default=())
    detectors: tuple[Fingerprint, ...] = field(default=())

    @property
    def title(self) -> str:
        return self.data["title"]

    @property
    def related(self) -> list[str]:
        return self.data["related"]

    @property
    def caused_by(self) -> list[str]:
        return self.data["caused_by"]

    @property
    def exit_signals(self) -> list[int]:
        return self.data.get("exit_signals", [])

    @property
    def wrapper(self) -> bool:
        """Tagged `wrapper`: it reports that a child process failed and says nothing of why."""
        return "wrapper" in self.data["tags"]


@dataclass(frozen=True)
class KnowledgeBase:
    entries: dict[str, Entry]
    xids: xid_table.XidTable  # NVIDIA's Xid catalog: the GPU entries' steps follow the Xid's action

    @property
    def fingerprints(self) -> list[Fingerprint]:
        return [fp for e in self.entries.values() for fp in e.fingerprints]

    def detectors(self, kind: str) -> list[Fingerprint]:
        return [d for e in self.entries.values() for d in e.detectors if d.detector == kind]

    def get(self, entry_id: str) -> Entry:
        try:
            return self.entries[entry_id]
        except KeyError:
            raise KnowledgeError(f"no knowledge entry {entry_id!r}; `trainmedic kb list` shows the ids") from None


@cache
def _validator():
    import jsonschema  # only needed while loading

    return jsonschema.Draft202012Validator(json.loads(shipped.SCHEMA.read_text()))


def _field_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _schema_problem(error) -> str:
    where = _field_path(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"field {where}: unknown field(s) {extra}: remove or rename them (knowledge/schema.json lists the fields)"
    if error.validator == "required":
        return f"field {where}: {error.message}: add it (knowledge/README.md describes each field)"
    return f"field {where}: {error.message}"


def parse_entry(path: Path, text: str | None = None) -> Entry:
    """Read and validate one entry file; raise KnowledgeError naming what to fix."""
    try:
        text = path.read_text(encoding="utf-8") if text is None else text
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KnowledgeError(f"{path}: cannot read it as YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise KnowledgeError(f"{path}: the file must hold one mapping (id: ..., title: ...)")
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        raise KnowledgeError(f"{path}: {_schema_problem(errors[0])}")
    if data["id"] != path.stem:
        raise KnowledgeError(f"{path}: field id: {data['id']!r} differs from the file name; rename the file to {data['id']}.yaml or fix the id")
    seen = set()
    for i, fp in enumerate(data["fingerprints"]):
        if fp["id"] in seen:
            raise KnowledgeError(f"{path}: field fingerprints[{i}].id: duplicate fingerprint id {fp['id']!r}; give each one its own id")
        seen.add(fp["id"])
        for flag, what in (("condition", "state a condition"), ("frame", "be a frame")):
            if fp.get(flag) and fp["role"] != "root":
                raise KnowledgeError(f"{path}: field fingerprints[{i}].{flag}: only a root fingerprint can {what}; "
                                     f"make {fp['id']!r} a root or drop {flag}")
        problem = engines.check(engines.Pattern(fp["regex"], fp.get("ignorecase", False)))
        if problem:
            raise KnowledgeError(f"{path}: field fingerprints[{i}].regex: {problem}")
    for i, d in enumerate(data.get("detectors", [])):
        if d.get("types") and d["kind"] != "last-exception":
            raise KnowledgeError(f"{path}: field detectors[{i}].types: only a last-exception detector names exception "
                                 f"types; drop types from {d['id']!r}")
    return _entry(path, data)


def _entry(path: Path, data: dict) -> Entry:
    fingerprints = tuple(Fingerprint(entry=data["id"], **fp) for fp in data["fingerprints"])
    detectors = tuple(
        Fingerprint(entry=data["id"], id=d["id"], regex="", role=d["role"], strength=d["strength"],
                    meaning=d["meaning"], detector=d["kind"], types=tuple(d.get("types", ())))
        for d in data.get("detectors", [])
    )
    return Entry(id=data["id"], data=data, source=path, fingerprints=fingerprints, detectors=detectors)


class _ValidatedCache:
    """Entries already validated, keyed by a hash of their text (and of the schema and engines).

    Validation is the slow part of a load (jsonschema, one regex compile per fingerprint); an entry
    whose text has not changed since it was last validated is taken from here.
    """

    def __init__(self) -> None:
        self.path = cache_dir() / "validated-entries.json"
        salt = f"{__version__}|{engines.hyperscan is not None}|".encode() + shipped.SCHEMA.read_bytes()
        self._salt = hashlib.sha256(salt).digest()
        try:
            self._old = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._old = {}
        self._new: dict[str, dict] = {}

    def key(self, text: str) -> str:
        return hashlib.sha256(self._salt + text.encode()).hexdigest()

    def get(self, key: str) -> dict | None:
        data = self._old.get(key)
        if data is not None:
            self._new[key] = data
        return data

    def put(self, key: str, data: dict) -> None:
        self._new[key] = data

    def save(self) -> None:
        if self._new.keys() == self._old.keys():
            return
        write_cache(self.path, json.dumps(self._new).encode())


def _load_file(path: Path, cache: _ValidatedCache) -> Entry:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KnowledgeError(f"{path}: cannot read it: {exc}") from None
    key = cache.key(text)
    data = cache.get(key)
    if data is not None and data.get("id") == path.stem:
        return _entry(path, data)
    entry = parse_entry(path, text)
    cache.put(key, entry.data)
    return entry


def entry_folders(extra: str | None = None) -> list[Path]:
    """The shipped folder first, then TRAINMEDIC_KB_PATH folders; later folders override earlier ones."""
    extra = os.environ.get("TRAINMEDIC_KB_PATH", "") if extra is None else extra
    return [shipped.ENTRIES] + [Path(p) for p in extra.split(":") if p]


def load(folders: list[Path] | None = None) -> KnowledgeBase:
    """Load every entry of every folder, validating each; site entries with a shipped id replace it."""
    entries: dict[str, Entry] = {}
    cache = _ValidatedCache()
    for folder in folders if folders is not None else entry_folders():
        if not folder.is_dir():
            raise KnowledgeError(f"{folder}: not a folder of knowledge entries (check TRAINMEDIC_KB_PATH)")
        for stray in sorted(folder.glob("*.yml")):
            raise KnowledgeError(f"{stray}: entries end in .yaml; rename it to {stray.stem}.yaml")
        layer: dict[str, Entry] = {}
        for path in sorted(folder.glob("*.yaml")):
            entry = _load_file(path, cache)
            layer[entry.id] = entry
        entries.update(layer)
    try:
        xids = xid_table.load(validated=cache)
    except xid_table.XidTableError as exc:
        raise KnowledgeError(str(exc)) from None
    _check_links(entries)
    _check_xid_links(entries, xids)
    cache.save()
    return KnowledgeBase(entries, xids)


def _check_links(entries: dict[str, Entry]) -> None:
    for entry in entries.values():
        for key in ("related", "caused_by"):
            for i, other in enumerate(entry.data[key]):
                if other not in entries:
                    raise KnowledgeError(
                        f"{entry.source}: field {key}[{i}]: no entry has the id {other!r}; "
                        "fix the id or add that entry"
                    )
                if other == entry.id:
                    raise KnowledgeError(f"{entry.source}: field {key}[{i}]: an entry cannot list itself")


def _check_xid_links(entries: dict[str, Entry], xids: xid_table.XidTable) -> None:
    """Every step's `xid_actions` names a bucket of the table (tests/test_xids.py checks the routing)."""
    for entry in entries.values():
        for key, steps in (("confirm", entry.data["confirm"]), ("fix.steps", entry.data["fix"]["steps"])):
            for i, step in enumerate(steps):
                unknown = [a for a in step.get("xid_actions", []) if a not in xids.actions]
                if unknown:
                    raise KnowledgeError(f"{entry.source}: field {key}[{i}].xid_actions: {unknown} not among the actions of "
                                         f"knowledge/xids.yaml ({', '.join(xids.actions)}); fix the spelling")
