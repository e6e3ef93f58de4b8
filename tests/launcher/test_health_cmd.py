"""``harnessmesh health``: exit 1 with one line saying why whenever a process is not ready.

The healthy side of every check runs in tests/test_compose.py (compose's own healthchecks against a full
mesh); here a real mesh without workers (nats-server, router, parse, gateway) shows each check telling
"up" from "ready", and silent or absent processes show the failures, each within ``--timeout``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.cli import main
from services.launcher.nats_server import NatsServer
from services.launcher.specs import GATEWAY, PARSE, ROUTER, build_settings
from services.launcher.supervisor import Supervisor, deadline_in, free_port

REPO = Path(__file__).resolve().parents[2]


def health(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """``harnessmesh health ARGS`` in its own process, as a container's healthcheck runs it."""
    base = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
    done = subprocess.run([sys.executable, "-m", "services.launcher", "health", *args], capture_output=True,
                          text=True, env={**base, **(env or {})}, cwd=REPO, timeout=30, check=False)
    return done.returncode, done.stdout.splitlines()


@pytest.mark.e2e
@pytest.mark.timeout(120)
async def test_a_mesh_without_workers_is_up_but_not_ready(tmp_path: Path) -> None:
    nats = NatsServer(free_port())
    await nats.start(30)
    supervisor = Supervisor(log_dir=tmp_path)
    supervisor.adopt(nats)
    try:
        wiring = {"host": "127.0.0.1", "nats_url": nats.url, "nats_token": nats.token}
        router_port, parse_port, http_port, grpc_port = (free_port() for _ in range(4))
        router_addr, parse_addr = f"127.0.0.1:{router_port}", f"127.0.0.1:{parse_port}"
        router = await supervisor.spawn("router", ROUTER, build_settings(
            ROUTER.settings_class(), {}, {**wiring, "port": router_port}), router_addr)
        parse = await supervisor.spawn("parse", PARSE, build_settings(
            PARSE.settings_class(), {}, {**wiring, "port": parse_port, "router_address": router_addr}), parse_addr)
        gateway = await supervisor.spawn("gateway", GATEWAY, build_settings(GATEWAY.settings_class(), {}, {
            "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port, "parse_address": parse_addr,
        }), f"127.0.0.1:{grpc_port}")
        await supervisor.wait_healthy([router, parse, gateway], deadline_in(60))

        def checks() -> dict[str, tuple[int, list[str]]]:
            return {
                "router": health("router", "--target", router_addr),
                "router --min-workers 1": health("router", "--target", router_addr, "--min-workers", "1"),
                "parse": health("parse", "--target", parse_addr),
                "gateway": health("gateway", "--url", f"http://127.0.0.1:{http_port}/v1"),
                "worker at the router": health("worker", "--target", router_addr),
                "nats": health("nats", "--url", nats.url, env={"HARNESSMESH_NATS_TOKEN": nats.token}),
                "nats without token": health("nats", "--url", nats.url),
            }

        results = await asyncio.to_thread(checks)
        for name, (_, lines) in results.items():
            assert len(lines) == 1, (name, lines)
        assert results["router"] == (0, [f"router {router_addr}: healthy: serving, 0 routable workers"])
        assert results["router --min-workers 1"][0] == 1
        assert "lists 0 workers (--min-workers 1)" in results["router --min-workers 1"][1][0]
        assert results["parse"] == (
            1, [f"parse {parse_addr}: unhealthy: not ready: no worker is routable (none has a live heartbeat)"])
        code, (line,) = results["gateway"]
        assert code == 1 and "/ready answered 503: " in line and "no worker is routable" in line, line
        code, (line,) = results["worker at the router"]
        assert code == 1 and "Info failed: UNIMPLEMENTED" in line, line
        code, (line,) = results["nats"]
        assert code == 0 and line.startswith(f"nats {nats.url}: healthy: connected, server 2."), line
        code, (line,) = results["nats without token"]
        assert code == 1 and "Authorization Violation" in line, line
    finally:
        await supervisor.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word (a hung process)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


@pytest.mark.parametrize("service", ["gateway", "parse", "router", "worker", "nats"])
def test_a_hung_process_is_unhealthy_within_the_timeout(service: str, silent_port: int) -> None:
    where = {"gateway": ["--url", f"http://127.0.0.1:{silent_port}"], "nats": ["--url", f"nats://127.0.0.1:{silent_port}"]}
    started = time.monotonic()
    code, lines = health(service, *where.get(service, ["--target", f"127.0.0.1:{silent_port}"]), "--timeout", "1")
    assert code == 1 and len(lines) == 1 and ": unhealthy: " in lines[0], lines
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("service", ["gateway", "parse", "router", "worker", "nats"])
def test_an_absent_process_is_unhealthy_at_once(service: str) -> None:
    port = free_port()
    where = {"gateway": ["--url", f"http://127.0.0.1:{port}"], "nats": ["--url", f"nats://127.0.0.1:{port}"]}
    started = time.monotonic()
    code, lines = health(service, *where.get(service, ["--target", f"127.0.0.1:{port}"]))
    assert code == 1 and len(lines) == 1, lines
    assert "refused" in lines[0].lower(), lines
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(("argv", "problem"), [
    (["parse"], "needs --target"),
    (["router", "--url", "http://x"], "needs --target"),
    (["worker", "--target", "a:1", "--url", "http://x"], "takes --target, not --url"),
    (["gateway", "--target", "a:1"], "takes --url, not --target"),
    (["nats", "--timeout", "0"], "--timeout must be > 0"),
])
def test_options_that_cannot_check_the_service_exit_2(argv: list[str], problem: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", *argv]) == 2
    assert problem in capsys.readouterr().out
