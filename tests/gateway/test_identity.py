"""Identity precedence, per API: nvext > generic headers > harness headers > body hints > fresh id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.anthropic.convert import chat_request as anthropic_request
from gateway.apis.anthropic.models import MessagesRequest
from gateway.apis.openai_chat.convert import chat_request as openai_request
from gateway.apis.openai_chat.models import ChatCompletionRequest
from gateway.apis.responses.convert import chat_request as responses_request
from gateway.apis.responses.models import ResponsesRequest
from gateway.identity import harness_name, resolve_identity, session_from_user_id
from services.api import common_pb2

NVEXT = {"agent_context": {"session_type_id": "coding_agent", "session_id": "nv-s", "trajectory_id": "nv-t",
                           "parent_trajectory_id": "nv-pt"}}
GENERIC = {"x-session-id": "gen-s", "x-trajectory-id": "gen-t", "x-parent-session-id": "gen-ps"}
CLAUDE = {"x-claude-code-session-id": "cc-s", "x-claude-code-agent-id": "cc-agent",
          "x-claude-code-parent-agent-id": "cc-parent", "user-agent": "claude-cli/2.1.330 (external, sdk-cli)"}
CODEX = {"thread-id": "cx-t", "x-codex-parent-thread-id": "cx-parent", "user-agent": "codex_exec/0.169.0 (Debian)"}
USER_ID = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "meta-s"})


def _ids(identity: common_pb2.Identity) -> tuple[str, str]:
    return identity.session_id, identity.trajectory_id


def openai(headers: dict[str, str], nvext: dict[str, Any] | None = None) -> common_pb2.Identity:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if nvext:
        body["nvext"] = nvext
    return openai_request(ChatCompletionRequest.model_validate(body), headers, model="m", request_id="r").identity


def anthropic(headers: dict[str, str], user_id: str | None = None) -> common_pb2.Identity:
    body: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    if user_id:
        body["metadata"] = {"user_id": user_id}
    return anthropic_request(MessagesRequest.model_validate(body), headers, model="m", request_id="r",
                             strip=True).identity


def responses(headers: dict[str, str], nvext: dict[str, Any] | None = None, key: str = "") -> common_pb2.Identity:
    body: dict[str, Any] = {"model": "m", "input": "hi"}
    if nvext:
        body["nvext"] = nvext
    if key:
        body["prompt_cache_key"] = key
    converted = responses_request(ResponsesRequest.model_validate(body), headers, [], model="m", request_id="r")
    return converted.chat.identity


def test_openai_precedence() -> None:
    full = openai({**GENERIC, **CLAUDE}, NVEXT)
    assert _ids(full) == ("nv-s", "nv-t")
    assert (full.session_type_id, full.parent_trajectory_id, full.parent_session_id) == ("coding_agent", "nv-pt",
                                                                                        "gen-ps")
    assert _ids(openai({**GENERIC, **CLAUDE})) == ("gen-s", "gen-t")
    assert _ids(openai(CLAUDE)) == ("cc-s", "cc-agent")
    assert openai(CLAUDE).parent_trajectory_id == "cc-parent" and openai(CLAUDE).harness == "claude-code"
    partial = openai({**CLAUDE, "x-trajectory-id": "gen-t"}, {"agent_context": {"session_id": "nv-s"}})
    assert _ids(partial) == ("nv-s", "gen-t")  # field by field: each from its first source


def test_anthropic_precedence() -> None:
    assert _ids(anthropic({**GENERIC, **CLAUDE}, USER_ID)) == ("gen-s", "gen-t")
    assert _ids(anthropic(CLAUDE, USER_ID)) == ("cc-s", "cc-agent")
    main_agent = {"x-claude-code-session-id": "cc-s"}
    assert _ids(anthropic(main_agent, USER_ID)) == ("cc-s", "cc-s")  # the main agent: trajectory = session
    assert anthropic(main_agent, USER_ID).parent_trajectory_id == ""
    # What Claude Code 2.1.330 sends for a sub-agent: the parent's session, its own agent id, no parent header.
    sub_agent = anthropic({**main_agent, "x-claude-code-agent-id": "a1ef6cc7e38183338"}, USER_ID)
    assert _ids(sub_agent) == ("cc-s", "a1ef6cc7e38183338") and sub_agent.parent_trajectory_id == "cc-s"
    assert _ids(anthropic({}, USER_ID)) == ("meta-s", "meta-s")
    assert _ids(anthropic({}, "user_abc_account_x_session_123")) == ("123", "123")


def test_responses_precedence() -> None:
    assert _ids(responses({**GENERIC, **CODEX}, NVEXT, key="K")) == ("nv-s", "nv-t")
    assert _ids(responses({**GENERIC, **CODEX}, key="K")) == ("gen-s", "gen-t")
    sub = responses(CODEX, key="K")
    assert _ids(sub) == ("cx-parent", "cx-t") and sub.parent_trajectory_id == "cx-parent"
    assert sub.harness == "codex"
    assert _ids(responses({"thread-id": "T1"}, key="K")) == ("T1", "T1")
    assert _ids(responses({}, key="K")) == ("K", "K")


def test_grpc_edge_precedence() -> None:
    own = common_pb2.Identity(session_id="pb-s", harness="my-agent")
    resolved = resolve_identity({**GENERIC, "user-agent": "grpc-python/1.85"}, own)
    assert _ids(resolved) == ("pb-s", "gen-t") and resolved.harness == "my-agent"
    from_metadata = resolve_identity({**CODEX}, common_pb2.Identity())
    assert _ids(from_metadata) == ("cx-parent", "cx-t") and from_metadata.harness == "codex"


@pytest.mark.parametrize("api", [openai, anthropic, responses])
def test_no_id_gets_a_fresh_session_per_request(api: Any) -> None:
    first, second = api({}), api({})
    assert first.session_id.startswith("sess-") and first.session_id != second.session_id
    assert first.trajectory_id == first.session_id and first.anonymous
    assert not api({"x-session-id": "named"}).anonymous


def test_user_id_formats_and_harness_names() -> None:
    assert session_from_user_id(USER_ID) == "meta-s"
    assert session_from_user_id("plain-user") == "" and session_from_user_id(None) == ""
    assert harness_name("OpenAI/Python 3.54.0") == "openai-python"
    assert harness_name("codex_exec/0.169.0 (Debian 12.0.0; x86_64)") == "codex"
    assert harness_name("curl/8.5") == "curl" and harness_name("") == ""


def test_starlette_headers_read_as_their_first_values() -> None:
    """The server's own header type (raw bytes, a header sent twice) resolves as the plain mapping does."""
    from starlette.datastructures import Headers

    raw = [(b"x-session-id", b"first-s"), (b"X-Trajectory-Id", b"t-1"), (b"x-session-id", b"second-s"),
           (b"user-agent", CODEX["user-agent"].encode())]
    resolved = resolve_identity(Headers(raw=[(k.lower(), v) for k, v in raw]))
    assert _ids(resolved) == ("first-s", "t-1")
    assert resolved.harness == harness_name(CODEX["user-agent"])
