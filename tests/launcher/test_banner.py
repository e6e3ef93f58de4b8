"""``harnessmesh up``'s ready banner: endpoints, metrics and trace links, and commands that run as printed."""

from __future__ import annotations

import json
import shlex

from services.common.model_dir import DEMO_MODEL_DIR, served_name
from services.launcher.banner import banner
from services.launcher.mesh import Endpoints

ENDPOINTS = Endpoints("http://127.0.0.1:8000", "127.0.0.1:8001", "nats://127.0.0.1:4222", ["127.0.0.1:9000"],
                      metrics={"gateway": "http://127.0.0.1:8000/metrics", "router": "http://127.0.0.1:9101/metrics"})


def test_the_banner_names_every_endpoint_and_metrics_link() -> None:
    text = banner(ENDPOINTS, "demo", 2, {})
    assert text.startswith("harnessmesh is up: model 'demo' on 2 workers")
    for needle in ("http://127.0.0.1:8000/v1", "127.0.0.1:8001", "nats://127.0.0.1:4222", "127.0.0.1:9000",
                   "gateway    http://127.0.0.1:8000/metrics", "router     http://127.0.0.1:9101/metrics"):
        assert needle in text, needle


def test_the_traces_line_follows_the_otel_variables() -> None:
    def traces(env: dict[str, str]) -> str:
        return next(line for line in banner(ENDPOINTS, "demo", 1, env).splitlines() if "traces:" in line)

    assert "not exported" in traces({}) and "docs/tracing.md" in traces({})
    assert "OTLP to http://collector:4317" in traces({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert "OTLP to http://c:4318/v1/traces" in traces({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert "not exported" in traces({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"})


def test_the_next_commands_are_a_greeting_curl_and_the_claude_code_catalog() -> None:
    lines = banner(ENDPOINTS, "my-model", 1, {}).splitlines()
    curl = shlex.split(next(line for line in lines if line.strip().startswith("curl ")))
    assert curl[:3] == ["curl", "-s", "http://127.0.0.1:8000/v1/chat/completions"]
    body = json.loads(curl[curl.index("-d") + 1])
    assert body == {"model": "my-model", "messages": [{"role": "user", "content": "hi"}]}
    catalog = shlex.split(next(line for line in lines if "harnessmesh catalog" in line), comments=True)
    assert catalog == ["harnessmesh", "catalog", "claude-code", "--url", "http://127.0.0.1:8000"]


def test_the_banner_names_the_model_as_the_parse_service_serves_it() -> None:
    assert served_name("") == "demo"  # the demo model's harnessmesh.json
    assert served_name("", "mine") == "mine"
    assert served_name(DEMO_MODEL_DIR.parent) == "common"  # a directory without harnessmesh.json: its name
