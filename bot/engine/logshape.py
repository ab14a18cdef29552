"""Whether a piece of text is a log someone wants diagnosed or a sentence to the bot.

A message with no fingerprint hit is still a log when one of its lines has the shape of a log
line: a timestamp, a rank or host prefix, a log level, a traceback, an exception line, a
scheduler's error prefix. "hi, what can you do?" and "why did my job fail with an error?" have
none of these; `RuntimeError: CUDA error: unknown error` and a glog line do.
"""
from __future__ import annotations

import re

from bot.engine.context import line_context

_SHAPES = re.compile(
    r"Traceback \(most recent call last\)"
    r"|^\s*File \".+\", line \d+"  # a Python frame
    r"|^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b(?:: |:$|$)"  # a raised exception
    r"|(?:^\s*|\[)(?:FATAL|ERROR|CRITICAL|WARN(?:ING)?|INFO|DEBUG|TRACE)(?:[\s\]:]|$)"  # a log level
    r"|^\s*(?i:error|fatal(?: error)?|panic): "  # error: ..., as compilers and Go print it
    r"|^\s*(?:srun|slurmstepd|sbatch|salloc|torchrun|mpirun|deepspeed): "  # launcher prefixes
    r"|\(core dumped\)|^\s*Killed\s*$",
    re.MULTILINE,
)


def looks_like_log(text: str) -> bool:
    """True when a line of `text` has the shape of a log line (see the module docstring)."""
    if _SHAPES.search(text):
        return True
    for line in text.splitlines():
        context = line_context(line)
        if context.time or context.rank is not None or context.host:
            return True
    return False
