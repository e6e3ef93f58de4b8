"""Compaction on the Responses API through the real mesh (two mocker workers): a Codex-shaped session compacts
with ``compaction_trigger`` and with ``POST /v1/responses/compact``, each compaction request served mostly
from the engine's prefix cache (it is the turn before plus one instruction), and the compaction item it
returns carries the session on (a changed one is refused)."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from tests.support.mesh import RunningMesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

MIN_CACHED_SHARE = 0.9
WORDS = ["alpha", "beta", "gamma", "build", "test", "parser", "module", "failing", "stack", "trace", "file"]
TOOLS: Any = [{"type": "function", "name": "exec_command", "description": "Run a shell command. " * 40,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}]


def filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def cached_share(usage: dict[str, Any]) -> float:
    share: float = usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"]
    return share


async def test_both_compaction_forms_reuse_the_sessions_cached_prefix(mesh: RunningMesh) -> None:
    rng = random.Random(33)
    base = {"model": "demo", "tools": TOOLS, "store": False, "max_output_tokens": 16,
            "prompt_cache_key": "compaction-e2e-session"}
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent. " + filler(rng, 1500)},
        {"type": "message", "role": "user", "content": "Fix the failing test. " + filler(rng, 300)},
    ]
    async with httpx.AsyncClient(base_url=mesh.http, timeout=60) as http:
        for turn in range(2):  # two turns, the conversation as Codex replays it; then it compacts
            if turn:
                items.append({"type": "message", "role": "user", "content": "Go on. " + filler(rng, 100)})
            reply = await http.post("/v1/responses", json={**base, "input": items})
            assert reply.status_code == 200, reply.text
            items += [item for item in reply.json()["output"] if item["type"] != "reasoning"]

        # Codex's responses_compaction_v2, streamed: exactly one output item, the compaction.
        reply = await http.post("/v1/responses", json={**base, "stream": True,
                                                       "input": [*items, {"type": "compaction_trigger"}]})
        assert reply.status_code == 200, reply.text
        events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [d["type"] for d in done] == ["compaction"], events
        completed = events[-1]["response"]
        assert events[-1]["type"] == "response.completed" and completed["output"] == done
        trigger_share = cached_share(completed["usage"])
        assert trigger_share >= MIN_CACHED_SHARE, completed["usage"]

        # The v1 endpoint, from the same code: the same conversation, the same reuse.
        reply = await http.post("/v1/responses/compact", json={**base, "input": items})
        assert reply.status_code == 200, reply.text
        compacted = reply.json()
        assert compacted["object"] == "response.compaction"
        assert [i.get("role") for i in compacted["output"][:-1]] == ["user"] * 2
        assert compacted["output"][-1]["type"] == "compaction"
        v1_share = cached_share(compacted["usage"])
        assert v1_share >= MIN_CACHED_SHARE, compacted["usage"]
        print(f"compaction_trigger: {trigger_share:.1%} cached; /v1/responses/compact: {v1_share:.1%} cached")

        # The next window: the kept user messages, the compaction item, a new prompt.
        item = done[0]
        window = [items[0], *compacted["output"][:-1], item, {"role": "user", "content": "Now run the linter."}]
        reply = await http.post("/v1/responses", json={**base, "input": window})
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] in ("completed", "incomplete")  # max_output_tokens may cut it
        changed = {**item, "encrypted_content": item["encrypted_content"][:-3] + "abc"}
        reply = await http.post("/v1/responses", json={**base, "input": [*window[:3], changed, window[-1]]})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "input[3].encrypted_content"
