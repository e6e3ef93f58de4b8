from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mesh import RunningMesh, running_mesh
from tests.support.otlp import Collector, running_collector

TOOL_TURN = (
    "<think>\nThe user wants the weather in Paris. I will call get_weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
FINAL_TURN = "<think>\nThe tool says 22 degrees.\n</think>\n\nIt is 22 degrees Celsius in Paris right now."

SCRIPT = [
    {"match": "weather in Paris", "completion": TOOL_TURN},
    {"match": "22 degrees", "completion": FINAL_TURN},
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="session")
def collector() -> Iterator[tuple[str, Collector]]:
    """An OTLP/gRPC collector the mesh's processes export their spans to."""
    with running_collector() as running:
        yield running


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory, collector: tuple[str, Collector]) -> Iterator[RunningMesh]:
    """The real mesh: nats-server, router, two mocker workers, parse, gateway — separate processes."""
    tmp = tmp_path_factory.mktemp("mesh")
    script = tmp / "script.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT))
    args = [
        "--workers", "2", "--speedup", "20", "--script", str(script),
        "--reasoning-parser", "qwen3", "--tool-parser", "hermes",
        "--served-model-name", "demo", "--block-size", "16", "--heartbeat-interval", "0.2",
    ]
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector[0],
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with running_mesh(args, Path(tmp) / "mesh.log", env=otel) as running:
        yield running
