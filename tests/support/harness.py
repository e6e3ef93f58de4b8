"""Driving real harness clients (Claude Code, Codex) against a scripted mesh.

``.ci/harnesses/install.sh`` installs the clients pinned in ``.ci/harnesses/clients.txt``; the tests
that drive them run only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``), where a client
can reach the mesh on 127.0.0.1 and nothing else. Each run gets none of this process's environment:
a fresh ``HOME`` in ``WORKDIR/home``, the working directory ``WORKDIR/work``, stdin from /dev/null,
stdout and stderr in ``WORKDIR/stdout.txt`` / ``WORKDIR/stderr.txt``, and only the variables that
point the client at the mesh and keep it offline-clean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from services.launcher.catalog_cmd import API_KEY_ENV
from tests.support.mesh import RunningMesh, running_mesh

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / ".ci" / "harnesses"
CLIENT_HOME = Path(os.environ.get("HARNESS_HOME", Path.home() / ".cache" / "harness-clients"))
API_KEY = "sk-local-test"  # the test meshes run without --api-key: any key passes
# PATH for the client and the commands its tools run (nothing of the test's virtualenv).
CLIENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Codex settings for a headless run: no approvals, its shell unsandboxed (the namespace is the sandbox),
# and none of the calls home (update check, analytics, plugin sync) that would only time out offline.
CODEX_HEADLESS = ('approval_policy = "never"\nsandbox_mode = "danger-full-access"\n'
                  "check_for_update_on_startup = false\n")
CODEX_HEADLESS_TABLES = "\n\n[analytics]\nenabled = false\n\n[features]\nplugins = false\n"


def offline_harness_marks(client: str) -> list[pytest.MarkDecorator]:
    """Marks of a test that drives a real client: it runs only inside ``offline.sh``, as ``.ci/run`` does."""
    return [
        pytest.mark.e2e,
        pytest.mark.harness,
        pytest.mark.timeout(300),
        pytest.mark.skipif(
            os.environ.get("HARNESS_OFFLINE") != "1",
            reason=f"drives the real {client} CLI: run under .ci/harnesses/offline.sh (.ci/run does)",
        ),
    ]


def pinned_version(client: str) -> str:
    """The version of ``client`` pinned in ``clients.txt``."""
    for line in (KIT / "clients.txt").read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and fields[0] == client:
            return fields[2]
    raise KeyError(f"{client} is not in {KIT / 'clients.txt'}")


def client_binary(client: str) -> Path:
    """The pinned ``client``'s native binary, where ``install.sh`` links it; skips the test if it is absent."""
    version = pinned_version(client)
    binary = CLIENT_HOME / "bin" / f"{client}-{version}"
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{client} {version} is not installed: run .ci/harnesses/install.sh {client} "
                    "(needs the npm registry)")
    return binary


def run_client(binary: Path, args: Sequence[str], workdir: Path, env: Mapping[str, str], timeout: float) -> int:
    """Run ``binary ARGS`` once as described in the module docstring; return its exit status.

    A client still running after ``timeout`` seconds is killed with everything it started, and the test fails.
    """
    (workdir / "home").mkdir(parents=True, exist_ok=True)
    (workdir / "work").mkdir(exist_ok=True)
    full_env = {"PATH": CLIENT_PATH, "HOME": str(workdir / "home"), "TERM": "dumb", **env}
    with (workdir / "stdout.txt").open("wb") as out, (workdir / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen([str(binary), *args], cwd=workdir / "work", env=full_env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = (workdir / "stderr.txt").read_text(errors="replace")
    pytest.fail(f"{binary.name} ran past {timeout} s; its stderr ends:\n{stderr[-3000:]}")


def run_claude_code(base_url: str, model: str, workdir: Path, args: Sequence[str], timeout: float) -> int:
    """Claude Code once against the gateway at ``base_url`` (its root: the client appends ``/v1/messages``)."""
    env = {
        "ANTHROPIC_BASE_URL": base_url.rstrip("/").removesuffix("/v1"),
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,  # its small/fast ("haiku") calls go to the same model
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        # Offline-clean: no preconnect (HEAD /api/hello) and no DNS lookup, no telemetry, update or error report.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    return run_client(client_binary("claude-code"), args, workdir, env, timeout)


def configure_codex(mesh_url: str, workdir: Path) -> dict[str, Any]:
    """Write ``WORKDIR/home/.codex``: what ``harnessmesh catalog codex`` prints for the mesh (the catalog file
    and the config that uses it) plus the headless settings; return the catalog."""
    codex_home = workdir / "home" / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    catalog_path = codex_home / "model_catalog.json"

    def catalog_cmd(only: str) -> str:
        argv = [sys.executable, "-m", "services.launcher", "catalog", "codex", "--url", mesh_url, "--only", only,
                "--catalog-path", str(catalog_path)]
        return subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO).stdout

    catalog = catalog_cmd("catalog")
    catalog_path.write_text(catalog)
    (codex_home / "config.toml").write_text(CODEX_HEADLESS + catalog_cmd("config") + CODEX_HEADLESS_TABLES)
    loaded: dict[str, Any] = json.loads(catalog)
    return loaded


def run_codex(workdir: Path, args: Sequence[str], timeout: float) -> int:
    """``codex exec --json ARGS`` once, configured by :func:`configure_codex` (call it first)."""
    env = {"CODEX_HOME": str(workdir / "home" / ".codex"), API_KEY_ENV: API_KEY}
    return run_client(client_binary("codex"), ["exec", "--skip-git-repo-check", "--json", *args], workdir, env,
                      timeout)


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
