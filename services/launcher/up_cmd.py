"""``harnessmesh up``: start the whole mesh locally (no Docker).

``harnessmesh up`` starts nats-server (unless ``--nats-url`` is given), the router, N workers, the
parse service and the gateway as separate processes; waits until each is healthy; prints a banner
(endpoints, metrics and trace links, commands to try: :mod:`services.launcher.banner`) and one JSON
``mesh.ready`` line; and stops everything on Ctrl-C / SIGTERM. It exits
non-zero if any child dies. Every option of every service is also an option here (same flag, same
env var) and is passed on to the services that have it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from typing import Any

import structlog

from services.common.logging import configure_logging
from services.common.model_dir import served_name
from services.common.settings import add_arguments, settings_from_namespace
from services.launcher.banner import banner
from services.launcher.mesh import Mesh, ready_line
from services.launcher.settings import UpSettings
from services.launcher.specs import ALL_SERVICES, is_exposed


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``up`` with its own options and every exposed option of every service."""
    up = commands.add_parser("up", help="start the whole mesh locally (no Docker)", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    seen: set[str] = set()
    add_arguments(up, UpSettings, "up", os.environ, seen=seen)
    for spec in ALL_SERVICES:
        add_arguments(up, spec.settings_class(), spec.name, os.environ, include=is_exposed, seen=seen)


def settings(ns: argparse.Namespace) -> UpSettings:
    """``up``'s own settings (ValueError when invalid); the services' options stay in ``ns``."""
    return settings_from_namespace(UpSettings, ns)


def namespace_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed options by name, repeatable options without a flag given their (env) default."""
    values = {k: v for k, v in vars(ns).items() if not k.startswith("_default_")}
    for key, value in list(values.items()):
        if value is None and hasattr(ns, f"_default_{key}"):
            values[key] = getattr(ns, f"_default_{key}")
    return values


def run(launcher: UpSettings, ns: argparse.Namespace) -> int:
    """Run the mesh until Ctrl-C / SIGTERM (0) or a child's death (1)."""
    configure_logging("launcher", launcher.log_level, launcher.log_format)
    values = namespace_values(ns)
    try:
        import uvloop

        return uvloop.run(run_up(launcher, values))
    except KeyboardInterrupt:
        return 130


async def run_up(launcher: UpSettings, values: dict[str, Any]) -> int:
    log = structlog.get_logger()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    mesh = Mesh(launcher, values)
    try:
        start = asyncio.create_task(mesh.start())
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([start, stopper], return_when=asyncio.FIRST_COMPLETED)
        if start not in done:
            start.cancel()
            return 0
        stopper.cancel()
        endpoints = start.result()
        model = served_name(values.get("model") or "", str(values.get("served_model_name") or ""))
        print(banner(endpoints, model, launcher.workers, os.environ), flush=True)
        print(ready_line(endpoints), flush=True)
        return await mesh.watch(stop)
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        log.error("mesh.start_failed", error=str(exc))
        return 1
    finally:
        await mesh.stop()
