"""The Slack side: the Bolt app factory (app), the server for HTTP and Socket Mode (server), the
Web API client (client), file downloads (files), Block Kit (blocks) and posting replies
(replies). The only layer that imports Slack's libraries, and `bot.slack.app` is the only module
that imports `handlers/`. May import every layer below it."""
