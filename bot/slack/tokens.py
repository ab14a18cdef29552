"""Start-up checks of the Slack tokens, so a bad one stops `trainmedic serve` with one clear line
instead of a socket client that retries with tracebacks for ever."""
from __future__ import annotations

import logging

import aiohttp
from slack_sdk.errors import SlackApiError

from bot.config import ConfigError, Settings
from bot.slack.client import web_client

log = logging.getLogger("trainmedic")

# What apps.connections.open answers for a token that will never open a socket; anything else
# (Slack unreachable, internal_error, ratelimited) is left to the socket client's own retries.
_BAD_APP_TOKEN = frozenset({"invalid_auth", "not_authed", "not_allowed_token_type", "token_revoked",
                            "token_expired", "account_inactive", "missing_scope", "forbidden_team"})


async def check_app_token(settings: Settings) -> None:
    """Ask Slack for a Socket Mode URL with SLACK_APP_TOKEN (the call the socket makes first);
    ConfigError naming the setting and Slack's answer when the token is refused."""
    client = web_client(settings.slack_app_token, settings.slack_api_url)
    try:
        await client.apps_connections_open(app_token=settings.slack_app_token)
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error in _BAD_APP_TOKEN:
            raise ConfigError(
                f"SLACK_APP_TOKEN was refused by Slack (apps.connections.open: {error}): Socket Mode needs an "
                "app-level token (xapp-...) with the connections:write scope, from Basic Information -> "
                "App-Level Tokens") from None
        log.warning("could not check SLACK_APP_TOKEN (apps.connections.open: %s); connecting anyway", error)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("could not reach Slack to check SLACK_APP_TOKEN (%s); connecting anyway", exc)
