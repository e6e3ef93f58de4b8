"""Create (once) and reuse a side venv with NVIDIA Dynamo 1.6.1, CPU only.

Recipe from ``shared/dynamo-peer/install_dynamo.sh``. Plain ``pip install ai-dynamo`` fails offline:
its hard dependency ``aisimulate`` is a stub sdist whose build downloads a wheel from NVIDIA's own
index. ``aisimulate`` is only imported by the planner paths, so ``ai-dynamo`` goes in with
``--no-deps`` and its other requirements are listed by hand (``certifi`` unpinned: ai-dynamo pins a
release newer than the registry has). No torch / CUDA is pulled. ~40 s, ~690 MB.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

DYNAMO_VERSION = "1.6.1"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".bench" / "dynamo-venv"
_EXTRA_REQUIREMENTS = [
    "aiohttp<4.0,>=3.14.3", "certifi", "kubernetes<33.0.0,>=32.0.1", "msgspec>=0.19.0",
    "prometheus-client<1.0,>=0.23.1", "pyzmq>=26.0.0", "redis<9.0.0,>=6.2.0", "tqdm>=4.0.0",
    "transformers>=4.56.0", "typing-extensions>=4.10.0", "zstandard<1.0,>=0.23.0",
]
_CHECK = "import dynamo.llm, dynamo.frontend, dynamo.mocker, dynamo.replay.api"
_MARKER = ".harnessmesh-bench-ok"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_dynamo_venv(venv: Path, log: Callable[[str], object] = print) -> Path:
    """Return the venv's python, installing ai-dynamo there first unless a previous run finished."""
    py = python_of(venv)
    if (venv / _MARKER).is_file() and py.is_file():
        return py
    log(f"installing ai-dynamo {DYNAMO_VERSION} into {venv} (once; ~40 s, ~690 MB)")
    t0 = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, "--upgrade", "pip"],
        [*pip, f"ai-dynamo-runtime=={DYNAMO_VERSION}"],
        [*pip, "--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"],
        [*pip, *_EXTRA_REQUIREMENTS],
        [str(py), "-c", _CHECK],
    ]
    for step in steps:
        subprocess.run(step, check=True)
    (venv / _MARKER).write_text(DYNAMO_VERSION + "\n")
    log(f"installed in {time.monotonic() - t0:.0f} s")
    return py
