"""``harnessmesh up --max-model-len`` is one option for the whole mesh: the parse service fits prompts to
it and the workers accept them (the demo model's config says 32,768)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def test_a_prompt_past_the_config_context_is_served_under_a_larger_max_model_len(tmp_path: Path) -> None:
    args = ["--workers", "1", "--served-model-name", "demo", "--max-model-len", "65536"]
    body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 12_000}]}
    with running_mesh(args, tmp_path / "mesh.log") as mesh:
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(mesh.http + "/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text[:500]
            assert response.json()["usage"]["prompt_tokens"] > 32_768
            too_long = await http.post(mesh.http + "/v1/chat/completions",
                                       json={**body, "messages": [{"role": "user", "content": "word " * 25_000}]})
            assert too_long.status_code == 400 and "65536" in too_long.text
