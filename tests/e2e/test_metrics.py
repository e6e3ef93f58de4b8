"""Every process serves Prometheus /metrics that parse with prometheus_client and move with traffic."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.mesh import RunningMesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# One sample per process that must grow when a request flows through it.
MOVING = {
    "gateway": ("harnessmesh_requests_total", "harnessmesh_ttft_seconds_count"),
    "parse": ("harnessmesh_parse_requests_total", "harnessmesh_parse_render_seconds_count"),
    "router": ("harnessmesh_router_decisions_total", "harnessmesh_router_queue_wait_seconds_count"),
    "worker": ("harnessmesh_worker_requests_total", "harnessmesh_worker_prompt_tokens_total"),
}


async def _scrape(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    response = await http.get(url)
    assert response.status_code == 200
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _kind(name: str) -> str:
    return "worker" if name.startswith("worker-") else name


async def test_metrics_endpoints_parse_and_move(mesh: RunningMesh) -> None:
    assert {"gateway", "parse", "router"} <= set(mesh.metrics) and any(n.startswith("worker-") for n in mesh.metrics)
    async with httpx.AsyncClient(timeout=30) as http:
        before = {name: await _scrape(http, url) for name, url in mesh.metrics.items()}
        for i in range(4):  # two workers: enough requests that both see traffic is not guaranteed, so sum them
            body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": f"count me {i}"}]}
            response = await http.post(mesh.http + "/v1/chat/completions", json=body)
            assert response.status_code == 200
        after = {name: await _scrape(http, url) for name, url in mesh.metrics.items()}
    grown: dict[str, set[str]] = {}
    for name in mesh.metrics:
        for sample in MOVING[_kind(name)]:
            if after[name].get(sample, 0.0) > before[name].get(sample, 0.0):
                grown.setdefault(_kind(name), set()).add(sample)
    for kind, samples in MOVING.items():
        assert grown.get(kind) == set(samples), (kind, grown.get(kind))
    gateway = after["gateway"]
    assert gateway["harnessmesh_cached_token_ratio_count"] >= 4 and gateway["harnessmesh_e2e_seconds_count"] >= 4
    workers = [after[n] for n in mesh.metrics if n.startswith("worker-")]
    assert all(w["harnessmesh_worker_kv_total_blocks"] > 0 for w in workers)
    assert "harnessmesh_router_queue_depth" in after["router"]
    assert "harnessmesh_router_worker_active_blocks" in after["router"]
