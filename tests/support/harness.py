"""Driving real harness clients (``shared/harnesses``) against a scripted mesh."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.mesh import RunningMesh, running_mesh

REPO = Path(__file__).resolve().parents[2]
HARNESSES = Path(os.environ.get("HARNESSES_DIR", REPO.parent / "shared" / "harnesses"))


def offline_harness_marks(client: str) -> list[pytest.MarkDecorator]:
    """Marks of a test that drives a real client: it runs only inside ``offline.sh``, as ``.ci/run`` does."""
    return [
        pytest.mark.e2e,
        pytest.mark.harness,
        pytest.mark.timeout(300),
        pytest.mark.skipif(
            os.environ.get("HARNESS_OFFLINE") != "1",
            reason=f"drives the real {client} CLI: run under shared/harnesses/offline.sh (.ci/run does)",
        ),
    ]


def require_client(lib_function: str, install_arg: str) -> None:
    """Skip unless ``lib.sh``'s ``lib_function`` finds the client's binary."""
    probe = subprocess.run(["bash", "-c", f"source {HARNESSES / 'lib.sh'} && {lib_function}"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"not installed: run {HARNESSES / 'install.sh'} {install_arg} (needs the npm registry)")


def write_script(path: Path, lines: Sequence[Mapping[str, str]]) -> Path:
    """A mocker ``--script`` JSONL file of ``{"match", "completion"}`` lines."""
    path.write_text("".join(json.dumps(dict(line)) + "\n" for line in lines))
    return path


@contextmanager
def scripted_mesh(tmp: Path, script: Sequence[Mapping[str, str]], model: str) -> Iterator[RunningMesh]:
    """One mocker worker that speaks the demo model's Qwen3-style format, serving ``model``."""
    path = write_script(tmp / "script.jsonl", script)
    args = ["--workers", "1", "--speedup", "50", "--script", str(path), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", model, "--block-size", "16"]
    with running_mesh(args, tmp / "mesh.log") as mesh:
        yield mesh


def stdout_events(workdir: Path) -> list[dict[str, Any]]:
    """The JSON lines a client printed (``--output-format stream-json`` / ``--json``)."""
    lines = (workdir / "stdout.txt").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip().startswith("{")]
