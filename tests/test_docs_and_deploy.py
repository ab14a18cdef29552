"""Docs that are tested stay true: every command and setting is in the README and --help, and the
deploy files agree with the code (events the handlers listen to, settings that exist)."""
import re
from pathlib import Path

import click
import yaml

from bot.cli import main
from bot.config import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _commands(group: click.Group, prefix: str = "trainmedic") -> list[str]:
    out = []
    for name, cmd in group.commands.items():
        out.append(f"{prefix} {name}")
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix} {name}")
    return out


def test_every_command_is_in_the_readme_and_has_help():
    for command in _commands(main):
        assert command in README, f"{command} is not documented in README.md"
    for name, cmd in main.commands.items():
        assert cmd.help, f"trainmedic {name} has no usage text"


def test_every_setting_is_in_the_readme_and_the_help():
    from conftest import run_cli

    help_text = run_cli("--help").stdout.decode()
    for name in SETTINGS:
        assert f"`{name}`" in README, f"{name} is not documented in README.md"
        assert name in help_text


def test_the_readme_quickstart_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"^    (python3 -m venv .*pytest.*)$", README, re.M).group(1)
    assert test_command.replace("-q ", "") in ci.replace("-q ", "") or test_command in ci


def test_the_manifest_subscribes_to_what_the_handlers_listen_for():
    manifest = yaml.safe_load((ROOT / "deploy" / "slack-app-manifest.yaml").read_text())
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"app_mention", "app_home_opened", "message.channels", "message.im"} <= events
    assert manifest["features"]["slash_commands"][0]["command"] == "/diagnose"
    assert {"files:read", "chat:write", "commands", "app_mentions:read"} <= set(manifest["oauth_config"]["scopes"]["bot"])
    assert manifest["settings"]["interactivity"]["is_enabled"] is True


def test_deploy_files_only_name_settings_that_exist():
    named = set()
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            named |= set(re.findall(r"\b(TRAINMEDIC_[A-Z_]+|SLACK_[A-Z_]+)\b", path.read_text()))
    assert named and named <= set(SETTINGS), named - set(SETTINGS)


def test_kubernetes_manifests_parse_and_probe_healthz():
    docs = [d for p in (ROOT / "deploy" / "kubernetes").glob("*.yaml") for d in yaml.safe_load_all(p.read_text())]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Secret", "PersistentVolumeClaim"} <= kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployment["spec"]["replicas"] == 1


def test_deploy_files_give_the_shutdown_grace_time_to_finish():
    from bot.config import Settings

    grace = Settings().shutdown_grace
    unit = (ROOT / "deploy" / "trainmedic.service").read_text()
    stop = re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert stop and int(stop.group(1)) > grace and re.search(r"^KillMode=mixed$", unit, re.M)
    deployment = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
                      if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace
