"""Rules for the commands an entry asks on-call to paste (knowledge/README.md, "Rules for commands").

A fix is run at 3 a.m. by someone who trusts it, so every `command` of `confirm` and `fix.steps`
is checked here; `kb check` and tests/test_kb_rules.py run these checks over every entry.
"""
from __future__ import annotations

import re

# Reboots and GPU resets end every job on the node (or GPU): never a fallback of another command.
_REBOOT = re.compile(r"\b(reboot|shutdown\s+-r|systemctl\s+(reboot|kexec)|scontrol\s+reboot(_nodes)?)\b")
_RESET = re.compile(r"\bnvidia-smi\b[^|;&]*\s(-r|--gpu-reset)\b")
_CHAIN = re.compile(r"\|\||&&|;|\|")
# How a step shows that nothing runs on the node or GPU before it is reset or rebooted.
_IDLE_CHECK = re.compile(r"\bsqueue\b[^|;&]*\s(-w|--nodelist)\b|nvidia-smi\b[^|;&]*--query-compute-apps|\bfuser\b[^|;&]*/dev/nvidia")
# Commands that throw away the evidence a diagnosis reads: kernel ring buffer, IB counters, journals.
_DESTROYS = re.compile(r"\bdmesg\s+(-\w*[cC]\b|--clear|--read-clear)|\bperfquery\b[^|;&]*\s(-R|--reset_after_read)\b"
                       r"|\bibdiagnet\b[^|;&]*\s--pc\b|\bibclear(counters|errors)\b|\bjournalctl\b[^|;&]*--(vacuum|rotate)")
_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")  # <node>, <gpu index>: not redirections
_SAVES = re.compile(r"(?:^|[^\d<>&])>>?\s*(?!/dev/null|&)[^\s&|;]+|\btee\b")
# A command is shell; a change to code or a config file goes in the step's `code` field.
_PYTHON_C = re.compile(r"""\bpython3?\s+-c\s+(["'])(?P<code>.*?)\1""", re.S)
_LOOKS_LIKE_CODE = re.compile(r"^\s*(from\s+\w[\w.]*\s+import\b|import\s+\w|def\s|class\s|@\w|for\s+\w+\s+in\s.*:\s*\S"
                              r"|[A-Za-z_][\w.]*\([^)]*\)\s*(#.*)?$|[A-Za-z_][\w.]*\.[\w.]+\s*=)")
_ELLIPSIS = re.compile(r"(?<![<\w])\.\.\.(?![\w>])")
# Flags and fields that exist only from some release on: the step must say which.
VERSION_GATED: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"\bsacct\b.*\bRestarts\b"), "24.11", "sacct's Restarts field exists from Slurm 24.11"),
)


def _saves(command: str) -> bool:
    return bool(_SAVES.search(_PLACEHOLDER.sub("X", command)))


def _step_problems(step: dict, where: str, before: list[dict]) -> list[str]:
    command = step.get("command")
    if not command:
        return []
    out = []
    wrecks = _REBOOT.search(command) or _RESET.search(command)
    if wrecks and _CHAIN.search(command):
        out.append(f"{where}: `{wrecks.group(0)}` is chained with another command; make the reset or reboot "
                   "a step of its own, never a fallback (`|| reboot`) or a follow-up (`&& reboot`)")
    if wrecks and not any(_IDLE_CHECK.search(s.get("command", "")) for s in before):
        out.append(f"{where}: `{wrecks.group(0)}` with no earlier step showing that nothing runs there "
                   "(`squeue -w <node>`, `nvidia-smi --query-compute-apps=pid --format=csv`)")
    destroys = _DESTROYS.search(command)
    if destroys and not _saves(command[: destroys.start()]) and not any(_saves(s.get("command", "")) for s in before):
        out.append(f"{where}: `{destroys.group(0)}` destroys evidence; save it first (a step that writes it to a file)")
    for m in _PYTHON_C.finditer(command):
        if not re.search(r"\bprint\(|\bsys\.exit\(|\bassert\b|\bhelp\(|\bexit\(", m.group("code")):
            out.append(f"{where}: `python -c` that prints nothing changes nothing in the job; put the change in `code:`")
    if "<<" in command:
        out.append(f"{where}: a heredoc is not a command to paste; put the snippet in `code:`")
    if _LOOKS_LIKE_CODE.match(command):
        out.append(f"{where}: this is Python, not a shell command; put it in `code:`")
    if _ELLIPSIS.search(command):
        out.append(f"{where}: `...` cannot be pasted; name what goes there (`<your train.py args>`) or use `code:`")
    for pattern, version, what in VERSION_GATED:
        if pattern.search(command) and version not in step.get("text", ""):
            out.append(f"{where}: {what}; the step text must say so")
    return out


def _selections(steps: list[dict]) -> list[str | None]:
    """The Xid action classes the steps name (None: a log whose class no step names), each a fix of its own."""
    named = sorted({a for step in steps for a in step.get("xid_actions", [])})
    return [*named, None]


def _applies(step: dict, action: str | None) -> bool:
    return "xid_actions" not in step or action in step["xid_actions"]


def problems(data: dict) -> list[str]:
    """Every rule an entry's commands break, one line each naming the step and the remedy.

    Steps with `xid_actions` are shown only for those Xid actions, so each selection a log can get
    is checked on its own (an idle check shown only for RESET_GPU does not cover a RESTART_BM reboot)."""
    confirm, fix = data.get("confirm", []), data.get("fix", {}).get("steps", [])
    out: list[str] = []
    for action in _selections(confirm + fix):
        shown = [(f"confirm[{i}]", s) for i, s in enumerate(confirm) if _applies(s, action)]
        shown += [(f"fix.steps[{i}]", s) for i, s in enumerate(fix) if _applies(s, action)]
        for j, (where, step) in enumerate(shown):  # the confirm steps run before the fix
            label = f"{where} (Xid action {action})" if action and "xid_actions" in step else where
            out += [p for p in _step_problems(step, label, [s for _, s in shown[:j]]) if p not in out]
    return out
