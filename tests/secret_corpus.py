"""Secrets generated at test time, in the places logs put them, and the look-alikes that must stay.

Nothing here is a real key: every secret is drawn from a seeded random generator when a test runs
(TRAINMEDIC_REDACT_SEED picks another draw). A format knows its secret's random parts (the prefix
`hf_` or a JWT header is no secret), which the leak check cuts into 8-character pieces.
"""
from __future__ import annotations

import base64
import json
import os
import random
import string
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import re2

SEED = int(os.environ.get("TRAINMEDIC_REDACT_SEED", "16"))
PIECE = 8
ALNUM = string.ascii_letters + string.digits
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"


def draw(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


@dataclass(frozen=True)
class Format:
    name: str
    env: str  # the variable or key name it usually travels under
    lead: str  # what a log says right before it in prose
    make: Callable[[random.Random], tuple[str, list[str]]]  # -> (secret, its random parts)


def _prefixed(prefix: str, alphabet: str, n: int, suffix: str = ""):
    def make(rng):
        body = draw(rng, alphabet, n)
        return prefix + body + suffix, [body]
    return make


def _parts(*pieces):
    """A secret of literal pieces (str) and random ones ((alphabet, n))."""
    def make(rng):
        out, secret = [], ""
        for p in pieces:
            if isinstance(p, str):
                secret += p
            else:
                body = draw(rng, *p)
                out.append(body)
                secret += body
        return secret, out
    return make


def _jwt(rng):
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()
    claims = json.dumps({"sub": draw(rng, ALNUM, 12), "iat": rng.randrange(1 << 31)}).encode()
    payload = base64.urlsafe_b64encode(claims).rstrip(b"=").decode()
    signature = draw(rng, B64URL, 43)
    return f"{header}.{payload}.{signature}", [signature, payload[12:]]


def _pem(kind: str, lines: int):
    def make(rng):
        body = [draw(rng, B64, 64) for _ in range(lines)] + [draw(rng, B64, 20) + "=="]
        text = f"-----BEGIN {kind}-----\n" + "\n".join(body) + f"\n-----END {kind}-----"
        return text, body
    return make


def _gcp_private_key(rng):
    body = [draw(rng, B64, 64) for _ in range(3)]
    return "-----BEGIN PRIVATE KEY-----\\n" + "\\n".join(body) + "\\n-----END PRIVATE KEY-----\\n", body


def _neptune(rng):
    key = str(uuid.UUID(int=rng.getrandbits(128)))
    token = json.dumps({"api_address": "https://app.neptune.ai", "api_url": "https://app.neptune.ai", "api_key": key})
    encoded = base64.b64encode(token.encode()).decode()
    return encoded, [encoded[96:]]  # the part that encodes the key


def _password(rng):
    word = draw(rng, string.ascii_uppercase, 1) + draw(rng, string.ascii_lowercase, 5)
    pw = word + draw(rng, "!#%^*-_+", 1) + draw(rng, string.digits, 4) + draw(rng, ALNUM, 7)
    return pw, [pw]


def _azure_connection(rng):
    key = draw(rng, B64, 86) + "=="
    return (f"DefaultEndpointsProtocol=https;AccountName=mlruns{rng.randrange(9999)};AccountKey={key};"
            "EndpointSuffix=core.windows.net"), [key[:-2]]


def _azure_sas(rng):
    sig = draw(rng, B64, 43)
    return (f"sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2026-01-01T00:00:00Z&sig={urllib.parse.quote(sig + '=', safe='')}",
            [sig])


FORMATS = [
    Format("slack-bot", "SLACK_BOT_TOKEN", "chat.postMessage failed using",
           _parts("xoxb-", (string.digits, 12), "-", (string.digits, 13), "-", (ALNUM, 24))),
    Format("slack-user", "SLACK_USER_TOKEN", "request failed using",
           _parts("xoxp-", (string.digits, 12), "-", (string.digits, 12), "-", (string.digits, 13), "-", (HEX, 32))),
    Format("slack-app", "SLACK_APP_TOKEN", "socket mode refused",
           _parts("xapp-1-A", (string.ascii_uppercase + string.digits, 10), "-", (string.digits, 13), "-", (HEX, 64))),
    Format("slack-refresh", "SLACK_REFRESH_TOKEN", "token rotation failed for",
           _parts("xoxe.xoxp-1-", (B64URL, 140))),
    Format("slack-webhook", "SLACK_WEBHOOK_URL", "alert post failed to",
           _parts("https://hooks.slack.com/services/T", (string.ascii_uppercase + string.digits, 8), "/B",
                  (string.ascii_uppercase + string.digits, 10), "/", (ALNUM, 24))),
    Format("github-classic", "GITHUB_TOKEN", "git push rejected for", _prefixed("ghp_", ALNUM, 36)),
    Format("github-oauth", "GH_OAUTH_TOKEN", "gh auth failed with", _prefixed("gho_", ALNUM, 36)),
    Format("github-app", "GH_APP_TOKEN", "installation denied", _prefixed("ghs_", ALNUM, 36)),
    Format("github-fine-grained", "GH_TOKEN", "clone failed using",
           _parts("github_pat_", (ALNUM, 22), "_", (ALNUM, 59))),
    Format("gitlab-pat", "GITLAB_TOKEN", "pull failed using", _prefixed("glpat-", B64URL, 20)),
    Format("gitlab-runner", "CI_RUNNER_TOKEN", "runner registration refused", _prefixed("glrt-", B64URL, 24)),
    Format("huggingface", "HF_TOKEN", "snapshot_download failed with", _prefixed("hf_", ALNUM, 34)),
    Format("huggingface-org", "HF_ORG_TOKEN", "upload rejected for", _prefixed("api_org_", ALNUM, 34)),
    Format("wandb", "WANDB_API_KEY", "wandb: ERROR login refused for key", _prefixed("", HEX, 40)),
    Format("openai-project", "OPENAI_API_KEY", "completion failed with",
           _parts("sk-proj-", (B64URL, 74), "T3BlbkFJ", (B64URL, 74))),
    Format("openai-legacy", "OPENAI_KEY", "openai.AuthenticationError for",
           _parts("sk-", (ALNUM, 20), "T3BlbkFJ", (ALNUM, 20))),
    Format("openai-service-account", "OPENAI_SVC_KEY", "evaluation failed with",
           _parts("sk-svcacct-", (B64URL, 74), "T3BlbkFJ", (B64URL, 74))),
    Format("anthropic", "ANTHROPIC_API_KEY", "judge call failed with",
           _parts("sk-ant-api03-", (B64URL, 93), "AA")),
    Format("aws-access-key-id", "AWS_ACCESS_KEY_ID", "s3 upload denied for",
           _prefixed("AKIA", string.ascii_uppercase + "234567", 16)),
    Format("aws-temporary-key-id", "AWS_ACCESS_KEY_ID", "assume-role returned",
           _prefixed("ASIA", string.ascii_uppercase + "234567", 16)),
    Format("aws-secret-access-key", "AWS_SECRET_ACCESS_KEY", "botocore: signing request with secret",
           _prefixed("", B64, 40)),
    Format("aws-session-token", "AWS_SESSION_TOKEN", "ExpiredToken for",
           _prefixed("IQoJb3JpZ2luX2VjE", B64, 220)),
    Format("google-api-key", "GOOGLE_API_KEY", "quota exceeded for", _prefixed("AIza", B64URL, 35)),
    Format("google-oauth-token", "GOOGLE_ACCESS_TOKEN", "gcs write refused for", _prefixed("ya29.a0", B64URL, 120)),
    Format("google-client-secret", "GOOGLE_CLIENT_SECRET", "oauth exchange failed with",
           _prefixed("GOCSPX-", B64URL, 28)),
    Format("gcp-service-account-key", "GOOGLE_PRIVATE_KEY", "credentials rejected:", _gcp_private_key),
    Format("rsa-private-key", "SSH_PRIVATE_KEY", "could not load key", _pem("RSA PRIVATE KEY", 4)),
    Format("openssh-private-key", "DEPLOY_KEY", "ssh-add failed for", _pem("OPENSSH PRIVATE KEY", 3)),
    Format("azure-connection-string", "AZURE_STORAGE_CONNECTION_STRING", "blob client failed for",
           _azure_connection),
    Format("azure-sas-token", "AZURE_SAS_TOKEN", "container write refused for", _azure_sas),
    Format("jwt", "API_JWT", "gateway rejected", _jwt),
    Format("stripe", "STRIPE_KEY", "billing call failed with", _prefixed("sk_live_", ALNUM, 32)),
    Format("sendgrid", "SENDGRID_API_KEY", "mail alert failed with",
           _parts("SG.", (B64URL, 22), ".", (B64URL, 43))),
    Format("twilio", "TWILIO_API_KEY", "sms alert failed for", _prefixed("SK", HEX, 32)),
    Format("discord", "DISCORD_BOT_TOKEN", "webhook bot refused",
           _parts("M", (B64URL, 25), ".", (B64URL, 6), ".", (B64URL, 27))),
    Format("telegram", "TELEGRAM_BOT_TOKEN", "notifier failed for",
           _parts((string.digits, 10), ":AA", (B64URL, 33))),
    Format("npm", "NPM_TOKEN", "npm publish refused for", _prefixed("npm_", ALNUM, 36)),
    Format("pypi", "PYPI_TOKEN", "twine upload rejected", _prefixed("pypi-AgEIcHlwaS5vcmc", B64URL, 120)),
    Format("databricks", "DATABRICKS_TOKEN", "databricks: invalid access token", _prefixed("dapi", HEX, 32)),
    Format("dockerhub", "DOCKER_PAT", "docker login failed with", _prefixed("dckr_pat_", B64URL, 27)),
    Format("replicate", "REPLICATE_API_TOKEN", "prediction failed with", _prefixed("r8_", ALNUM, 37)),
    Format("groq", "GROQ_API_KEY", "inference failed with", _prefixed("gsk_", ALNUM, 52)),
    Format("mailchimp", "MAILCHIMP_KEY", "mailchimp: rejected api key",
           _parts((HEX, 32), "-us", (string.digits, 2))),
    Format("artifactory", "ARTIFACTORY_API_KEY", "jfrog pull failed with", _prefixed("AKC", ALNUM, 70)),
    Format("kaggle", "KAGGLE_KEY", "kaggle: 401 for key", _prefixed("", HEX, 32)),
    Format("neptune", "NEPTUNE_API_TOKEN", "neptune: invalid api token", _neptune),
    Format("generic-api-key", "COMET_API_KEY", "comet_ml: invalid api key", _prefixed("", ALNUM, 32)),
    Format("password", "DB_PASSWORD", "authentication failed with password", _password),
    Format("bearer", "API_TOKEN", "401 Unauthorized for bearer token", _prefixed("", B64URL, 40)),
]


@dataclass(frozen=True)
class Placement:
    format: str
    context: str
    lines: list[str]  # the log text around the secret
    pieces: frozenset[str]  # 8-character pieces of the secret, raw and as placed

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _words(env: str) -> tuple[str, str, str]:
    """(json/yaml key, command-line flag, keyword argument) for a variable name."""
    key = env.lower()
    kwarg = next((k for k in ("api_key", "password", "secret", "token", "key") if key.endswith(k)), "token")
    return key, key.replace("_", "-"), kwarg


_NOISE = [
    "[rank0]: {'loss': 1.3021, 'grad_norm': 0.4411, 'learning_rate': 1.9e-05, 'epoch': 0.24}",
    "[rank1]:[W1010 06:41:02.113 ProcessGroupNCCL.cpp:1130] Warning: TORCH_NCCL_ASYNC_ERROR_HANDLING is deprecated",
]


def _contexts(fmt: Format, secret: str) -> dict[str, list[str]]:
    key, flag, kwarg = _words(fmt.env)
    quoted = urllib.parse.quote(secret, safe="")
    half = len(secret) // 2
    first_line = secret.split("\n")[0]
    return {
        "bare": [f"RuntimeError: {fmt.lead} {secret} (status 401)"],
        "quoted": [f"ValueError: {fmt.lead} '{secret}' and \"{secret}\""],
        "json": [f'[rank0]: ERROR config dump: {{"run": "llama-8b", "{key}": {json.dumps(secret)}, "lr": 0.0003}}'],
        "yaml": ["ERROR while loading config.yaml:", f"ERROR   {key}: {secret}"],
        "export": [f"+ export {fmt.env}={secret}", f"error: launch failed after: export {fmt.env}='{secret}'"],
        "flag": [f"ERROR: process exited 1: python train.py --bf16 --{flag} {secret} --{flag}={secret} --steps 9000"],
        "url-query": [("requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
                       f"https://api.example.net/v1/upload?run=42&{key}={quoted}&part=3")],
        "url-userinfo": [f"fatal: could not read from https://oauth2:{quoted}@git.example.net/team/repo.git",
                         f"EndpointConnectionError: Could not connect to the endpoint URL: \"https://{quoted}@s3.example.net/bucket\""],
        "python-repr": [
            "Traceback (most recent call last):",
            '  File "/opt/app/train.py", line 88, in <module>',
            "    client.login(**settings)",
            f"PermissionError: login refused: LoginRequest(user='alice', {kwarg}={secret!r}, timeout=30)",
            f"{{'Authorization': 'Bearer {first_line}'}} error",
        ],
        "split": [f"RuntimeError: {fmt.lead} {secret[:half]}", f"{secret[half:]} error: retry 3/5"],
        "checkpoint": [f"Saving model checkpoint to https://u:{quoted}@store.example.net/ckpt/step_4000",
                       f"[rank0]: ERROR saving checkpoint failed: s3://runs/ckpt?{key}={quoted}"],
        "long-line": [f"RuntimeError: {'x' * 280} batch 17 {fmt.lead} {secret} {'y=1 ' * 150}"],
    }


def placements(rng: random.Random | None = None) -> list[Placement]:
    """Every format in every context, each its own small log (noise, then the lines)."""
    rng = rng or random.Random(SEED)
    out = []
    for fmt in FORMATS:
        for context in _contexts(fmt, "x"):
            secret, parts = fmt.make(rng)
            lines = _contexts(fmt, secret)[context]
            placed = [urllib.parse.quote(p, safe="") for p in parts] + [json.dumps(p)[1:-1] for p in parts]
            out.append(Placement(fmt.name, context, _NOISE + lines, frozenset(pieces_of(parts + placed))))
    return out


def positional(rng: random.Random | None = None) -> list[Placement]:
    """Each format's bare line as the very first and the very last line of a file (no newline after it)."""
    rng = rng or random.Random(SEED + 1)
    out = []
    for fmt in FORMATS:
        for where in ("file-start", "file-end"):
            secret, parts = fmt.make(rng)
            line = _contexts(fmt, secret)["bare"]
            lines = line + _NOISE if where == "file-start" else _NOISE + line
            out.append(Placement(fmt.name, where, lines, frozenset(pieces_of(parts))))
    return out


def pieces_of(parts: list[str]) -> set[str]:
    return {p[i : i + PIECE] for p in parts for i in range(len(p) - PIECE + 1)}


class LeakFinder:
    """Finds any piece of many secrets in a large text at once (one RE2 alternation)."""

    def __init__(self, pieces: set[str]) -> None:
        options = re2.Options()
        options.max_mem = 512 << 20
        self._regex = re2.compile("|".join(re2.escape(p) for p in sorted(pieces)).encode(), options)

    def find(self, blob: bytes | str) -> list[str]:
        data = blob.encode("utf-8", "replace") if isinstance(blob, str) else blob
        return sorted({m.group().decode("utf-8", "replace") for m in self._regex.finditer(data)})


# ---------------------------------------------------------------------------------------------
# Look-alikes: what diagnosis needs and a secret detector might take for a key.

def _git_sha(rng):
    return draw(rng, HEX, 40)


LOOKALIKES: dict[str, Callable[[random.Random], str]] = {
    "git-sha": _git_sha,
    "git-short-sha": lambda rng: draw(rng, HEX, rng.choice([7, 10, 12])),
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128))),
    "uuid-upper": lambda rng: str(uuid.UUID(int=rng.getrandbits(128))).upper(),
    "gpu-uuid": lambda rng: "GPU-" + str(uuid.UUID(int=rng.getrandbits(128))),
    "pci-bus-id": lambda rng: f"0000:{rng.randrange(256):02x}:00.{rng.randrange(8)}",
    "pci-bus-id-long": lambda rng: f"00000000:{rng.randrange(256):02X}:00.0",
    "nccl-unique-id": lambda rng: draw(rng, HEX, 256),
    "nccl-comm-hash": lambda rng: "0x" + draw(rng, HEX, 16),
    "cuda-address": lambda rng: "0x7f" + draw(rng, HEX, 10),
    "seqnum": lambda rng: f"SeqNum={rng.randrange(10**6)}",
    "step-counter": lambda rng: f"global_step={rng.randrange(10**6)}",
    "checkpoint-path": lambda rng: (f"/ckpt/llama-70b/run-2024{rng.randrange(1000, 9999)}/global_step{rng.randrange(10**5)}"
                                    f"/mp_rank_{rng.randrange(8):02d}_model_states.pt"),
    "hf-checkpoint-dir": lambda rng: f"/scratch/out/checkpoint-{rng.randrange(10**5)}/model-0000{rng.randrange(1, 9)}-of-00008.safetensors",
    "docker-digest": lambda rng: "sha256:" + draw(rng, HEX, 64),
    "wandb-run-id": lambda rng: draw(rng, string.ascii_lowercase + string.digits, 8),
    "k8s-pod": lambda rng: f"trainer-{draw(rng, HEX, 10)}-{draw(rng, string.ascii_lowercase + string.digits, 5)}",
    "hostname": lambda rng: f"gpu-a100-node{rng.randrange(100):02d}.cluster.local",
    "ip-port": lambda rng: f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}:29500",
    "model-class": lambda rng: rng.choice(["Qwen2ForCausalLM", "LlamaForCausalLM", "MixtralSparseMoeBlock",
                                           "T5ForConditionalGeneration", "Gemma2DecoderLayer", "Wav2Vec2ForCTC"]),
    "model-repo": lambda rng: rng.choice(["meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mixtral-8x7B-v0.1",
                                          "Qwen/Qwen2.5-72B-Instruct", "google/gemma-2-9b-it"]),
    "cuda-version": lambda rng: rng.choice(["12.4.1", "cu121", "2.4.0+cu121", "NCCL 2.21.5+cuda12.4"]),
    "slack-placeholder": lambda rng: rng.choice(["xoxb-xxxxxxxx", "xoxb-XXXXXXXXXXXX-XXXXXXXXXXXXX", "xapp-1-xxxx",
                                                 "xoxb-your-bot-token"]),
    "hf-placeholder": lambda rng: rng.choice(["hf_xxx", "hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "hf_...", "<hf_token>"]),
    "other-placeholder": lambda rng: rng.choice(["sk-...", "ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", "${HF_TOKEN}",
                                                 "<your-api-key>", "$WANDB_API_KEY", "********", "None"]),
    "timestamp": lambda rng: f"2024-09-11T17:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}Z",
    "slurm-job": lambda rng: f"{rng.randrange(10**7)}_{rng.randrange(64)}",
    "tensor-shape": lambda rng: f"torch.Size([{rng.randrange(1, 64)}, {rng.randrange(512, 8192)}, 128])",
}

_LOOKALIKE_LINES = [
    "RuntimeError: failed at {v} (see above)",
    "[rank3]: ERROR {v} not reachable",
    "NCCL INFO comm 0x55d4c3a0 rank 3 nranks 16 cudaDev 3 busId 3b000 id {v} - Init COMPLETE",
    'ValueError: bad value in {{"run": "r1", "ref": "{v}"}}',
    "ERROR: commit={v} revision: {v}",
    "Traceback shows {v}",
    "{v} error at step 40 (retrying)",
    "ERROR loading from {v}",
]


def lookalike_lines(rng: random.Random | None = None, per_kind: int = 12) -> list[tuple[str, str, str]]:
    """(kind, value, line) for every look-alike kind in every line shape."""
    rng = rng or random.Random(SEED + 2)
    out = []
    for kind, make in LOOKALIKES.items():
        for i in range(per_kind):
            value = make(rng)
            out.append((kind, value, _LOOKALIKE_LINES[i % len(_LOOKALIKE_LINES)].format(v=value)))
    return out
