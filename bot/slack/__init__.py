"""The Slack side: the HTTP endpoint's size and signature checks (endpoint), the intake that stores
each request before it is acked (intake), the worker that replays stored requests through the app
(deliveries), the outbox that posts, edits and deletes replies (outbox) and the loop both run on
(loop), the Bolt app factory (app), the server for HTTP and Socket Mode (server), the Web API
clients and what a failed call means (client), the start-up token check (tokens), shared files and
their downloads (files), a message's text as pasted (text), Block Kit (blocks) and the listeners'
reply helpers (replies). The only layer that imports Slack's libraries, and `bot.slack.app` is the
only module that imports `handlers/`. May import every layer below it."""
