"""Slack listeners, one module per surface; each has register(app, deps). Only the app factory imports this."""
from slack_bolt.async_app import AsyncApp

from bot.slack.replies import Deps


def register_all(app: AsyncApp, deps: Deps) -> None:
    from handlers import actions, commands, files, home, messages

    for module in (messages, files, commands, actions, home):
        module.register(app, deps)
