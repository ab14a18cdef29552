"""Slack listeners, one module per surface; each has register(app, deps). Only the app factory imports this.
COMMAND_ACKS: what each slash command's acknowledgement says, sent by the intake once it has stored it."""
from slack_bolt.async_app import AsyncApp

from bot.slack.replies import Deps
from handlers import commands

COMMAND_ACKS = {"/diagnose": commands.ack_text}


def register_all(app: AsyncApp, deps: Deps) -> None:
    from handlers import actions, files, home, messages

    for module in (messages, files, commands, actions, home):
        module.register(app, deps)
