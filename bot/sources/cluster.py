"""The cluster as the bot reaches it: Slurm commands through TRAINMEDIC_SLURM_COMMAND_PREFIX, and
commands on one node of a job through TRAINMEDIC_NODE_COMMAND, all under one user's limits."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from bot.config import Settings
from bot.sources.commands import CommandError, Output, remote, runner

ANSWER_CAP = 4 << 20  # bytes of a Slurm command's answer that are read (a job's sacct is KBs)


class JobError(Exception):
    """The job cannot be diagnosed; the message says why in one line."""


@dataclass
class Cluster:
    settings: Settings
    user: str | None = None  # whose limits the commands count against (a Slack user; None: the CLI)

    async def run(self, argv: list[str], dest: Path | None = None, cap: int = ANSWER_CAP) -> Output:
        """A command through the Slurm prefix; JobError when it cannot run or does not answer."""
        return await self._run(argv[0], remote(self.settings.slurm_prefix, argv), self.settings.slurm_timeout, cap, dest)

    async def on_node(self, node: str, jobid: str, argv: list[str], dest: Path, cap: int) -> Output:
        """A command on one node of the job, through the node command and the Slurm prefix."""
        template = self.settings.node_command
        on_node = [a.replace("{node}", node).replace("{jobid}", jobid) for a in template]
        # ssh hands its arguments to the node's shell, srun runs them as they are
        inner = on_node + ([shlex.quote(a) for a in argv] if _is_ssh(template) else argv)
        return await self._run(f"{argv[0]} on {node}", remote(self.settings.slurm_prefix, inner),
                               self.settings.node_timeout, cap, dest)

    async def _run(self, name: str, argv: list[str], timeout: float, cap: int, dest: Path | None) -> Output:
        s = self.settings
        try:
            return await runner(s.commands_max, s.commands_per_user).run(argv, timeout, cap, self.user, dest, name)
        except CommandError as exc:
            raise JobError(str(exc)) from None


def _is_ssh(template: tuple[str, ...]) -> bool:
    return bool(template) and os.path.basename(template[0]).endswith("ssh")
