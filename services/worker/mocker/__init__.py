"""The simulated "mocker" engine: a paged KV cache, continuous batching and a timing model, no GPU."""

from services.worker.mocker.engine import MockerConfig, MockerEngine

__all__ = ["MockerConfig", "MockerEngine"]
