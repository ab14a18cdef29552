"""The Bolt app factory: one AsyncApp for HTTP mode and Socket Mode alike."""
from __future__ import annotations

import logging

from slack_bolt.async_app import AsyncApp
from slack_bolt.response import BoltResponse

from bot.slack.client import web_client
from bot.slack.replies import Deps

log = logging.getLogger("trainmedic")


def create_app(deps: Deps) -> AsyncApp:
    """The app with every surface registered; `deps` is handed to handlers, never put into context."""
    import handlers

    settings = deps.settings
    app = AsyncApp(
        client=web_client(settings.slack_bot_token, settings.slack_api_url),
        signing_secret=settings.slack_signing_secret or "socket-mode-needs-no-signing-secret",
        request_verification_enabled=bool(settings.slack_signing_secret),
        logger=log,
    )

    @app.middleware
    async def drop_duplicate_events(body: dict, next) -> BoltResponse | None:
        # Slack retries an event it thinks we missed (X-Slack-Retry-Num) and may deliver one twice:
        # the event id is claimed in the history, so a restart does not forget it either.
        event_id = body.get("event_id")
        if event_id and not await deps.history.call("claim_event", event_id):
            log.info("duplicate event %s dropped", event_id)
            return BoltResponse(status=200, body="")
        return await next()

    handlers.register_all(app, deps)
    return app
