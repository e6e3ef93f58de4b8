"""One request is one trace across all four processes, exported over real OTLP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.mesh import RunningMesh
from tests.support.otlp import Collector

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SERVICES = {"harnessmesh-gateway", "harnessmesh-parse", "harnessmesh-router", "harnessmesh-worker"}


async def test_one_request_is_one_trace_across_every_process(
    mesh: RunningMesh, collector: tuple[str, Collector]
) -> None:
    body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "trace me please"}]}
    headers = {"x-session-id": "sess-trace-1", "x-trajectory-id": "traj-1"}
    async with httpx.AsyncClient(base_url=mesh.http, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200
    trace_id = ""
    services: set[str] = set()
    for _ in range(100):
        spans = collector[1].snapshot()
        roots = [s for s in spans if s.attributes.get("session.id") == "sess-trace-1" and s.service.endswith("gateway")]
        if roots:
            trace_id = roots[0].trace_id
            services = {s.service for s in spans if s.trace_id == trace_id}
            if services >= SERVICES:
                break
        await asyncio.sleep(0.1)
    assert trace_id, "the gateway exported no span carrying the session id"
    assert services >= SERVICES, services
