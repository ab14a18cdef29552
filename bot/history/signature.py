"""A failure's signature: what stays the same when the same failure happens again.

Volatile values (ranks, hosts, times, numbers, paths, addresses, hex) are masked, as Sentry masks
them before grouping, so a CUDA OOM of 3.82 GiB on rank 3 and one of 1.20 GiB on rank 5 link up.
"""
from __future__ import annotations

import hashlib
import re

from bot.engine.diagnose import Diagnosis

_MASKS = [
    (re.compile(p), token)
    for p, token in (
        (r"\[(?:rank|Rank|RANK)\s?\d+\]:?|\[default\d+\]:?", ""),
        (r"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?", "<time>"),
        (r"\b[IWEF]\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?", "<time>"),
        (r"\b[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d\b", "<time>"),
        (r"^\[\s*\d+\.\d+\]", "<time>"),
        (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "<ip>"),
        (r"(?:[\w.-]*/)+[\w.-]+/?|/", "<path>"),
        (r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{8,}\b|\b[0-9a-f]{4,}(?:-[0-9a-f]{4,}){2,}\b", "<hex>"),
        (r"\d+(?:\.\d+)?", "<n>"),
        (r"\s+", " "),
    )
]


def normalise(text: str, hosts: set[str] = frozenset()) -> str:
    """`text` with every volatile value masked."""
    for host in sorted(hosts, key=len, reverse=True):
        text = text.replace(host, "<host>")
    for pattern, token in _MASKS:
        text = pattern.sub(token, text)
    return text.strip()


def signature(d: Diagnosis) -> tuple[str, str]:
    """(short key, the normalised text it hashes) for linking repeats of this failure."""
    if d.root is not None:
        hosts = set(d.root.hosts) | {h.host for h in d.root.hits if h.host}
        first = next((h for h in d.root.hits if h.fingerprint.role == "root"), d.root.hits[0])
        text = f"{d.root.entry.id}\n{first.fingerprint.id}: {normalise(first.text, hosts)}"
        key = d.root.entry.id
    else:
        text = "unknown\n" + "\n".join(normalise(m.text) for m in d.likely_errors())
        key = "unknown"
    return f"{key}:{hashlib.sha1(text.encode()).hexdigest()[:12]}", text
