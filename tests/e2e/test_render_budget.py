"""``--render-budget-ms`` and the request shape limits end to end: a conversation whose chat-template render
outlasts the budget, or with more tools than ``--max-tools``, gets a 400 in its API's shape naming the budget
or the field, quickly, and the same connection serves the next request."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_a_render_over_budget_is_400_and_the_connection_stays_usable(tmp_path: Path) -> None:
    args = ["--workers", "1", "--speedup", "1000", "--render-budget-ms", "5", "--max-tools", "2", "--max-messages", "0",
            "--served-model-name", "demo", "--log-level", "warning"]
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(40_000)]
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(base_url=mesh.http, timeout=60) as http:
            started = time.monotonic()
            big = await http.post("/v1/chat/completions", json={"model": "demo", "max_tokens": 4, "messages": many})
            assert big.status_code == 400, big.text
            error = big.json()["error"]
            assert "render budget of 5 ms" in error["message"] and error["param"] == "messages"
            assert time.monotonic() - started < 10
            anthropic = await http.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                        json={"model": "demo", "max_tokens": 4, "messages": many})
            assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"
            tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            tools = await http.post("/v1/chat/completions", json={
                "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [tool] * 3})
            assert tools.status_code == 400 and tools.json()["error"]["param"] == "tools", tools.text
            assert "--max-tools" in tools.json()["error"]["message"]
            ok = await http.post("/v1/chat/completions", json={
                "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
            assert ok.status_code == 200, ok.text
