"""The reply's buttons: Resolved (a note), Wrong diagnosis (the right entry), Show full entry.
Status changes edit the original reply instead of posting new messages."""
from __future__ import annotations

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import blocks
from bot.slack.replies import Deps, Target, refresh_reply, say

RESOLVE_VIEW, WRONG_VIEW = "resolve_incident", "wrong_diagnosis"
UNKNOWN = "unknown"


def _modal(callback_id: str, title: str, incident_id: str, body: list[dict]) -> dict:
    return {"type": "modal", "callback_id": callback_id, "private_metadata": incident_id,
            "title": {"type": "plain_text", "text": title}, "submit": {"type": "plain_text", "text": "Save"},
            "close": {"type": "plain_text", "text": "Cancel"}, "blocks": body}


def _note_input(optional: bool) -> dict:
    return {"type": "input", "block_id": "note", "optional": optional,
            "label": {"type": "plain_text", "text": "What fixed it?" if not optional else "Note (optional)"},
            "element": {"type": "plain_text_input", "action_id": "value", "multiline": True, "max_length": 2000}}


def _entry_select(deps: Deps) -> dict:
    options = [{"text": {"type": "plain_text", "text": "Unknown: no entry fits"}, "value": UNKNOWN}]
    for e in sorted(deps.kb.entries.values(), key=lambda e: e.id)[:99]:  # Slack allows 100 options
        options.append({"text": {"type": "plain_text", "text": e.id[:75]}, "value": e.id})
    return {"type": "input", "block_id": "entry", "label": {"type": "plain_text", "text": "The right diagnosis"},
            "element": {"type": "static_select", "action_id": "value", "options": options}}


def register(app: AsyncApp, deps: Deps) -> None:
    async def _open(client: AsyncWebClient, body: dict, view: dict) -> None:
        await client.views_open(trigger_id=body["trigger_id"], view=view)

    async def _not_recorded(body: dict) -> None:
        await say(deps, Target(body["channel"]["id"], private=True, user=body["user"]["id"]),
                  "This diagnosis was not recorded as an incident, so it has no status.")

    @app.action(blocks.ACTION_RESOLVE)
    async def on_resolve(ack, body: dict, action: dict, client: AsyncWebClient) -> None:
        await ack()
        if action["value"] == "0":
            return await _not_recorded(body)
        await _open(client, body, _modal(RESOLVE_VIEW, "Resolve incident", action["value"], [_note_input(False)]))

    @app.action(blocks.ACTION_WRONG)
    async def on_wrong(ack, body: dict, action: dict, client: AsyncWebClient) -> None:
        await ack()
        if action["value"] == "0":
            return await _not_recorded(body)
        view = _modal(WRONG_VIEW, "Wrong diagnosis", action["value"], [_entry_select(deps), _note_input(True)])
        await _open(client, body, view)

    @app.action(blocks.ACTION_ENTRY)
    async def on_entry(ack, body: dict, action: dict, client: AsyncWebClient) -> None:
        await ack()
        entry = deps.kb.entries.get(action["value"])
        if entry is None:
            return
        await _open(client, body, {"type": "modal", "title": {"type": "plain_text", "text": "trainmedic entry"},
                                   "blocks": blocks.entry_blocks(entry)})

    @app.view(RESOLVE_VIEW)
    async def on_resolve_submit(ack, body: dict, view: dict) -> None:
        await ack()
        incident_id = int(view["private_metadata"])
        note = view["state"]["values"]["note"]["value"]["value"] or ""
        await deps.history.call("resolve", incident_id, note, user=body["user"]["id"])
        await refresh_reply(deps, incident_id)

    @app.view(WRONG_VIEW)
    async def on_wrong_submit(ack, body: dict, view: dict) -> None:
        await ack()
        incident_id = int(view["private_metadata"])
        values = view["state"]["values"]
        right = values["entry"]["value"]["selected_option"]["value"]
        note = (values.get("note", {}).get("value") or {}).get("value")
        await deps.history.call("mark_wrong", incident_id, None if right == UNKNOWN else right,
                                user=body["user"]["id"], note=note)
        await refresh_reply(deps, incident_id)
