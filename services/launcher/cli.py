"""The ``harnessmesh`` command: one subcommand per module (``up_cmd``, ``catalog_cmd``, ``replay_cmd``, ...).

Only the module of the command given is imported (``harnessmesh replay`` does not load the mesh's
settings, gRPC or HTTP stacks: ~0.1 s of start-up); ``--help`` without a command loads them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = {"up": "services.launcher.up_cmd", "catalog": "services.launcher.catalog_cmd",
            "replay": "services.launcher.replay_cmd", "health": "services.launcher.health_cmd",
            "breaks": "services.launcher.breaks_cmd"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with command ``only`` alone."""
    parser = argparse.ArgumentParser(prog="harnessmesh", description="harnessmesh: an LLM mesh for agent harnesses")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    given = next((a for a in args if not a.startswith("-")), None)
    parser = build_parser(given if given in COMMANDS else None)
    ns = parser.parse_args(args)
    if ns.command == "catalog":
        from services.launcher import catalog_cmd

        return catalog_cmd.run(ns)
    if ns.command == "replay":
        from services.launcher import replay_cmd

        return replay_cmd.run(ns)
    if ns.command == "health":
        from services.launcher import health_cmd

        return health_cmd.run(ns)
    if ns.command == "breaks":
        from services.launcher import breaks_cmd

        return breaks_cmd.run(ns)
    if ns.command != "up":  # pragma: no cover - argparse enforces the choice
        parser.error(f"unknown command {ns.command}")
    from services.launcher import up_cmd

    try:
        launcher = up_cmd.settings(ns)
    except ValueError as exc:
        parser.error(str(exc))
    return up_cmd.run(launcher, ns)


if __name__ == "__main__":
    sys.exit(main())
