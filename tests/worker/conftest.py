from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.common.model_dir import ModelDir, load_model_dir
from services.kvcore.timing import TimingModel
from services.worker.mocker import MockerConfig, MockerEngine
from services.worker.mocker.script import Script

TOOL_CALL = (
    '<think>plan</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
SCRIPT = Script.parse(
    '{"match": "weather", "completion": ' + __import__("json").dumps(TOOL_CALL) + "}\n"
    '{"match": "say hi", "completion": "hi there"}\n'
)


@pytest.fixture(scope="session")
def model() -> ModelDir:
    return load_model_dir("")


@pytest.fixture
async def make_engine(model: ModelDir) -> AsyncIterator[Callable[..., Any]]:
    engines: list[MockerEngine] = []

    async def make(script: Script | None = SCRIPT, speedup: float = 1000.0, **kw: Any) -> MockerEngine:
        engine = MockerEngine(MockerConfig(timing=TimingModel(speedup=speedup), **kw), model, script)
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()
