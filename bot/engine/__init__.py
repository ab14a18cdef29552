"""The diagnosis engine, pure: text streams in, a `Diagnosis` out. One streaming scan with every
fingerprint and marker at once (scan, markers), rank/host/time of a line (context), progress
trends (trends), redaction of what is kept (redact), root versus collateral (diagnose), where a
failure that several ranks and hosts show started and which host differs (timeline), whether
text is a log at all (logshape). Imports only `bot.kb`, `bot.match`, the standard library and the
matcher libraries: it opens no file, runs no command and knows nothing of Slack, Slurm or storage."""
