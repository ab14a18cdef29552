"""The incident history in SQLite, and the life of each Slack request and reply (deliveries,
outbox): the schema and its migrations (schema), the one writer (writes), the queries behind the
review CLI, the App Home and host tallies (queries), the store that puts them together and its
asyncio wrapper (store), and the signature that links repeats (signature). Imports the engine's
`Diagnosis` type and the standard library plus sqlite-utils; never the sources or Slack."""
