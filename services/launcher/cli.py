"""The ``harnessmesh`` command: one subcommand per module (``up_cmd``, ``catalog_cmd``, ``replay_cmd``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.launcher import catalog_cmd, replay_cmd, up_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessmesh", description="harnessmesh: an LLM mesh for agent harnesses")
    commands = parser.add_subparsers(dest="command", required=True)
    up_cmd.add_parser(commands)
    catalog_cmd.add_parser(commands)
    replay_cmd.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "catalog":
        return catalog_cmd.run(ns)
    if ns.command == "replay":
        return replay_cmd.run(ns)
    if ns.command != "up":  # pragma: no cover - argparse enforces the choice
        parser.error(f"unknown command {ns.command}")
    try:
        launcher = up_cmd.settings(ns)
    except ValueError as exc:
        parser.error(str(exc))
    return up_cmd.run(launcher, ns)


if __name__ == "__main__":
    sys.exit(main())
