"""Start / stop NVIDIA Dynamo's frontend + mocker (and the null SSE server) as our own child processes.

Adapted from ``shared/dynamo-peer/start_peer.sh`` / ``stop_peer.sh``: no etcd and no NATS (file
discovery, TCP request plane, ZMQ event plane), every socket on loopback, each process in its own session
(``setsid``) with its pid in ``RUN/<name>.pid``; stopping signals exactly those process groups.
The mocker runs as plain ``python -m dynamo.mocker`` (the recipe's wrapper only adds reasoning / tool
parser names, which this bench does not use).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.launcher.supervisor import free_port


@dataclass(frozen=True)
class EngineConfig:
    """The engine / router configuration both stacks get (and both replay simulators)."""

    block_size: int = 16
    num_blocks: int = 16384
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    speedup: float = 1000.0
    context: int = 131072
    workers: int = 1


@dataclass
class Processes:
    """Children started here: name -> Popen; stop() signals their process groups only."""

    run_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.run_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)  # own session: pgid == pid
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
        self.procs.clear()

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


def wait_models(url: str, name: str, procs: Processes, timeout: float = 120.0) -> None:
    """Poll ``url/v1/models`` until ``name`` is listed; raise with the logs if a child died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pname, proc in procs.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{pname} exited ({proc.returncode}):\n{procs.log_tail(pname)}")
        try:
            if name in httpx.get(f"{url}/v1/models", timeout=2).text:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s:\n" +
                       "\n".join(f"--- {n}\n{procs.log_tail(n)}" for n in procs.procs))


def dynamo_env(run_dir: Path) -> dict[str, str]:
    kv = run_dir / "kv"
    kv.mkdir(parents=True, exist_ok=True)
    loopback = {k: "127.0.0.1" for k in ("DYN_EVENT_PLANE_HOST", "DYN_TCP_RPC_HOST",
                                         "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_HTTP_RPC_HOST")}
    return {**os.environ, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv), "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "zmq", "DYN_LOG": "warn", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            **loopback}


def start_dynamo(procs: Processes, python: Path, model: Path, name: str, cfg: EngineConfig) -> str:
    """Start mocker + frontend (kv router); return the frontend's base URL once ``name`` is served."""
    env = dynamo_env(procs.run_dir)
    port = free_port()
    procs.start("dynamo-mocker", [
        str(python), "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", name,
        "--speedup-ratio", str(cfg.speedup), "--num-workers", str(cfg.workers),
        "--block-size", str(cfg.block_size), "--num-gpu-blocks-override", str(cfg.num_blocks),
        "--max-num-seqs", str(cfg.max_num_seqs), "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
        "--max-model-len", str(cfg.context)], env)
    procs.start("dynamo-frontend", [
        str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
        "--router-mode", "kv"], env)
    url = f"http://127.0.0.1:{port}"
    wait_models(url, name, procs)
    return url


def start_null(procs: Processes, python: Path) -> str:
    port = free_port()
    procs.start("null-sse", [str(python), str(Path(__file__).with_name("null_sse.py")), str(port)], dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    wait_models(url, "null", procs, timeout=30)
    return url
