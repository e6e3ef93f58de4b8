"""A long session through the real mesh: each next turn crosses gateway -> parse as its new messages
(``services.common.message_reuse``) and its prompt crosses parse -> router -> worker as the tail after the
previous turn's (``services.common.prompt_reuse``), and every process still sees exactly the prompt a whole
send gives (the worker's prompt count equals ``/tokenize``'s, the prefix is cached)."""

from __future__ import annotations

import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_metrics import _scrape
from tests.support.mesh import RunningMesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

WORDS = ["alpha", "beta", "gamma", "delta", "build", "test", "parser", "module", "failing", "stack", "trace",
         "line", "file", "value"]


def filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def test_a_long_sessions_next_turns_travel_as_tails_and_stay_exact(mesh: RunningMesh) -> None:
    rng = random.Random(3)
    headers = {"x-session-id": "reuse-e2e-session"}
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Read the logs. " + filler(rng, 3000)}]
    async with httpx.AsyncClient(timeout=60) as http:
        before = {name: await _scrape(http, url) for name, url in mesh.metrics.items()}
        bases_before = await _bases(http, mesh.metrics["parse"])
        for turn in range(4):
            body = {"model": "demo", "max_tokens": 4, "messages": messages}
            counted = await http.post(mesh.http + "/tokenize", json=body)
            assert counted.status_code == 200, counted.text
            response = await http.post(mesh.http + "/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            assert usage["prompt_tokens"] == counted.json()["count"]
            if turn:
                assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 600
            messages += [{"role": "assistant", "content": response.json()["choices"][0]["message"]["content"] or "ok"},
                         {"role": "user", "content": "And now this. " + filler(rng, 150)}]
        after = {name: await _scrape(http, url) for name, url in mesh.metrics.items()}
        bases_after = await _bases(http, mesh.metrics["parse"])

    def rebuilt(name: str) -> float:
        key = "harnessmesh_prompt_reuse_tails_total"
        return after[name].get(key, 0.0) - before[name].get(key, 0.0)

    assert rebuilt("router") >= 3  # turns 2-4 reached the router as tails
    assert sum(rebuilt(n) for n in mesh.metrics if n.startswith("worker-")) >= 2  # and the worker, once it held one
    assert bases_after["rebuilt"] - bases_before.get("rebuilt", 0.0) >= 3  # turns 2-4 reached parse as new messages
    assert bases_after.get("refused", 0.0) == bases_before.get("refused", 0.0)


async def _bases(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """``harnessmesh_message_reuse_bases_total`` by outcome."""
    text = (await http.get(url)).text
    return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "harnessmesh_message_reuse_bases_total"}
