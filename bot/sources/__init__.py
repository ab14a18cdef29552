"""Where log text comes from: local files and stdin (gzip undone, binaries refused, decompressed
size capped), a Slurm job (its accounting, its log files and every node's kernel log: slurm,
joblogs, kernel), the bounded runner of cluster commands (commands, cluster), the worker
processes that run scans off the bot's event loop, and the forked workers that scan the many
files of one job in parallel (parallel). Each hands the engine byte streams. Imports
the engine, `bot.kb`, `bot.config`; never the history or Slack."""
