"""Every service selects grpc's poller I/O before grpc loads (``services/common/grpc_io.py``), grpc knows
the switch it uses, and an operator's ``GRPC_EXPERIMENTS`` wins."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.grpc_io import POLLER_IO, choose_grpc_io

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ["gateway/__main__.py", "services/parse/__main__.py", "services/router/__main__.py",
                "services/worker/__main__.py"]


def test_the_poller_is_chosen_unless_the_operator_chose() -> None:
    environ: dict[str, str] = {}
    assert choose_grpc_io(environ) == POLLER_IO and environ == {"GRPC_EXPERIMENTS": POLLER_IO}
    for operator in ("", "-event_engine_client"):
        environ = {"GRPC_EXPERIMENTS": operator}
        assert choose_grpc_io(environ) == operator and environ == {"GRPC_EXPERIMENTS": operator}


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_each_entry_point_chooses_before_anything_imports_grpc(path: str) -> None:
    """At module level only the chooser is imported; the main block calls it before its other imports."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(node) for node in imports] == ["from services.common.grpc_io import choose_grpc_io"]
    (main,) = [node for node in tree.body if isinstance(node, ast.If)]
    assert ast.unparse(main.test) == "__name__ == '__main__'"
    assert ast.unparse(main.body[0]) == "choose_grpc_io()"


def test_the_chooser_loads_no_grpc() -> None:
    code = "import sys, services.common.grpc_io; print(sorted(m for m in sys.modules if m.startswith('grpc')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


SERVE_ONE_CALL = """
import asyncio, grpc

async def main():
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await channel.unary_unary("/t.T/Echo")(b"ping", timeout=10) == b"ping"
    await server.stop(None)

asyncio.run(main())
"""


def test_this_grpcio_knows_the_experiments_named() -> None:
    """A grpcio that dropped the switch logs ``Unknown experiment`` at start: then it is time to remove it."""
    env = {**os.environ, "GRPC_EXPERIMENTS": POLLER_IO}
    done = subprocess.run([sys.executable, "-c", SERVE_ONE_CALL], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "Unknown experiment" not in done.stderr
    bad = subprocess.run([sys.executable, "-c", SERVE_ONE_CALL], capture_output=True, text=True, timeout=60,
                         env={**env, "GRPC_EXPERIMENTS": "-no_such_experiment"}, check=False)
    assert "Unknown experiment" in bad.stderr  # the check above can fail
