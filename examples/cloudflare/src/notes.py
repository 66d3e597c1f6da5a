"""The agent of the example Worker: one Durable Object per session, holding its notes.

``Notes`` is the Durable Object class (``wrangler.jsonc`` binds it as ``AGENTS``); its tool
``remember`` writes a row of the object's own SQLite storage inside its step's transaction,
so a note is written exactly once however often the object is evicted mid-turn.
"""

from __future__ import annotations

import hmac
from typing import Any

from durable_turns import Agent, ToolContext, tool
from durable_turns.cloudflare import AgentObject, ObjectSetup
from durable_turns.models.resolve import resolve_model


@tool
def remember(note: str, ctx: ToolContext) -> str:
    """Keep a note in this session's storage."""
    sql = ctx.store.unwrap()  # ctx.storage.sql: exec(query, *bindings)
    sql.exec("CREATE TABLE IF NOT EXISTS notes (note TEXT NOT NULL)")
    sql.exec("INSERT INTO notes (note) VALUES (?)", note)
    count = sql.exec("SELECT count(*) AS n FROM notes").one()["n"]
    return f"kept; {count} notes so far"


def _text(env: Any, name: str) -> str | None:
    value = getattr(env, name, None)
    return value if isinstance(value, str) and value else None


class Notes(AgentObject):
    """The sessions of the ``notes`` agent."""

    def setup(self, env: Any) -> ObjectSetup:
        token = _text(env, "API_TOKEN")

        def bearer(request: Any) -> dict[str, str] | None:
            sent = request.headers.get("authorization")
            if token is None or not isinstance(sent, str):
                return None
            ok = hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())
            return {"id": "owner"} if ok else None

        # "scripted" runs offline: it calls a tool named by the turn's text
        # (remember {"note": "…"}). MODEL names another (anthropic:claude-…), its key the
        # secret MODEL_API_KEY (a Worker's secrets are in env, not in os.environ).
        spec, key = _text(env, "MODEL") or "scripted", _text(env, "MODEL_API_KEY")
        model = resolve_model(spec, api_key=key) if key else resolve_model(spec)
        return ObjectSetup([Agent("notes", "You keep the user's notes.", [remember])], model,
                           authenticate=bearer if token is not None else None)
