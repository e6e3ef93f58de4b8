"""Driving real harness clients (Claude Code, Codex, pi, OpenClaw) against a scripted mesh.

``.ci/harnesses/install.sh`` installs the clients pinned in ``.ci/harnesses/clients.txt``; the tests
that drive them run only inside ``.ci/harnesses/offline.sh`` (``HARNESS_OFFLINE=1``), where a client
can reach the mesh on 127.0.0.1 and nothing else. Each run gets none of this process's environment:
a fresh ``HOME`` in ``WORKDIR/home``, the working directory ``WORKDIR/work``, stdin from /dev/null,
stdout and stderr in ``WORKDIR/stdout.txt`` / ``WORKDIR/stderr.txt``, and only the variables that
point the client at the mesh and keep it offline-clean. pi and OpenClaw are configured with what
``harnessmesh catalog pi|openclaw`` prints, saved whole where the README says. :class:`RecordingProxy`
sits between a client and the gateway when a test needs what the client really sent (headers, bodies).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def pinned_versions(client: str) -> list[str]:
    """The versions of ``client`` pinned in ``clients.txt``, the default (its first line) first."""
    versions = [fields[2] for fields in map(str.split, (KIT / "clients.txt").read_text().splitlines())
                if fields and not fields[0].startswith("#") and fields[0] == client]
    if not versions:
        raise KeyError(f"{client} is not in {KIT / 'clients.txt'}")
    return versions


def pinned_version(client: str) -> str:
    """The version of ``client`` the tests use by default (its first line in ``clients.txt``)."""
    return pinned_versions(client)[0]


def client_binary(client: str, version: str = "") -> Path:
    """The pinned ``client``'s native binary (at ``version``, default: :func:`pinned_version`), where
    ``install.sh`` links it; skips the test if it is absent."""
    version = version or pinned_version(client)
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


def run_claude_code(base_url: str, model: str | None, workdir: Path, args: Sequence[str], timeout: float) -> int:
    """Claude Code once against the gateway at ``base_url`` (its root: the client appends ``/v1/messages``).

    ``model`` None sets no model variable: Claude Code then asks for the model names it makes up itself.
    """
    models = {} if model is None else {
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,  # its small/fast ("haiku") calls go to the same model
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    }
    env = {
        "ANTHROPIC_BASE_URL": base_url.rstrip("/").removesuffix("/v1"),
        "ANTHROPIC_API_KEY": API_KEY,
        **models,
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


def run_codex(workdir: Path, args: Sequence[str], timeout: float, version: str = "") -> int:
    """``codex exec --json ARGS`` once (Codex ``version``, default: :func:`pinned_version`), configured by
    :func:`configure_codex` (call it first)."""
    env = {"CODEX_HOME": str(workdir / "home" / ".codex"), API_KEY_ENV: API_KEY}
    return run_client(client_binary("codex", version), ["exec", "--skip-git-repo-check", "--json", *args], workdir,
                      env, timeout)


def write_script(path: Path, lines: Sequence[Mapping[str, str]]) -> Path:
    """A mocker ``--script`` JSONL file of ``{"match", "completion"}`` lines."""
    path.write_text("".join(json.dumps(dict(line)) + "\n" for line in lines))
    return path


@contextmanager
def scripted_mesh(tmp: Path, script: Sequence[Mapping[str, str]], model: str, extra_args: Sequence[str] = (),
                  env: dict[str, str] | None = None) -> Iterator[RunningMesh]:
    """One mocker worker that speaks the demo model's Qwen3-style format, serving ``model``; ``extra_args`` go to
    ``harnessmesh up`` (e.g. ``--trace-records``), ``env`` to its environment (e.g. an OTLP exporter)."""
    path = write_script(tmp / "script.jsonl", script)
    args = ["--workers", "1", "--speedup", "50", "--script", str(path), "--reasoning-parser", "qwen3",
            "--tool-parser", "hermes", "--served-model-name", model, "--block-size", "16", *extra_args]
    with running_mesh(args, tmp / "mesh.log", env=env) as mesh:
        yield mesh


def stdout_events(workdir: Path) -> list[dict[str, Any]]:
    """The JSON lines a client printed (``--output-format stream-json`` / ``--json``)."""
    lines = (workdir / "stdout.txt").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip().startswith("{")]


def catalog_output(mesh_url: str, harness: str) -> str:
    """What ``harnessmesh catalog HARNESS --url MESH_URL`` prints on stdout (the config file itself)."""
    argv = [sys.executable, "-m", "services.launcher", "catalog", harness, "--url", mesh_url]
    return subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO).stdout


def configure_pi(mesh_url: str, workdir: Path) -> dict[str, Any]:
    """Save ``harnessmesh catalog pi`` whole as ``WORKDIR/home/.pi/agent/models.json``; return it parsed."""
    text = catalog_output(mesh_url, "pi")
    path = workdir / "home" / ".pi" / "agent" / "models.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


# pi offline: no update check, package check or install telemetry at start-up.
PI_ENV = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}


def run_pi(workdir: Path, args: Sequence[str], timeout: float) -> int:
    """``pi ARGS`` once, configured by :func:`configure_pi` (call it first); the key comes from the environment
    as the catalog's config says."""
    return run_client(client_binary("pi"), args, workdir, {**PI_ENV, API_KEY_ENV: API_KEY}, timeout)


def configure_openclaw(mesh_url: str, workdir: Path) -> dict[str, Any]:
    """Save ``harnessmesh catalog openclaw`` whole as ``WORKDIR/home/.openclaw/openclaw.json``; return it parsed."""
    text = catalog_output(mesh_url, "openclaw")
    path = workdir / "home" / ".openclaw" / "openclaw.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def run_openclaw(workdir: Path, args: Sequence[str], timeout: float) -> int:
    """``openclaw ARGS`` once, configured by :func:`configure_openclaw` (call it first)."""
    return run_client(client_binary("openclaw"), args, workdir, {API_KEY_ENV: API_KEY}, timeout)


@dataclass(frozen=True)
class Recorded:
    """One request a client sent through a :class:`RecordingProxy`."""

    method: str
    path: str
    headers: dict[str, str]  # names lowercased
    body: Any  # parsed JSON, or the raw text when it is not JSON


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "proxy-connection", "te"}


class RecordingProxy:
    """A loopback HTTP pass-through to the gateway that keeps every request a client sends through it.

    Responses stream back chunk by chunk as the gateway writes them (SSE included), close-delimited
    (HTTP/1.0), so the client sees the gateway's answers unchanged apart from framing. Request bodies are
    read by ``Content-Length`` (every client driven here sends one). It observes only: tests still talk to
    the real mesh.
    """

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.requests: list[Recorded] = []
        lock = threading.Lock()
        recorded = self.requests
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                with lock:
                    recorded.append(Recorded(self.command, self.path, headers, body))
                upstream_headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
                upstream_headers["content-length"] = str(len(raw))
                conn = http.client.HTTPConnection(host, port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=raw, headers=upstream_headers)
                    reply = conn.getresponse()
                    self.send_response(reply.status, reply.reason)
                    for name, value in reply.getheaders():
                        if name.lower() not in _HOP_BY_HOP:
                            self.send_header(name, value)
                    self.send_header("connection", "close")
                    self.end_headers()
                    while chunk := reply.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                finally:
                    conn.close()

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def posts(self, suffix: str) -> list[Recorded]:
        """The POSTs whose path (query string aside) ends with ``suffix``, in arrival order."""
        return [r for r in list(self.requests) if r.method == "POST" and r.path.split("?")[0].endswith(suffix)]


# The three wire APIs pi and OpenClaw speak, as `harnessmesh catalog pi|openclaw` names them:
# their `api` -> (the catalog's provider, the gateway path, the trace records' `api`).
WIRE_APIS = {
    "openai-completions": ("harnessmesh", "/v1/chat/completions", "openai"),
    "openai-responses": ("harnessmesh-responses", "/v1/responses", "responses"),
    "anthropic-messages": ("harnessmesh-anthropic", "/v1/messages", "anthropic"),
}


def reasoning_requested(api: str, body: Mapping[str, Any]) -> bool:
    """Whether a request of ``api`` (a :data:`WIRE_APIS` key) asks the model to reason."""
    if api == "anthropic-messages":
        return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    if api == "openai-responses":
        return bool((body.get("reasoning") or {}).get("effort"))
    return bool(body.get("reasoning_effort") or body.get("reasoning"))


def replayed_reasoning(api: str, body: Mapping[str, Any]) -> list[str]:
    """The reasoning texts a request of ``api`` carries back from earlier assistant turns, each only when it
    comes with what the API needs to trust it (Anthropic: a signature; Responses: ``encrypted_content``)."""
    texts: list[str] = []
    if api == "anthropic-messages":
        for message in body.get("messages") or []:
            if message.get("role") == "assistant" and isinstance(message.get("content"), list):
                texts += [b["thinking"] for b in message["content"]
                          if b.get("type") == "thinking" and b.get("signature")]
    elif api == "openai-responses":
        for item in body.get("input") or []:
            if isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content"):
                parts = (item.get("content") or []) + (item.get("summary") or [])
                texts += [p["text"] for p in parts[:1]]
    else:
        for message in body.get("messages") or []:
            if message.get("role") == "assistant":
                texts += [message[k] for k in ("reasoning_content", "reasoning") if message.get(k)][:1]
    return texts


def trace_records(path: Path, since: float, api: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The mesh's ``--trace-records`` lines for ``api`` that arrived at or after ``since`` (Unix seconds), oldest
    first, once there are ``count`` of them (a record is written as its request ends); fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        records = sorted((r for r in map(json.loads, filter(None, lines)) if r["api"] == api and r["ts"] >= since),
                         key=lambda r: r["ts"])
        if len(records) >= count or time.monotonic() > deadline:
            assert len(records) == count, (api, count, records)
            return records
        time.sleep(0.1)
