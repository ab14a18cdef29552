"""Where log text comes from: local files and stdin (gzip undone, binaries refused, decompressed
size capped), a Slurm job (its accounting and log tails, through scontrol/sacct), and the worker
processes that run scans off the bot's event loop. Each hands the engine byte streams. Imports
the engine, `bot.kb`, `bot.config`; never the history or Slack."""
