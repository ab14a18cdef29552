"""A failure's signature: what stays the same when the same failure happens again, as Sentry groups.

A known failure is identified by what matched, not by a whole line: the entry, the fingerprint (or
the `group` that fingerprints of one failure share) and the captures the fingerprint declares
stable with `group_by` (the Xid number, the exception type, the mount point of a full disk). Sizes,
ranks, hosts, steps, paths and jobs are left out, so the same failure elsewhere links up, while a
different failure of one entry (Xid 79 and Xid 62 are both gpu-xid) stays apart.

An unknown failure is grouped by its exception type and its message with every volatile value
masked (times, URLs, paths, addresses, ids, sizes, durations, numbers, quoted values), as Sentry
parameterizes a message. Deterministic and stateless on purpose: a template miner such as Drain3
learns templates from the stream it has seen, so the same line could get another signature after
more incidents, and the stored signatures could not be recomputed by a migration.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from bot.engine.diagnose import Diagnosis
from bot.engine.fallback import LAST_EXCEPTION
from bot.engine.scan import Hit
from bot.kb.load import Fingerprint, KnowledgeBase
from bot.match import engines

_MASKS = [
    (re.compile(p), token)
    for p, token in (
        (r"\[(?:rank|Rank|RANK)\s?\d+\]:?|\[default\d+\]:?|^\S+:\d+:\d+ \[\d+\]", ""),  # rank and NCCL prefixes
        (r"\d{4}-\d\d-\d\d(?:[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?", "<time>"),
        (r"\b[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?", "<time>"),
        (r"\b[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d\b", "<time>"),
        (r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b", "<time>"),
        (r"^\[\s*\d+\.\d+\]", "<time>"),
        (r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", "<email>"),
        (r"\b[a-z][a-z0-9+.-]*://\S+", "<url>"),
        (r"(?:(?<=[\s'\"(=:])|^)(?:~|\.{1,2})?(?:/[\w.@%+-]+)+/?", "<path>"),
        (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "<ip>"),
        (r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b", "<uuid>"),
        (r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b", "<hex>"),
        (r"\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d\b|\b[0-9a-fA-F]{8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d\b",
         "<pci>"),
        (r"(?i)\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes?|B)\b", "<size>"),
        (r"(?i)\b\d+(?:\.\d+)?\s?(?:ms|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)\b", "<duration>"),
        (r"'[^'\n]*'|\"[^\"\n]*\"", "'<str>'"),
        (r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", "<n>"),
        (r"\s+", " "),
    )
]
_EXCEPTION = re.compile(r"(?:^|[\s:(])((?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure)))(?::\s*(.*)|$)")
_PATHISH = re.compile(r"^(?:[a-z][a-z0-9+.-]*://[^/\s]+|/dev/\w+|/[^/\s]+|~|\.)")


def normalise(text: str, hosts: Iterable[str] = ()) -> str:
    """`text` with every volatile value masked (hosts first, by name, when they are known)."""
    for host in sorted(hosts, key=len, reverse=True):
        text = text.replace(host, "<host>")
    for pattern, token in _MASKS:
        text = pattern.sub(token, text)
    return text.strip()


def _stable(value: str | None) -> str:
    """A declared capture as it identifies the failure: a path by its mount point (`/scratch`,
    `/dev/shm`, `s3://bucket`), anything else as written, whitespace collapsed."""
    if value is None:
        return "-"
    value = " ".join(value.split())
    if value.startswith(("/", "~", "./")) or "://" in value:
        mount = _PATHISH.match(value)
        return mount.group() if mount else value
    return value


def known_text(fingerprint: Fingerprint, groups: dict[str, str]) -> str:
    """What identifies a known failure: entry, fingerprint group and its stable captures."""
    parts = [fingerprint.entry, fingerprint.group or fingerprint.id]
    parts += [f"{name}={_stable(groups.get(name))}" for name in fingerprint.group_by]
    return "\n".join(parts)


def unknown_text(lines: list[str]) -> str:
    """What identifies an unknown failure: the last exception's type and normalised message, else
    the first error line, normalised."""
    for line in reversed(lines):
        m = _EXCEPTION.search(line)
        if m:
            return f"unknown\n{m.group(2)}: {normalise(m.group(3) or '')}"
    return "unknown\n" + (normalise(lines[0]) if lines else "")


def _first_root_hit(d: Diagnosis) -> Hit:
    """The root finding's earliest root-role hit; on one line, the fingerprint listed first."""
    order = {fp.id: i for i, fp in enumerate(d.root.entry.fingerprints)}
    roots = [h for h in d.root.hits if h.fingerprint.role == "root"] or d.root.hits
    return min(roots, key=lambda h: (h.order, order.get(h.fingerprint.id, len(order))))


def keyed(prefix: str, text: str) -> str:
    return f"{prefix}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def signature(d: Diagnosis) -> tuple[str, str]:
    """(short key, the text it hashes) for linking repeats of this failure."""
    if d.root is None:
        text = unknown_text([m.text for m in d.likely_errors()])
        return keyed("unknown", text), text
    hit = _first_root_hit(d)
    if hit.fingerprint.detector == LAST_EXCEPTION:
        # The run's own exception, that no fingerprint knows: grouped as an unknown one is.
        text = f"{d.root.entry.id}\n" + unknown_text([hit.text])
    else:
        text = known_text(hit.fingerprint, hit.groups)
    return keyed(d.root.entry.id, text), text


def from_evidence(kb: KnowledgeBase, entry_id: str | None, evidence: list[dict]) -> tuple[str, str] | None:
    """The signature of a stored incident, rebuilt from its evidence rows (role, text): the root
    lines are matched again against the entry's fingerprints. None when the entry is gone or no
    stored line matches any more (the stored signature is then the best there is)."""
    if entry_id is None:
        text = unknown_text([e["text"] for e in evidence if e["role"] == "likely"])
        return keyed("unknown", text), text
    if entry_id not in kb.entries:
        return None
    entry = kb.get(entry_id)
    lines = [e["text"] for e in evidence if e["role"] == "root" and e["entry"] == entry_id]
    for line in lines:
        for fp in entry.fingerprints:
            match = engines.re2_compile(fp.pattern, text=True).search(line)
            if match:
                groups = {k: v for k, v in match.groupdict().items() if v is not None}
                text = known_text(fp, groups)
                return keyed(entry_id, text), text
    if lines and entry.detectors and any(det.detector == LAST_EXCEPTION for det in entry.detectors):
        text = f"{entry_id}\n" + unknown_text(lines[:1])
        return keyed(entry_id, text), text
    return None
