from __future__ import annotations

import subprocess
import sys

import pytest

from services.common.settings import fields_of, flag_name
from services.launcher.cli import build_parser
from services.launcher.specs import ALL_SERVICES, WORKER, build_settings, child_argv, is_exposed
from services.launcher.up_cmd import namespace_values


def test_up_offers_every_exposed_option_of_every_service() -> None:
    help_text = build_parser().parse_args(["up"])  # parses with defaults
    assert help_text.command == "up"
    up_help = subprocess.run([sys.executable, "-m", "services.launcher", "up", "--help"],
                             capture_output=True, text=True, check=True).stdout
    for spec in ALL_SERVICES:
        for f in fields_of(spec.settings_class()):
            if is_exposed(f):
                assert flag_name(f) in up_help, f"{spec.name}: {flag_name(f)} missing from harnessmesh up"
    for flag in ("--http-port", "--grpc-port", "--workers", "--engine", "--model", "--served-model-name",
                 "--reasoning-parser", "--tool-parser", "--script", "--speedup", "--nats-url"):
        assert flag in up_help


def test_options_are_passed_on_to_the_services_that_have_them() -> None:
    ns = build_parser().parse_args(["up", "--speedup", "7.5", "--workers", "3", "--log-level", "debug"])
    values = namespace_values(ns)
    worker = build_settings(WORKER.settings_class(), values, {"port": 1234, "worker_id": "w"})
    argv = child_argv(WORKER, worker)
    assert argv[:2] == ["-m", "services.worker"]
    assert argv[argv.index("--speedup") + 1] == "7.5"
    assert argv[argv.index("--port") + 1] == "1234"
    assert argv[argv.index("--log-level") + 1] == "debug"


def test_env_twins_work_on_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSMESH_WORKER_SPEEDUP", "42")
    monkeypatch.setenv("HARNESSMESH_UP_WORKERS", "2")
    ns = build_parser().parse_args(["up"])
    assert ns.speedup == 42.0 and ns.workers == 2


def test_every_service_has_help() -> None:
    for spec in ALL_SERVICES:
        done = subprocess.run([sys.executable, "-m", spec.module, "--help"], capture_output=True, text=True,
                              check=False, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--log-level" in done.stdout


def test_options_doc_is_current() -> None:
    from pathlib import Path

    from services.launcher.options_doc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "options.md"
    assert doc.read_text() == render(), "run: python -m services.launcher.options_doc > docs/options.md"


def test_help_never_prints_a_secret_taken_from_the_environment() -> None:
    import os

    env = {**os.environ, "HARNESSMESH_GATEWAY_API_KEY": "sk-do-not-print", "HARNESSMESH_CATALOG_API_KEY": "sk-nor-this"}
    for argv in (["-m", "gateway", "--help"], ["-m", "services.launcher", "catalog", "--help"]):
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert "--api-key" in done.stdout
        assert "sk-do-not-print" not in done.stdout and "sk-nor-this" not in done.stdout
