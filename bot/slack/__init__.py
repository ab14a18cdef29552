"""The Slack side: the Bolt app factory (app), the server for HTTP and Socket Mode (server), the
Web API client (client), the start-up token check (tokens), shared files and their downloads
(files), a message's text as pasted (text), Block Kit (blocks), posting replies (replies), where
one answer goes (answers) and one answer per message (claims). The only layer that imports Slack's
libraries, and `bot.slack.app` is the only module that imports `handlers/`. May import every layer
below it."""
