"""A client closes its session (Dynamo's ``X-Dynamo-Session-Final`` header, ``nvext.session_control.action``
``"close"``, ``nvext.agent_context.session_final``): the canonical request's ``hints.session_final`` is set, in
every API (the parse service then asks the worker to evict the request's blocks first; docs/agent-kv.md)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.anthropic.convert import chat_request as anthropic_request
from gateway.apis.anthropic.models import MessagesRequest
from gateway.apis.openai_chat.convert import chat_request as openai_request
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.apis.responses.convert import chat_request as responses_request
from gateway.apis.responses.models import ResponsesRequest

USER = [{"role": "user", "content": "hi"}]


def openai(nvext: dict[str, Any] | None, headers: dict[str, str]) -> bool:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **({"nvext": nvext} if nvext else {})})
    return openai_request(body, headers, model="m", request_id="r").hints.session_final


def responses(nvext: dict[str, Any] | None, headers: dict[str, str]) -> bool:
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", **({"nvext": nvext} if nvext else {})})
    return responses_request(body, headers, [], model="m", request_id="r").chat.hints.session_final


@pytest.mark.parametrize("convert", [openai, responses])
def test_the_body_or_the_header_closes_the_session(convert: Any) -> None:
    assert not convert(None, {})
    assert not convert({"session_control": {"session_id": "s", "action": "open"}}, {})
    assert convert({"session_control": {"session_id": "s", "action": "close"}}, {})
    assert convert({"agent_context": {"session_id": "s", "session_final": True}}, {})
    assert not convert({"agent_context": {"session_id": "s", "session_final": False}}, {})
    assert convert(None, {"x-dynamo-session-final": "true"})
    assert not convert(None, {"x-dynamo-session-final": "false"})


def test_the_anthropic_api_takes_the_header() -> None:
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "messages": USER})
    assert anthropic_request(body, {"x-dynamo-session-final": "1"}, model="m", request_id="r",
                             strip=True).hints.session_final
    assert not anthropic_request(body, {}, model="m", request_id="r", strip=True).hints.session_final
