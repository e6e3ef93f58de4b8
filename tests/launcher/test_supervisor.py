"""The supervisor's restart policy on real child processes (a tiny module that exits with a status)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.launcher import supervisor as sup
from services.launcher.specs import ServiceSpec
from services.launcher.supervisor import Supervisor
from tests.launcher.exiting_child import ExitingSettings

pytestmark = pytest.mark.timeout(60)

CHILD = ServiceSpec("exiting", "tests.launcher.exiting_child", "tests.launcher.exiting_child:ExitingSettings")


class Events:
    """A logger that keeps lifecycle events."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.seen.append((event, kw))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sup, "BACKOFF_FIRST", 0.05)


async def test_on_failure_restarts_a_dead_child_until_a_crash_loop_ends_the_mesh() -> None:
    events = Events()
    supervisor = Supervisor(log=events, restart="on-failure", max_restarts=3, restart_window=60.0)
    await supervisor.spawn("exiting", CHILD, ExitingSettings(seconds=0.1, status=3), "127.0.0.1:1")
    try:
        assert await supervisor.watch(asyncio.Event()) == 1
    finally:
        await supervisor.stop()
    assert events.names().count("mesh.child_restarted") == 3
    assert events.names().count("mesh.child_exited") == 4 and events.names()[-1] == "mesh.child_crash_loop"
    restarts = [kw for name, kw in events.seen if name == "mesh.child_restarted"]
    assert [r["previous_status"] for r in restarts] == [3, 3, 3]
    assert [r["backoff_s"] for r in restarts] == [0.05, 0.1, 0.2]  # doubling


async def test_never_ends_the_mesh_on_the_first_death() -> None:
    events = Events()
    supervisor = Supervisor(log=events, restart="never")
    await supervisor.spawn("exiting", CHILD, ExitingSettings(seconds=0.1, status=3), "127.0.0.1:1")
    try:
        assert await supervisor.watch(asyncio.Event()) == 1
    finally:
        await supervisor.stop()
    assert "mesh.child_restarted" not in events.names()


async def test_a_clean_exit_is_not_restarted_and_stop_wins_over_a_pending_restart() -> None:
    events = Events()
    supervisor = Supervisor(log=events, restart="on-failure")
    await supervisor.spawn("exiting", CHILD, ExitingSettings(seconds=0.1, status=0), "127.0.0.1:1")
    assert await supervisor.watch(asyncio.Event()) == 1
    await supervisor.stop()
    assert "mesh.child_restarted" not in events.names()

    stop = asyncio.Event()
    supervisor = Supervisor(log=Events(), restart="on-failure")
    await supervisor.spawn("exiting", CHILD, ExitingSettings(seconds=0.1, status=9), "127.0.0.1:1")
    sup.BACKOFF_FIRST = 5.0  # the restart would wait 5 s; stop arrives first
    asyncio.get_running_loop().call_later(0.5, stop.set)
    assert await asyncio.wait_for(supervisor.watch(stop), 3) == 0
    await supervisor.stop()


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="restart policy"):
        Supervisor(restart="always")


def probe_offering(ports: list[int]) -> type:
    """A stand-in for ``socket.socket`` whose probes are offered ``ports`` in turn."""
    offered = iter(ports)

    class Probe:
        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    return Probe


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may offer a closed probe's port again (a CI run gave the gateway the router's gRPC port)."""
    monkeypatch.setattr(sup, "_HANDED_OUT", set())
    monkeypatch.setattr(sup.socket, "socket", probe_offering([40001, 40001, 40002, 40001, 40003]))
    assert [sup.free_port() for _ in range(3)] == [40001, 40002, 40003]


def test_free_port_never_hands_out_a_port_given_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test picks the HTTP port with its own probe; the launcher's next probe may be offered it again."""
    monkeypatch.setattr(sup, "_HANDED_OUT", set())
    monkeypatch.setattr(sup.socket, "socket", probe_offering([40001, 40002]))
    sup.reserve_ports(40001, None, 0)
    assert sup.free_port() == 40002
