"""Remove secrets from log text before it is shown, posted or stored."""
from __future__ import annotations

import re

MASK = "[REDACTED]"

# Each pattern's group "secret" is replaced; the rest of the match is kept for context.
_PATTERNS = [
    re.compile(p)
    for p in (
        r"(?P<secret>xox[abposre]-[A-Za-z0-9-]{8,}|xapp-\d-[A-Za-z0-9-]{8,})",  # Slack
        r"(?P<secret>gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",  # GitHub
        r"(?P<secret>hf_[A-Za-z0-9]{20,})",  # Hugging Face
        r"(?P<secret>(?:AKIA|ASIA)[0-9A-Z]{16})",  # AWS access key id
        r"(?P<secret>sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,})",  # OpenAI / Anthropic style
        r"(?P<secret>eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})",  # JWT
        r"(?i)\bBearer\s+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)",
        r"(?i)\b[\w.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)"
        r"[\"']?\s*[=:]\s*[\"']?(?P<secret>[^\s\"',;]{4,})",
        r"(?i)\bwandb login\s+(?P<secret>[0-9a-f]{40})",
        r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?P<secret>[^/\s@]+)@",  # credentials in URLs
        r"(?P<secret>-----BEGIN [A-Z ]*PRIVATE KEY-----.*)",
    )
]


def _mask(match: re.Match) -> str:
    start, end = match.span("secret")
    text = match.group(0)
    offset = match.start()
    return text[: start - offset] + MASK + text[end - offset :]


def redact(text: str) -> str:
    """`text` with every token, key, password and URL credential replaced by [REDACTED]."""
    for pattern in _PATTERNS:
        text = pattern.sub(_mask, text)
    return text
