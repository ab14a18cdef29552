"""The Bolt app factory: one AsyncApp for HTTP mode and Socket Mode alike.

Every request from Slack goes first through the intake (stored, then acked: bot/slack/intake.py);
the listeners run only when the delivery worker replays it (bot/slack/deliveries.py), with
`process_before_response` so the replay returns when the listener is done, and an error handler
that hands the listener's exception to the worker. Signatures are checked before Bolt, by the
HTTP endpoint (bot/slack/endpoint.py), which also keeps refused bodies out of the log.
"""
from __future__ import annotations

import logging
import re
from typing import Callable

from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.client import Unauthorized, web_client
from bot.slack.deliveries import BOT_USER, ERROR
from bot.slack.intake import REPLAYED, Intake
from bot.slack.replies import Deps

log = logging.getLogger("trainmedic")
ANY = re.compile(".*")


def create_app(deps: Deps, wake: Callable[[], None]) -> tuple[AsyncApp, Intake]:
    """The app with every surface registered, and its intake; `wake` tells the delivery worker of new work."""
    import handlers

    settings = deps.settings
    intake = Intake(deps.history, settings.ack_budget, wake, handlers.COMMAND_ACKS)
    app = AsyncApp(
        client=web_client(None, settings.slack_api_url, settings.slack_timeout),
        authorize=_authorizer(settings.slack_bot_token),
        before_authorize=intake,
        request_verification_enabled=False,
        process_before_response=True,
        logger=log,
    )

    @app.error
    async def hand_to_the_worker(error: Exception, context) -> None:
        if context.get(REPLAYED):
            context[ERROR] = error  # the worker decides: retry later, or tell the user
        else:
            log.error("error while acknowledging a request: %s", error, exc_info=error)

    handlers.register_all(app, deps)

    async def nobody_handles(ack) -> None:
        """What no surface wants ends here, done: no 404, and Bolt logs no body."""
        await ack()

    for listen in (app.event, app.command, app.action, app.view, app.shortcut):
        listen(ANY)(nobody_handles)
    return app, intake


def _authorizer(token: str | None):
    """Bolt's authorization from one auth.test, kept once it succeeds. While Slack cannot answer it,
    an event still runs with the bot user its payload names (`authorizations`), so a pasted log is
    diagnosed during an outage and its reply waits in the outbox; anything else raises (Bolt would
    answer a Slack error with a 200 and run no listener), so the request is retried later."""
    found: list = []

    async def authorize(client: AsyncWebClient, context) -> AuthorizeResult:
        if not found:
            try:
                found.append(await client.auth_test(token=token))
            except Exception as exc:
                if context.get(BOT_USER):
                    return AuthorizeResult(enterprise_id=context.enterprise_id, team_id=context.team_id,
                                           bot_user_id=context[BOT_USER], bot_token=token)
                raise Unauthorized("auth.test failed") from exc
        return AuthorizeResult.from_auth_test_response(auth_test_response=found[0], bot_token=token)

    return authorize
