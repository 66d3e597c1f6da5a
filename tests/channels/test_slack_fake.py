"""F16: The fake Slack Web API answers slack_sdk the way Slack does (so the channel's tests mean
something): logical errors as HTTP 200 ``ok: false`` (``SlackApiError`` with the code), ts
strings, streaming state, 429 with ``Retry-After``."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from fakes.serving import serving
from fakes.slack_api import TOKEN, SlackFake


async def test_the_fake_speaks_slack_to_slack_sdk() -> None:
    fake = SlackFake()
    async with serving(fake.app) as url:
        client = AsyncWebClient(token=TOKEN, base_url=f"{url}/api/")
        auth = await client.auth_test()
        assert auth["ok"] is True and auth["user_id"] == "UBOT"
        posted = await client.chat_postMessage(channel="C1", text="hi", thread_ts="1.0")
        assert isinstance(posted["ts"], str) and posted["message"]["thread_ts"] == "1.0"
        later = await client.chat_postMessage(channel="C1", text="again")
        assert float(later["ts"]) > float(posted["ts"])
        errors = []
        wrong = AsyncWebClient(token="xoxb-wrong", base_url=f"{url}/api/")
        calls: list[Awaitable[Any]] = [
            wrong.auth_test(),
            client.chat_postMessage(channel="nope", text="x"),
            client.chat_update(channel="C1", ts="9.9", text="x"),
            client.chat_appendStream(channel="C1", ts=posted["ts"], markdown_text="x"),
        ]
        for call in calls:
            with pytest.raises(SlackApiError) as caught:
                await call
            assert caught.value.response.status_code == 200
            errors.append(caught.value.response["error"])
        assert errors == ["invalid_auth", "channel_not_found", "message_not_found",
                          "message_not_in_streaming_state"]
        with pytest.warns(UserWarning, match="text"), pytest.raises(SlackApiError,
                                                                     match="no_text"):
            await client.chat_postMessage(channel="C1", text="")
        stream = await client.chat_startStream(
            channel="C1", thread_ts="1.0", recipient_user_id="U1", recipient_team_id="T1",
            chunks=[{"type": "markdown_text", "text": "a"}])
        await client.chat_appendStream(channel="C1", ts=stream["ts"], chunks=[
            {"type": "task_update", "id": "t", "title": "tool", "status": "in_progress"}])
        await client.chat_stopStream(channel="C1", ts=stream["ts"], markdown_text="b")
        with pytest.raises(SlackApiError, match="message_not_in_streaming_state"):
            await client.chat_stopStream(channel="C1", ts=stream["ts"])
        assert fake.messages[("C1", stream["ts"])].text == "ab"
        fake.rate_limit("chat.postMessage", retry_after=7)
        with pytest.raises(SlackApiError) as limited:
            await client.chat_postMessage(channel="C1", text="x")  # no retry handler here
        assert limited.value.response.status_code == 429
        assert limited.value.response.headers["Retry-After"] == "7"
