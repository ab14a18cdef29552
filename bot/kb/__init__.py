"""The knowledge base as code: loading and validating entries (shipped ones with site folders
layered on top), the entry page shown to a person. Imports `bot.match` (to check that every
fingerprint compiles for the engines), `bot.config` and the `knowledge` data package; never the
engine, the sources, the history or Slack. (`kb check` runs the diagnoser, so it lives above the
engine, in `bot.kbcheck`.)"""
