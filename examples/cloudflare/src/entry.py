"""The Worker: routes /agents/{agent}/sessions/{id}/… to the session's Durable Object."""

from notes import Notes
from workers import WorkerEntrypoint

from durable_turns.cloudflare import forward

__all__ = ["Default", "Notes"]  # Notes: the Durable Object class wrangler.jsonc names


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await forward(request, self.env.AGENTS)
