"""Malformed input gets a 4xx in its API's shape, never a 5xx, and the connection stays usable: deep
nesting, lone surrogates, NaN / Infinity, integers out of range, bodies of the wrong type (issue 14's
fuzz findings, each endpoint)."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.server import Gateway

PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/tokenize"]
BASE = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def with_field(name: str, raw_value: str) -> bytes:
    return json.dumps({**BASE, name: "@"}).replace('"@"', raw_value).encode()


BODIES = {
    "deep arrays": b"[" * 100_000 + b"]" * 100_000,
    "deep objects": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "lone surrogate": b'{"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}',
    "lone low surrogate": b'{"model": "demo", "input": "\\udfff", "messages": [{"role": "user", "content": "x"}]}',
    "NaN": with_field("temperature", "NaN"),
    "Infinity": with_field("temperature", "Infinity"),
    "float overflow": with_field("max_tokens", "1e400"),
    "max_tokens 2^31": with_field("max_tokens", str(2**31)),
    "max_tokens 10^30": with_field("max_tokens", str(10**30)),
    "negative max_tokens": with_field("max_tokens", "-5"),
    "top_k 2^40": with_field("top_k", str(2**40)),
    "seed 2^70": with_field("seed", str(2**70)),
    "max_completion_tokens 2^40": with_field("max_completion_tokens", str(2**40)),
    "max_output_tokens 2^63": with_field("max_output_tokens", str(2**63)),
    "null": b"null",
    "a number": b"12",
    "messages not a list": b'{"model": "demo", "messages": 5}',
    "not JSON": b"{oops",
}


@pytest.mark.parametrize("path", PATHS)
async def test_no_malformed_body_gets_a_5xx_and_the_connection_stays_usable(gateway: Gateway, path: str) -> None:
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(timeout=20) as http:
        for name, raw in BODIES.items():
            response = await http.post(gateway.http_url + path, content=raw, headers=headers)
            assert response.status_code < 500, (name, response.status_code, response.text[:300])
            if response.status_code >= 400:
                payload = response.json()
                assert "error" in payload, (name, payload)
                if path.startswith("/v1/messages"):
                    assert payload["type"] == "error" and payload["error"]["type"], (name, payload)
                else:
                    assert payload["error"]["message"], (name, payload)
        ok = await http.post(gateway.http_url + "/v1/chat/completions", json=BASE)
        assert ok.status_code == 200  # the same client and connections, after all of the above
