"""Anthropic cache_control breakpoints become hints.cache_ttl_s (a soft KV lease on the worker)."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.apis.anthropic.cache_control import cache_ttl_s

CAPTURE = Path(__file__).resolve().parents[3] / "fixtures" / "captures" / "claude-code_2.1.330_tool-loop_requests.json"


def test_the_longest_marked_ttl_counts() -> None:
    body = {
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert cache_ttl_s(body) == 3600.0
    del body["tools"]
    assert cache_ttl_s(body) == 300.0


def test_nothing_marked_or_not_a_body_is_zero() -> None:
    assert cache_ttl_s({"messages": [{"role": "user", "content": "plain text"}]}) == 0.0
    assert cache_ttl_s({"system": "a string", "messages": []}) == 0.0
    assert cache_ttl_s(["not", "a", "body"]) == 0.0


def test_claude_codes_own_requests_mark_five_minutes() -> None:
    for request in json.loads(CAPTURE.read_text())["requests"]:
        body = request["body"] if isinstance(request["body"], dict) else json.loads(request["body"])
        assert cache_ttl_s(body) == 300.0
