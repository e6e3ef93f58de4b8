"""compose.yaml cannot rot: every command, port and env var is checked against the real CLIs."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from services.common.settings import env_name, fields_of, parse_settings
from services.launcher.nats_server import find_nats_server
from services.launcher.specs import ALL_SERVICES, ServiceSpec
from services.launcher.supervisor import free_port, terminate

REPO = Path(__file__).resolve().parents[1]
SPECS = {spec.module: spec for spec in ALL_SERVICES}
OTEL_VARS = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
    return data


def our_services(compose: dict[str, Any]) -> list[tuple[str, ServiceSpec, list[str], dict[str, str]]]:
    out = []
    for name, svc in compose["services"].items():
        command = svc.get("command", [])
        if command[:2] != ["python", "-m"]:
            continue
        out.append((name, SPECS[command[2]], command[3:], {k: str(v) for k, v in svc["environment"].items()}))
    return out


def settings_of(spec: ServiceSpec, argv: list[str], env: dict[str, str]) -> Any:
    return parse_settings(spec.settings_class(), spec.name, argv, environ=env)


def test_expected_services_are_present(compose: dict[str, Any]) -> None:
    names = set(compose["services"])
    assert {"nats", "jaeger", "gateway", "parse", "router"} <= names
    workers = [n for n, _, argv, _ in our_services(compose) if n.startswith("worker")]
    default = [n for n in workers if "profiles" not in compose["services"][n]]
    assert len(default) == 2
    assert "-js" in compose["services"]["nats"]["command"]
    assert compose["services"]["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_every_command_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    for _name, spec, argv, env in our_services(compose):
        settings_of(spec, argv, env)  # argparse exits (SystemExit) on any unknown flag or bad value


def test_env_vars_are_real_env_twins(compose: dict[str, Any]) -> None:
    for name, spec, _argv, env in our_services(compose):
        known = {env_name(spec.name, f) for f in fields_of(spec.settings_class())}
        for key in env:
            assert key in known or key in OTEL_VARS, f"{name}: {key} is not an option of {spec.module}"


def test_addresses_point_at_real_ports(compose: dict[str, Any]) -> None:
    by_name = {name: settings_of(spec, argv, env) for name, spec, argv, env in our_services(compose)}
    router, parse, gateway = by_name["router"], by_name["parse"], by_name["gateway"]
    assert parse.router_address == f"router:{router.port}"
    assert gateway.parse_address == f"parse:{parse.port}"
    for name, settings in by_name.items():
        if name.startswith("worker"):
            assert settings.advertise_host == name
            assert settings.worker_id == name
            assert settings.nats_url == "nats://nats:4222"
            assert settings.host == "0.0.0.0"
    assert router.nats_url == "nats://nats:4222"
    published = {p.split(":")[1] for p in compose["services"]["gateway"]["ports"]}
    assert published == {str(gateway.http_port), str(gateway.grpc_port)}


def test_env_twins_take_effect(compose: dict[str, Any]) -> None:
    for _name, spec, argv, env in our_services(compose):
        settings = settings_of(spec, argv, env)
        for f in fields_of(spec.settings_class()):
            key = env_name(spec.name, f)
            if key in env and f"--{f.name.replace('_', '-')}" not in argv:
                raw = env[key]
                value = getattr(settings, f.name)
                assert str(value).lower() == raw.lower() or float(value) == float(raw), (key, value)


def test_settings_dataclasses_are_frozen() -> None:
    for spec in ALL_SERVICES:
        params = spec.settings_class().__dataclass_params__  # type: ignore[attr-defined]
        assert dataclasses.is_dataclass(spec.settings_class()) and params.frozen


def test_gpu_profile_runs_trtllm_workers_on_reserved_gpus(compose: dict[str, Any]) -> None:
    gpu = [(n, spec, argv, env) for n, spec, argv, env in our_services(compose)
           if compose["services"][n].get("profiles") == ["gpu"]]
    assert len(gpu) >= 2
    devices: list[str] = []
    for name, spec, argv, env in gpu:
        settings = settings_of(spec, argv, env)
        assert settings.engine == "trtllm" and settings.model == "/models/model"
        svc = compose["services"][name]
        assert svc["build"]["dockerfile"] == "Dockerfile.trtllm"
        (reservation,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert reservation["driver"] == "nvidia" and reservation["capabilities"] == ["gpu"]
        devices += reservation["device_ids"]
    assert len(devices) == len(set(devices)), "two workers reserve the same GPU"
    assert (REPO / "Dockerfile.trtllm").read_text().count("nvcr.io/nvidia/tensorrt-llm/release") == 1


def test_nats_requires_the_token_and_every_nats_client_gets_it(compose: dict[str, Any]) -> None:
    nats_service = compose["services"]["nats"]
    variable = "${HARNESSMESH_NATS_TOKEN:?"
    assert nats_service["environment"]["HARNESSMESH_NATS_TOKEN"].startswith(variable)
    assert "./deploy/nats/nats.conf:/etc/nats/nats.conf:ro" in nats_service["volumes"]
    for name, _spec, argv, env in our_services(compose):
        if "--nats-url" in argv:
            assert env.get("HARNESSMESH_NATS_TOKEN", "").startswith(variable), name
        assert not any("TOKEN" in arg.upper() for arg in argv), name  # secrets never on a command line


async def test_the_compose_nats_config_refuses_clients_without_the_token(tmp_path: Path) -> None:
    """The real nats-server with deploy/nats/nats.conf, the token in its environment as compose gives it."""
    port = free_port()
    token = "compose-test-token"
    server = await asyncio.create_subprocess_exec(
        find_nats_server(), "-c", str(REPO / "deploy" / "nats" / "nats.conf"), "-js", "-sd", str(tmp_path),
        "-a", "127.0.0.1", "-p", str(port), env={**os.environ, "HARNESSMESH_NATS_TOKEN": token},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                nc = await nats.connect(url, token=token, connect_timeout=1, allow_reconnect=False)
                break
            except Exception:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("nats-server did not start with deploy/nats/nats.conf")
        assert nc.is_connected
        await nc.close()
        for wrong in (None, "not-the-token"):
            with pytest.raises(Exception):  # noqa: B017 - nats-py raises several kinds for a refused connect
                await nats.connect(url, token=wrong, connect_timeout=1, allow_reconnect=False,
                                   max_reconnect_attempts=0)
    finally:
        await terminate([server], 5.0)
