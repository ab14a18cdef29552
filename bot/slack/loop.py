"""The shape of the bot's two workers (deliveries, outbox): do what is due, then sleep until woken
(new work was stored) or until the next row is due. A failing pass (a locked database) is logged
and tried again a second later: the work waits in the history, not in the loop."""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("trainmedic")


class WakeLoop:
    name = "worker"

    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._stopping = False

    def wake(self) -> None:
        self._wake.set()

    async def start_due(self) -> float:
        """Start what is due; return the seconds until something else will be."""
        raise NotImplementedError

    async def run(self) -> None:
        while not self._stopping:
            try:
                wait = await self.start_due()
            except Exception:  # noqa: BLE001 - see the module docstring
                log.exception("%s: cannot read the history", self.name)
                wait = 1.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.01, wait))
            except asyncio.TimeoutError:
                pass
