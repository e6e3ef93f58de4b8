"""Gateway settings: flags, env twins, validation, and masked API keys in the settings log."""

from __future__ import annotations

import pytest

from gateway.settings import GatewaySettings
from services.common.settings import as_log_dict, parse_settings


def test_flags_and_env() -> None:
    settings = parse_settings(
        GatewaySettings, "gateway", ["--api-key", "a", "--api-key", "b", "--http-port", "0"],
        environ={"HARNESSMESH_SERVED_MODEL_NAME": "m", "HARNESSMESH_GATEWAY_REQUEST_TIMEOUT": "5"},
    )
    assert settings.api_key == ["a", "b"] and settings.http_port == 0
    assert settings.served_model_name == "m" and settings.request_timeout == 5.0
    assert as_log_dict(settings)["api_key"] == "***"
    assert as_log_dict(GatewaySettings())["api_key"] == []


def test_validation() -> None:
    with pytest.raises(ValueError, match="request_timeout"):
        GatewaySettings(request_timeout=0).validate()
    with pytest.raises(ValueError, match="http_port"):
        GatewaySettings(http_port=70000).validate()
