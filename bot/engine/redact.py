"""Remove secrets from log text before it is shown, posted or stored.

A secret is found by what it looks like, wherever it stands, by four kinds of rule:

- FORMATS: the regex rule set of Yelp's detect-secrets (every regex plugin but its public-IP one:
  AWS, GitHub, GitLab, Slack, JWT, private keys, basic auth, Stripe, Twilio, SendGrid, npm, PyPI,
  OpenAI, Discord, Telegram, Azure storage keys, ...) and the formats ML teams carry that it lacks
  (`ML_FORMATS`: Hugging Face, new OpenAI and Anthropic keys, Slack app and refresh tokens, Google,
  Databricks, Docker Hub, Replicate, Groq, ...);
- a key name and its value (`password=`, `"api_key": "..."`, `--token X`, `Bearer X`, URL userinfo,
  `... key <value>` in prose); names that are often not secrets (`key`, `token`) need a value that
  looks like one;
- a random-looking token (high entropy, mixed case and digits, by detect-secrets' entropy measure),
  anywhere on the line, and a shorter one at the start of a line (the rest of a secret wrapped or cut
  by a carriage return);
- a 40-hex W&B key on a line that names W&B.

A secret is masked whole (the run of token characters around what a rule matched), so a rule that
matches only a prefix leaks nothing. What diagnosis needs stays: git SHAs, UUIDs, hex addresses and
ids, PCI bus ids, paths, numbers and documentation placeholders (`xoxb-xxxx`, `<token>`, `${VAR}`).

Every rule runs on a bounded piece of text (`_BLOCK` characters, overlapping by `_MARGIN`), so the
cost of a line is linear in its length whatever it holds.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from itertools import pairwise
from pathlib import Path

import re2

from bot.config import cache_dir, write_cache

MASK = "[REDACTED]"

# Not secrets, and diagnosis needs them (NCCL and rendezvous lines name public addresses).
_NOT_SECRETS = {"Public IP (ipv4)"}

# Formats detect-secrets lacks or matches too narrowly (its GitHub rule wants exactly 36 characters,
# its OpenAI rule only keys with the T3BlbkFJ marker, its Slack rule no xapp-/xoxe tokens).
ML_FORMATS: dict[str, str] = {
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "Hugging Face org token": r"\bapi_org_[A-Za-z0-9]{30,}",
    "OpenAI key": r"\bsk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{32,}",
    "Anthropic key": r"\bsk-ant-[a-z]{3,8}\d{0,3}-[A-Za-z0-9_-]{32,}",
    "Slack token": r"\bxox[abposre]-[A-Za-z0-9-]{10,}",
    "Slack refresh token": r"\bxoxe\.xox[bp]-\d-[A-Za-z0-9-]{10,}",
    "Slack app-level token": r"\bxapp-\d-[A-Za-z0-9-]{10,}",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    "GitHub fine-grained token": r"\bgithub_pat_[A-Za-z0-9_]{30,}",
    "Google API key": r"\bAIza[0-9A-Za-z_-]{35}",
    "Google OAuth access token": r"\bya29\.[0-9A-Za-z_-]{20,}",
    "Google OAuth client secret": r"\bGOCSPX-[A-Za-z0-9_-]{20,}",
    "Databricks token": r"\bdapi[0-9a-f]{32}",
    "Docker Hub token": r"\bdckr_pat_[A-Za-z0-9_-]{20,}",
    "npm token": r"\bnpm_[A-Za-z0-9]{36}",
    "Replicate token": r"\br8_[A-Za-z0-9]{30,}",
    "Groq key": r"\bgsk_[A-Za-z0-9]{40,}",
    "Perplexity key": r"\bpplx-[A-Za-z0-9]{40,}",
    "Stripe key": r"\b[rs]k_(?:live|test)_[0-9a-zA-Z]{20,}",
    "Azure key in a connection string": r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)=[^;\s\"']{16,}",
    "Azure SAS signature": r"[?&]sig=[A-Za-z0-9%+/=]{20,}",
    "AWS session token": r"\bIQoJb3JpZ2luX2Vj[A-Za-z0-9+/=]{40,}",
    # a PEM block on one line (a JSON dump of a GCP service-account key), up to its END or the line end
    "Private key": r"-----BEGIN[A-Z ]{0,30} PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END[A-Z ]{0,30} PRIVATE KEY(?: BLOCK)?-----|.*)",
}

# Key names whose value is a secret whatever it looks like, and names (`key`, `token`) whose
# value must also look like one. A name ends in the keyword: `password_file=` and `tokenizer:` are not.
_STRONG = (r"passwd|password|passphrase|secret|client[_-]?secret|secret[_-]?key|credentials?|api[_-]?key|apikey"
           r"|access[_-]?key|private[_-]?key|(?:auth|access|refresh|session|id|bearer|api|hf|bot|app)[_-]?token"
           r"|signature|sig|x-api-key|private-token|pwd|(?:db|key)_?pass")
_WEAK = r"token|key|auth|code"
_VALUE = r"(?P<value>[^\s\"'`,;&(){}\[\]<>|]{1,512})"
_ASSIGN = re.compile(
    rf"(?i)(?<![A-Za-z0-9])(?P<name>{_STRONG}|{_WEAK})[\"'\]]{{0,2}}\s{{0,4}}(?::=|=>|=|:)\s{{0,4}}"
    rf"(?:[rbuf]?[\"'])?{_VALUE}"
)
_FLAG = re.compile(rf"(?i)(?<![\w-])--?(?:\w{{1,40}}[_-])?(?P<name>{_STRONG}|{_WEAK})(?:=|\s{{1,4}})[\"']?{_VALUE}")
_SCHEME = re.compile(rf"(?i)\b(?P<name>bearer|basic|token)\s{{1,4}}{_VALUE}")
_PROSE = re.compile(rf"(?i)\b(?P<name>{_STRONG}|{_WEAK})s?\s{{1,4}}(?:(?:is|was|of|for|with|=)\s{{1,4}})?[\"']?{_VALUE}")
# (the scheme may be cut off: a checkpoint path is taken from its line from the first slash)
_USERINFO = re.compile(r"(?i)(?:\b[a-z][a-z0-9+.-]{1,15}:)?//(?P<user>[^/\s:@\"']{1,2048})(?::(?P<value>[^/\s@\"']{1,2048}))?@")
_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_%-])(?:[A-Za-z0-9+/=_-]|%[0-9A-Fa-f]{2}){20,}")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_LINE_START = re.compile(r"(?m)^(?:[ \t]*\[[^\]\n]{0,40}\]:?)?[ \t]*(?P<value>[A-Za-z0-9+/=_.-]{8,})(?![A-Za-z0-9+/=_.:-])(?P<alone>[ \t]*$)?")
# A line that ends inside a key with a known prefix (wrapped, or cut by a carriage return).
_CUT_AT_END = re.compile(
    r"(?:\b(?:hf_|api_org_|sk-|xox[abposre][-.]|xapp-|gh[pousr]_|github_pat_|gl[a-z]{2,5}-|AKIA|ASIA|AIza|ya29\.|GOCSPX-"
    r"|dapi|dckr_pat_|npm_|r8_|gsk_|pplx-|[rs]k_live_|SG\.|SK(?=[0-9a-f])|AC(?=[0-9a-f])|AKC|eyJ|IQoJb3JpZ2lu|pypi-)"
    r"|\d{8,10}:AA)[A-Za-z0-9_.+/=-]{6,}[ \t]*$", re.MULTILINE)
_HEX_KEY = re.compile(r"(?<![0-9a-f])[0-9a-f]{16,40}(?![0-9a-f])")
_WANDB = re.compile(r"(?i)wandb|w&b|weights (?:&|and) biases")
_LOOKAROUND = re.compile(r"\(\?<?[=!](?:[^()\\]|\\.|\((?:[^()\\]|\\.)*\))*\)")
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_.~+=%-]")
_PLACEHOLDER = re.compile(r"(?i)x{4}|\*{3}|\.{3}|<[^>]*>|\$\{|\$\(|\{\{|%\(|%s|your[_-]|redacted|changeme|placeholder|example")
_NOT_VALUES = {"none", "null", "nil", "true", "false", "undefined", "empty", "unset", "required", "optional", "n/a"}
_NAMED_LITERALS = re.compile(
    r"^(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?[a-zA-Z%]{0,3}|[A-Za-z][a-z]*(?:[_-][a-z]+)*|[A-Z]+(?:[_-][A-Z]+)*)$")

_BLOCK = 8192  # the most text one rule pass sees
_MARGIN = 2048  # overlap of blocks, and the context kept around a clipped window: the longest secret


_ML = [re.compile(p, re.DOTALL) for p in ML_FORMATS.values()]
_UUID = re.compile(r"(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Runs of consecutive characters that docs and templates use as fake keys (`ABCDEFGH`, `0123456789`,
# `XYZ012`), in the orders base64, alphanumeric and hex alphabets list them, going round.
_RUNS = tuple(run * 2 for run in ("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/", "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                   "0123456789ABCDEF", "ABCDEFGHIJKLMNOPQRSTUVWXYZ=/"))


def _sequential(value: str) -> bool:
    upper = value.upper()
    return any(upper in run for run in _RUNS)


def _entropy(text: str) -> float:
    """Shannon entropy per character, the measure of detect-secrets' high-entropy plugins (theirs
    counts every character of the charset for each string: 60 us a call, on the hot path here)."""
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def _is_placeholder(value: str) -> bool:
    """A value written in docs or templates rather than a real secret: xxxx, ***, <token>, ${VAR}."""
    core = re.sub(r"^[a-z]{2,5}[_-]|[^A-Za-z0-9]", "", value)  # drop a format prefix (xoxb-, hf_) and separators
    if _PLACEHOLDER.search(value) or value.lower() in _NOT_VALUES:
        return True
    return len(core) < 4 or len(set(core)) <= 3 or _sequential(core)


def _not_a_value(value: str) -> bool:
    """What follows a key name without being its secret: a placeholder, a variable, a path, a word, a number."""
    return (_is_placeholder(value) or value.startswith(("$", "%", "/", "./", "~/"))
            or bool(_NAMED_LITERALS.match(value)))


def _classes(token: str) -> int:
    return sum((any(c.islower() for c in token), any(c.isupper() for c in token), any(c.isdigit() for c in token)))


_WORD = re.compile(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|\d+|[A-Z]")
_MANGLED = re.compile(r"_?_Z[NLSTZ]?\d")  # a C++ symbol (`_ZN3c104cuda9SetDeviceEi`)


def _name_like(part: str) -> bool:
    """Made of words as names are (`Gemma2DecoderLayer`, `getDeviceCount`, `THCudaCheck`): long
    words with vowels and at most one lone capital, where a random string breaks into short pieces."""
    letters = [w for w in _WORD.findall(part) if not w.isdigit()]
    if not letters or sum(len(w) == 1 for w in letters) > 1 or sum(map(len, letters)) < 3.5 * len(letters):
        return False
    if sum(len(w) == 2 and w.istitle() for w in letters) > 1 or sum(w.isupper() and len(w) >= 3 for w in letters) > 1:
        return False  # `Wk`, `Sh`, two acronyms: the pieces of a random string
    return all(w.isupper() or len(w) < 4 or re.search("[aeiouy]", w[1:]) for w in letters)


def _path_like(token: str) -> bool:
    return token.startswith(("/", "./", "../", "~/"))


def _kinds_change(token: str) -> int:
    kinds = ["a" if c.islower() else "A" if c.isupper() else "0" if c.isdigit() else "-" for c in token]
    return sum(a != b for a, b in pairwise(kinds))


def _random_part(part: str) -> bool:
    return (any(c.islower() for c in part) and any(c.isupper() for c in part) and not _name_like(part)
            and _kinds_change(part) >= 0.35 * len(part))


@lru_cache(maxsize=1024)  # logs repeat their tokens; a token is at most one block
def looks_random(token: str, min_len: int = 20) -> bool:
    """Mixed case, changing character class often and of high entropy: a key, not a word, a name,
    a path, a version, a hex id or a UUID. A path is judged by its components, other tokens by
    their pieces between separators (`md5-GPTDataset-document_index` is no key)."""
    token = (urllib.parse.unquote(token) if "%" in token else token).strip("=")
    if len(token) < min_len or token.islower() or token.isupper() or not any(c.isalpha() for c in token):
        return False  # a path, a name or a number in one case: the common case, decided cheaply
    if _UUID.search(token) or _is_placeholder(token) or _MANGLED.match(token):
        return False
    if _path_like(token):
        return any(looks_random(part, 12) for part in token.split("/") if part != token)
    parts = [p for p in re.split(r"[-_./=]", token) if len(p) > 5] or [re.sub(r"[-_./=]", "", token)]
    random_parts = [p for p in parts if _random_part(p)]
    return (sum(map(len, random_parts)) >= 0.5 * len(token)
            and _entropy("".join(random_parts)) >= min(3.0, 0.8 * len(set(token)) ** 0.5))


def _secret_value(value: str, weak: bool, prose: bool = False) -> bool:
    """Whether what follows a key name is its secret; in prose (`... with password X`) a strong
    name's value needs a digit or a symbol too, so that `password authentication failed` stays."""
    value = value.strip("\"'")
    if _not_a_value(value):
        return False
    if not weak and prose:
        return len(value) >= 6 and any(not c.isalpha() for c in value)
    if not weak:
        return len(value) >= 4
    return _hexish(value, 16) or (len(value) >= 12 and _continuation(value))


def _assignments(pattern: re.Pattern) -> Callable[[str, bool], list[tuple[int, int]]]:
    def run(text: str, line_start: bool) -> list[tuple[int, int]]:
        spans = []
        for m in pattern.finditer(text):
            name = m.group("name").lower()
            weak = name == "token" if pattern is _SCHEME else bool(re.fullmatch(_WEAK, name))
            if _secret_value(m.group("value"), weak, prose=pattern is _PROSE):
                spans.append(m.span("value"))
        return spans
    return run


def _userinfo(text: str, line_start: bool) -> list[tuple[int, int]]:
    """A URL's password, or its user name when that is a token (`https://<token>@github.com`)."""
    spans = []
    for m in _USERINFO.finditer(text):
        if m.group("value") and not _is_placeholder(m.group("value")):
            spans.append(m.span("value"))
        elif _token_user(urllib.parse.unquote(m.group("user"))) or _hexish(m.group("user"), 16):
            spans.append(m.span("user"))
    return spans


def _token_user(user: str) -> bool:
    """A URL user name that is a credential: long, with digits and symbols or mixed case."""
    return (len(user) >= 12 and any(c.isdigit() for c in user)
            and (not user.isalnum() or (any(c.islower() for c in user) and any(c.isupper() for c in user))))


def _hexish(value: str, min_len: int) -> bool:
    """Hex digits with letters and digits (a hex key, or the hex end of one), separators aside."""
    core = re.sub(r"[-_]", "", value)
    return len(core) >= min_len and re.fullmatch(r"[0-9a-fA-F]+", core) is not None and _classes(core.lower()) == 2


def _random_tokens(text: str, line_start: bool) -> list[tuple[int, int]]:
    return [m.span() for m in _TOKEN.finditer(text) if looks_random(m.group())]


def _line_starts(text: str, line_start: bool) -> list[tuple[int, int]]:
    """The first token of a line, where the rest of a key wrapped or cut by a carriage return lands:
    shorter than a whole key, so it only needs mixed case that changes often, or hex letters and digits."""
    return [m.span("value") for m in _LINE_START.finditer(text)
            if (m.start() or line_start) and (_continuation(m.group("value").rstrip("."))
                                              or m.group("alone") is not None and _base64_line(m.group("value")))]


def _base64_line(token: str) -> bool:
    """A line that is one base64 run with mixed case and digits: the body of a PEM key."""
    return (len(token) >= 16 and re.fullmatch(r"[A-Za-z0-9+/]+=*", token) is not None and _classes(token) == 3)


@lru_cache(maxsize=1024)
def _continuation(token: str) -> bool:
    if token.islower() and token[0] not in "0123456789abcdef" and "-" not in token and "_" not in token:
        return False  # a lower-case word or name (a hex end starts with a hex digit)
    if _UUID.search(token) or "=" in token.rstrip("="):
        return False  # a UUID, or `SeqNum=638775`
    if any(_hexish(part, 12) for part in re.split(r"[-_]", token)) or looks_random(token, 8):
        return True
    if token.islower() or not any(c.isalpha() for c in token):
        return False
    if _is_placeholder(token) or _entropy(token) < 2.2:
        return False
    letters = [c for c in token if c.isalpha()]
    if token.isupper() and (re.search(r"\d[A-Z]", token) or (  # the end of an AWS key id, not a word
            len(letters) >= 10 and sum(c in "AEIOU" for c in letters) <= 0.2 * len(letters))):
        return True
    parts = [p for p in re.split(r"[-_./=]", token) if len(p) > 5]
    changes = _kinds_change(token)
    return (any(c.islower() for c in token) and any(c.isupper() for c in token)
            and changes >= max(3, 0.25 * len(token)) and not all(_name_like(p) for p in parts)
            and not _MANGLED.match(token) and not _path_like(token))


def _cut_at_end(text: str, line_start: bool) -> list[tuple[int, int]]:
    return [m.span() for m in _CUT_AT_END.finditer(text)
            if not _is_placeholder(m.group()) and not _NAMED_LITERALS.match(m.group().strip())]


def _wandb_keys(text: str, line_start: bool) -> list[tuple[int, int]]:
    if not _WANDB.search(text):
        return []
    return [m.span() for m in _HEX_KEY.finditer(text) if len(m.group()) == 40]


class _Plugin:
    """A detect-secrets regex plugin's rule, the plugin imported when the rule first runs: importing
    detect-secrets and its plugins takes some 200 ms (requests, and 120 regexes compiled), which a
    CLI run would pay for every log, and most logs hold no line that one of its rules runs for."""

    def __init__(self, module: str, name: str) -> None:
        self._module, self._name = module, name
        self._detector = None

    def load(self) -> None:
        if self._detector is None:
            self._detector = getattr(importlib.import_module(self._module), self._name)()

    def __call__(self, text: str, line_start: bool) -> list[tuple[int, int]]:
        self.load()
        values = set(self._detector.analyze_string(text))
        return [m.span() for v in values for m in re.finditer(re.escape(v), text)]


def _plugin_patterns() -> list[tuple[str, str, list[str]]]:
    """(module, class, loosened patterns) of each detect-secrets regex plugin. Reading them means
    importing every plugin, so they are cached for as long as this module and the plugins' source
    files stay the same."""
    folder = Path(importlib.util.find_spec("detect_secrets").origin).parent / "plugins"
    key = hashlib.sha256(Path(__file__).read_bytes())
    for source in sorted(folder.glob("*.py")):
        key.update(source.name.encode() + source.read_bytes())
    path = cache_dir() / f"redact-plugins-{key.hexdigest()[:24]}.json"
    try:
        cached = json.loads(path.read_text())
        return [(str(module), str(name), [str(p) for p in patterns]) for module, name, patterns in cached]
    except (OSError, ValueError, TypeError):
        pass  # none yet, or unreadable: read the plugins
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    found = [(plugin.__module__, plugin.__name__, [_loosened(regex) for regex in plugin().denylist])
             for plugin in get_mapping_from_secret_type_to_class().values()
             if issubclass(plugin, RegexBasedDetector) and plugin.secret_type not in _NOT_SECRETS]
    write_cache(path, json.dumps(found).encode())
    return found


def _format(pattern: re.Pattern) -> Callable[[str, bool], list[tuple[int, int]]]:
    def run(text: str, line_start: bool) -> list[tuple[int, int]]:
        return [m.span() for m in pattern.finditer(text) if not _is_placeholder(m.group())]
    return run


def _loosened(pattern: re.Pattern) -> str:
    """An RE2 pattern that matches wherever `pattern` does (lookarounds dropped, repeats loosened)."""
    source = pattern.pattern
    if pattern.flags & re.VERBOSE:
        source = re.sub(r"#[^\n]*|\s+", "", source)
    source = _LOOKAROUND.sub("", source)
    # counted repeats cut to at most 8: a counter multiplies the states of the set's DFA, and cut lower
    # a pattern gets loose (a Telegram token's `\d{8,10}:` as `\d{3,}:` is every NCCL line's `pid:tid`)
    source = re.sub(r"\{(\d+)(?:,\d*)?\}", lambda m: f"{{{min(int(m.group(1)), 8)},}}", source)
    return ("(?is)" if pattern.flags & re.IGNORECASE else "(?s)") + source


@lru_cache(maxsize=1)
def _rules() -> tuple[re2._Set, list[Callable[[str, bool], list[tuple[int, int]]]]]:
    """Every rule with the RE2 pattern that says when it is worth running; one RE2 set pass over a
    line picks the few rules to run (most lines hold no secret, and no rule runs for them)."""
    rules: list[tuple[str, Callable]] = []
    for module, name, patterns in _plugin_patterns():
        plugin = _Plugin(module, name)
        rules += [(pattern, plugin) for pattern in patterns]
    ours = [(p, _format(p)) for p in _ML] + [(p, _assignments(p)) for p in (_ASSIGN, _FLAG, _SCHEME, _PROSE)]
    ours += [(_USERINFO, _userinfo), (_TOKEN, _random_tokens), (_LINE_START, _line_starts), (_CUT_AT_END, _cut_at_end),
             (_HEX_KEY, _wandb_keys)]
    rules += [(_loosened(pattern), run) for pattern, run in ours]
    prefilter = re2.Set.SearchSet(re2.Options())
    for pattern, _ in rules:
        prefilter.Add(pattern)
    prefilter.Compile()
    return prefilter, [run for _, run in rules]


def prepare(plugins: bool = False) -> None:
    """Build the rules now, not on the first line redacted; with `plugins`, import detect-secrets'
    plugins too (a long-lived process: a bot worker, whose first reply should not wait for them)."""
    _, runs = _rules()
    for run in runs if plugins else ():
        if isinstance(run, _Plugin):
            run.load()


def _whole(text: str, start: int, end: int) -> tuple[int, int]:
    """The span widened to the whole token it lies in (a rule may match only a prefix of a key)."""
    while start > 0 and _TOKEN_CHARS.match(text[start - 1]) and text[start - 1] not in "=.":
        start -= 1
    while end < len(text) and _TOKEN_CHARS.match(text[end]):
        end += 1
    while end > start + 1 and text[end - 1] == ".":
        end -= 1  # a sentence's full stop
    return start, end


def _block(text: str, line_start: bool) -> list[tuple[int, int]]:
    prefilter, runs = _rules()
    picked = dict.fromkeys(runs[i] for i in prefilter.Match(text) or ())  # a detector runs once
    spans = [_whole(text, s, e) for run in picked for s, e in run(text, line_start) if e > s]
    for value in {text[s:e] for s, e in spans if e - s >= 8}:  # the same secret again, where no rule saw it
        spans += [m.span() for m in re.finditer(re.escape(value), text)]
    if _PERCENT.search(text):  # a key inside a URL-encoded value: look again at the decoded text
        decoded, where = _unquoted(text)
        spans += [_whole(text, where[s], where[e]) for s, e in _block(decoded, line_start)]
    return spans


def _unquoted(text: str) -> tuple[str, list[int]]:
    """The percent-decoded text and, for each of its positions (and its end), where it was in `text`."""
    out, where, pos = [], [], 0
    for m in _PERCENT.finditer(text):
        for i in range(pos, m.start()):
            out.append(text[i])
            where.append(i)
        out.append(chr(int(m.group()[1:], 16)))
        where.append(m.start())
        pos = m.end()
    out += text[pos:]
    where += range(pos, len(text) + 1)
    return "".join(out), where


def find(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the secrets in `text`, sorted and merged."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        line_start = pos == 0 or text[pos - 1] == "\n"
        spans += [(pos + s, pos + e) for s, e in _block(text[pos : pos + _BLOCK], line_start)]
        if pos + _BLOCK >= len(text):
            break
        pos += _BLOCK - _MARGIN
    merged: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def _masked(text: str, spans: list[tuple[int, int]], start: int, end: int) -> str:
    """text[start:end] with the spans masked; a span that crosses an edge is masked whole."""
    out, pos = [], start
    for s, e in spans:
        if e <= start or s >= end:
            continue
        out.append(text[pos : max(s, pos)] + MASK)
        pos = max(pos, e)
    out.append(text[pos:end] if pos < end else "")
    return "".join(out)


def redact(text: str) -> str:
    """`text` with every token, key, password and credential replaced by [REDACTED]."""
    return _masked(text, find(text), 0, len(text))


def clip(text: str, start: int, end: int, width: int) -> str:
    """The redacted line, or, when it is longer than `width`, a redacted window of it around
    text[start:end]. Redaction sees the window with `_MARGIN` characters on each side, so a secret
    cut by the window's edge is found whole and masked whole."""
    text = text.rstrip()
    if len(text) <= width:
        return redact(text)
    left = max(0, min(start - width // 4, end - width))
    right = min(len(text), left + width)
    lo = max(0, left - _MARGIN)
    spans = [(lo + s, lo + e) for s, e in find(text[lo : right + _MARGIN])]
    return ("…" if left else "") + _masked(text, spans, left, right) + ("…" if right < len(text) else "")
