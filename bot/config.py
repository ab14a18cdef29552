"""Settings: the environment first, then an optional YAML file named by TRAINMEDIC_CONFIG.

Every setting is listed in SETTINGS with its meaning; `trainmedic --help` and the README print
this table, and a test checks that both name every setting.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import yaml

SETTINGS: dict[str, str] = {
    "SLACK_BOT_TOKEN": "bot token (xoxb-...) for the Slack Web API",
    "SLACK_SIGNING_SECRET": "signing secret that Slack signs HTTP requests with (HTTP mode)",
    "SLACK_APP_TOKEN": "app-level token (xapp-...) for Socket Mode",
    "TRAINMEDIC_SLACK_API_URL": "Slack Web API base URL (default https://slack.com/api/; GovSlack, proxies, tests)",
    "TRAINMEDIC_DB": "incident history SQLite file (default ~/.local/share/trainmedic/incidents.db)",
    "TRAINMEDIC_KB_PATH": "extra knowledge entry folders, colon-separated, layered over the shipped ones",
    "TRAINMEDIC_ENGINE": "multi-pattern engine: auto (default), hyperscan or re2",
    "TRAINMEDIC_SLURM_LOG_ROOTS": "folders, colon-separated, that Slurm job logs may be read from",
    "TRAINMEDIC_SLURM_COMMAND_PREFIX": "argv run before every cluster command (scontrol, sacct, find, stat, realpath, tail, the node command), e.g. 'ssh login01' (arguments are shell-quoted)",
    "TRAINMEDIC_SLURM_TIMEOUT": "seconds a Slurm command may take, waiting for a slot included, before its session is killed (default 20)",
    "TRAINMEDIC_SLURM_TAIL_MB": "how much of the end of each job log is read (default 64)",
    "TRAINMEDIC_SLURM_RANK_LOGS": "per-rank log patterns, colon-separated, relative to the job's WorkDir (Slurm's %j %x %u %t %N ... and * ?), e.g. 'logs/%j/rank%t.log'",
    "TRAINMEDIC_SLURM_MAX_FILES": "most log files read for one job (default 256); the rest are named in a note",
    "TRAINMEDIC_SLURM_JOB_MB": "most log text read for one job, shared by its files (default 1024)",
    "TRAINMEDIC_NODE_COMMAND": "argv that runs a command on one node of the job, with {node} and {jobid}, e.g. 'ssh -o BatchMode=yes {node}' or 'srun --jobid={jobid} --overlap --nodelist={node} -N1 -n1' (unset: no kernel logs are read)",
    "TRAINMEDIC_NODE_TIMEOUT": "seconds one node may take to return its kernel log (default 15); a node that does not is named",
    "TRAINMEDIC_KERNEL_WINDOW_MIN": "minutes of kernel log read before the job ended (default 60; 5 more after it)",
    "TRAINMEDIC_KERNEL_LOG_MB": "most kernel log read from one node (default 4)",
    "TRAINMEDIC_COMMANDS_MAX": "cluster commands in flight at once, all users together (default 64)",
    "TRAINMEDIC_COMMANDS_PER_USER": "cluster commands in flight at once for one user (default 16)",
    "TRAINMEDIC_JOB_POLICY": "who may diagnose a job from Slack: 'channel' (any member of an allowed channel, default) or 'owner'",
    "TRAINMEDIC_USER_MAP": "YAML file mapping Slack user ids to cluster user names (for TRAINMEDIC_JOB_POLICY=owner)",
    "TRAINMEDIC_ALLOWED_CHANNELS": "channel ids, comma-separated, where /diagnose <jobid> works (default: any)",
    "TRAINMEDIC_MAX_DOWNLOAD_MB": "largest Slack file download (default 1024); a bigger plain log is fetched as its first and last halves",
    "TRAINMEDIC_MAX_LOG_MB": "largest log text read from one upload after decompression (default 4096)",
    "TRAINMEDIC_RETENTION_DAYS": "incidents older than this are purged at start-up (default 365; 0 keeps all)",
    "TRAINMEDIC_SHUTDOWN_GRACE": "seconds the bot lets running work finish after SIGTERM; the rest waits for the next start (default 10)",
    "TRAINMEDIC_ACK_BUDGET_MS": "longest the bot waits to store a request before acking it; past that it answers 503 and Slack retries (default 1500)",
    "TRAINMEDIC_MAX_REQUEST_KB": "largest request body the bot accepts from Slack; a bigger one gets 413 (default 1024)",
    "TRAINMEDIC_GIVE_UP_AFTER": "seconds a request or a reply is retried through Slack outages and a busy database before it ends failed (default 86400)",
    "TRAINMEDIC_SLACK_TIMEOUT": "seconds a Slack Web API call may take; a post that timed out is looked up before it is sent again (default 20)",
    "TRAINMEDIC_CONFIG": "optional YAML file with any of these settings (the environment wins)",
}
DEFAULT_SLACK_API_URL = "https://slack.com/api/"


class ConfigError(Exception):
    """A setting that cannot be used; the message names it."""


def _int(values: Mapping[str, str], name: str, default: int) -> int:
    raw = values.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a whole number") from None


@dataclass(frozen=True)
class Settings:
    slack_bot_token: str | None = None
    slack_signing_secret: str | None = None
    slack_app_token: str | None = None
    slack_api_url: str = DEFAULT_SLACK_API_URL
    db: str | None = None
    slurm_log_roots: tuple[Path, ...] = ()
    max_download_bytes: int = 1024 << 20
    max_log_bytes: int = 4096 << 20
    retention_days: int = 365
    slurm_prefix: tuple[str, ...] = ()
    slurm_timeout: float = 20.0
    slurm_tail_bytes: int = 64 << 20
    slurm_rank_logs: tuple[str, ...] = ()
    slurm_max_files: int = 256
    slurm_job_bytes: int = 1024 << 20
    node_command: tuple[str, ...] = ()
    node_timeout: float = 15.0
    kernel_window_min: int = 60
    kernel_log_bytes: int = 4 << 20
    commands_max: int = 64
    commands_per_user: int = 16
    job_policy: str = "channel"
    user_map: dict = field(default_factory=dict)
    allowed_channels: frozenset = frozenset()
    shutdown_grace: float = 10.0
    ack_budget: float = 1.5
    max_request_bytes: int = 1024 << 10
    give_up_after: float = 86400.0
    slack_timeout: float = 20.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        values: dict[str, str] = {}
        if env.get("TRAINMEDIC_CONFIG"):
            values.update(_read_file(Path(env["TRAINMEDIC_CONFIG"])))
        values.update({k: v for k, v in env.items() if k in SETTINGS})
        url = values.get("TRAINMEDIC_SLACK_API_URL") or DEFAULT_SLACK_API_URL
        return cls(
            slack_bot_token=values.get("SLACK_BOT_TOKEN") or None,
            slack_signing_secret=values.get("SLACK_SIGNING_SECRET") or None,
            slack_app_token=values.get("SLACK_APP_TOKEN") or None,
            slack_api_url=url if url.endswith("/") else url + "/",
            db=values.get("TRAINMEDIC_DB") or None,
            slurm_log_roots=tuple(Path(p) for p in values.get("TRAINMEDIC_SLURM_LOG_ROOTS", "").split(":") if p),
            max_download_bytes=_int(values, "TRAINMEDIC_MAX_DOWNLOAD_MB", 1024) << 20,
            max_log_bytes=_int(values, "TRAINMEDIC_MAX_LOG_MB", 4096) << 20,
            retention_days=_int(values, "TRAINMEDIC_RETENTION_DAYS", 365),
            slurm_prefix=tuple(shlex.split(values.get("TRAINMEDIC_SLURM_COMMAND_PREFIX", ""))),
            slurm_timeout=float(_int(values, "TRAINMEDIC_SLURM_TIMEOUT", 20)),
            slurm_tail_bytes=_int(values, "TRAINMEDIC_SLURM_TAIL_MB", 64) << 20,
            slurm_rank_logs=tuple(p for p in values.get("TRAINMEDIC_SLURM_RANK_LOGS", "").split(":") if p),
            slurm_max_files=_positive(values, "TRAINMEDIC_SLURM_MAX_FILES", 256),
            slurm_job_bytes=_positive(values, "TRAINMEDIC_SLURM_JOB_MB", 1024) << 20,
            node_command=_node_command(values.get("TRAINMEDIC_NODE_COMMAND", "")),
            node_timeout=float(_positive(values, "TRAINMEDIC_NODE_TIMEOUT", 15)),
            kernel_window_min=_positive(values, "TRAINMEDIC_KERNEL_WINDOW_MIN", 60),
            kernel_log_bytes=_positive(values, "TRAINMEDIC_KERNEL_LOG_MB", 4) << 20,
            commands_max=_positive(values, "TRAINMEDIC_COMMANDS_MAX", 64),
            commands_per_user=_positive(values, "TRAINMEDIC_COMMANDS_PER_USER", 16),
            job_policy=_policy(values.get("TRAINMEDIC_JOB_POLICY") or "channel"),
            user_map=_user_map(values.get("TRAINMEDIC_USER_MAP")),
            allowed_channels=frozenset(c.strip() for c in values.get("TRAINMEDIC_ALLOWED_CHANNELS", "").split(",") if c.strip()),
            shutdown_grace=float(_positive(values, "TRAINMEDIC_SHUTDOWN_GRACE", 10)),
            ack_budget=_positive(values, "TRAINMEDIC_ACK_BUDGET_MS", 1500) / 1000,
            max_request_bytes=_positive(values, "TRAINMEDIC_MAX_REQUEST_KB", 1024) << 10,
            give_up_after=float(_positive(values, "TRAINMEDIC_GIVE_UP_AFTER", 86400)),
            slack_timeout=float(_positive(values, "TRAINMEDIC_SLACK_TIMEOUT", 20)),
        )


def _positive(values: Mapping[str, str], name: str, default: int) -> int:
    value = _int(values, name, default)
    if value < 1:
        raise ConfigError(f"{name}={value}: expected a number above 0")
    return value


def _node_command(value: str) -> tuple[str, ...]:
    argv = tuple(shlex.split(value))
    if argv and not any("{node}" in a for a in argv):
        raise ConfigError(f"TRAINMEDIC_NODE_COMMAND={value!r}: name the node with {{node}}, e.g. 'ssh {{node}}'")
    return argv


def _policy(value: str) -> str:
    if value not in ("channel", "owner"):
        raise ConfigError(f"TRAINMEDIC_JOB_POLICY={value!r}: use 'channel' or 'owner'")
    return value


def _user_map(path: str | None) -> dict:
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"TRAINMEDIC_USER_MAP={path}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"TRAINMEDIC_USER_MAP={path}: expected a mapping of Slack user ids to cluster user names")
    return {str(k): str(v) for k, v in data.items()}


def _read_file(path: Path) -> dict[str, str]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"TRAINMEDIC_CONFIG={path}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"TRAINMEDIC_CONFIG={path}: expected a mapping of setting names to values")
    unknown = sorted(set(data) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"TRAINMEDIC_CONFIG={path}: unknown settings {unknown}; `trainmedic --help` lists them")
    return {k: str(v) for k, v in data.items()}


def cache_dir() -> Path:
    """Where compiled engines, validated entries and redaction rules are cached (XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainmedic"


def write_cache(path: Path, data: bytes) -> None:
    """Write a cache file whole, so that no reader sees half of one. A cache that cannot be written
    (a read-only home) is not an error: what it holds is worked out again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError:
        pass


def settings_help() -> str:
    width = max(map(len, SETTINGS))
    return "\n".join(f"  {name.ljust(width)}  {meaning}" for name, meaning in SETTINGS.items())
