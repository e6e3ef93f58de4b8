"""The simulated "mocker" engine: the shared engine core (``services/kvcore``) stepped by a timing model."""

from services.worker.mocker.engine import MockerConfig, MockerEngine

__all__ = ["MockerConfig", "MockerEngine"]
