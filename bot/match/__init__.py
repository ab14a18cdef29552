"""Matching: linear-time multi-pattern engines over bytes (Hyperscan where its wheel exists, RE2
everywhere) and the required-literal analysis that lets Hyperscan look for rare literals instead
of whole patterns. The lowest code layer: it imports only the standard library, the matcher
libraries, `bot.config` (the cache folder) and the `knowledge` data package (the benign corpus
that tells a rare literal from a common one)."""
