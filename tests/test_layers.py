"""The layering of bot/ is a test: a module imports only its own package or a lower layer.

Imports are read with ast (nothing is imported), function-level imports included. The table below
is the architecture of the README; a failure here means the design moved, not that the test needs
an exception.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Module prefix -> layer, low to high. A module may import its own group or a group of a lower
# layer; two groups on one layer (sources and history, the renderers) never import each other.
LAYERS = {
    "knowledge": 0, "bot": 0,
    "bot.config": 1,
    "bot.match": 2,
    "bot.kb": 3,
    "bot.engine": 4,
    "bot.sources": 5, "bot.history": 5,
    "bot.render": 6, "bot.tables": 6, "bot.kbcheck": 6,
    "bot.slack": 7,
    "handlers": 8,  # the listeners use bot.slack's helpers ...
    "bot.slack.app": 9,  # ... and only the app factory imports them
    "bot.slack.server": 10,
    "bot.cli": 11,
}
# Libraries that belong to one side only: the pure layers (up to the engine) run no command,
# open no socket or database and know nothing of Slack.
SIDE_EFFECT_LIBS = {"subprocess", "sqlite3", "sqlite_utils", "asyncio", "multiprocessing", "socket", "aiohttp",
                    "slack_bolt", "slack_sdk", "concurrent"}
PURE_UP_TO = LAYERS["bot.engine"]
SLACK_LIBS = {"aiohttp", "slack_bolt", "slack_sdk"}
SLACK_FROM = LAYERS["bot.slack"]


def group(module: str) -> str | None:
    """The longest LAYERS prefix of a dotted module name, or None for a library."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return prefix
    return None


def imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in the source, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from bot.engine import scan` is bot.engine.scan; a trailing attribute name does not
            # change the longest prefix that `group` finds.
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def problems(module: str, source: str) -> list[str]:
    """Why `module` (dotted name) breaks the layering, one line per import."""
    mine = group(module)
    layer = LAYERS[mine]
    found = []
    for line, target in imports(source):
        theirs = group(target)
        top = target.split(".")[0]
        if theirs is None:
            if layer <= PURE_UP_TO and top in SIDE_EFFECT_LIBS:
                found.append(f"{module}:{line} imports {target}: the pure layers run no command and open no socket or database")
            elif layer < SLACK_FROM and top in SLACK_LIBS:
                found.append(f"{module}:{line} imports {target}: only bot.slack and handlers talk to Slack")
            continue
        if theirs == mine or LAYERS[theirs] < layer:
            continue
        found.append(f"{module}:{line} imports {target}: {mine} (layer {layer}) may not import {theirs} "
                     f"(layer {LAYERS[theirs]})")
    return found


def _modules():
    for folder in ("bot", "handlers", "knowledge"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def test_every_module_belongs_to_a_layer():
    strays = [name for name, _ in _modules() if group(name) is None]
    assert not strays, f"modules outside the layer table (add their package to LAYERS and the README): {strays}"


def test_no_module_imports_a_higher_layer():
    found = [p for name, path in _modules() for p in problems(name, path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module, source", [
    ("bot.engine.scan", "from bot.slack import blocks\n"),
    ("bot.engine.diagnose", "def f():\n    from bot.history.store import History\n"),
    ("bot.sources.files", "import bot.history.queries\n"),
    ("bot.history.writes", "from bot.sources import workers\n"),
    ("bot.slack.replies", "import handlers.files\n"),
    ("bot.kb.load", "from bot.engine import diagnose\n"),
    ("bot.engine.scan", "import subprocess\n"),
    ("bot.history.store", "from slack_sdk import WebClient\n"),
])
def test_an_upward_import_is_caught(module, source):
    assert problems(module, source)


@pytest.mark.parametrize("module, source", [
    ("bot.engine.scan", "from bot.kb.load import KnowledgeBase\nfrom bot.match import engines\nimport re2\n"),
    ("bot.slack.app", "import handlers\n"),
    ("handlers.files", "from bot.slack.replies import Deps\nfrom bot.sources.files import open_log\n"),
    ("bot.cli", "from bot.slack.server import run\n"),
])
def test_a_downward_import_is_allowed(module, source):
    assert problems(module, source) == []


def test_the_readme_architecture_names_every_package():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    for prefix in LAYERS:
        if prefix == "bot":
            continue
        path = prefix.replace(".", "/")
        shown = f"`{path}/`" if (ROOT / path).is_dir() else f"`{path}.py`"
        assert shown in section, f"README's Architecture section does not name {shown}"
