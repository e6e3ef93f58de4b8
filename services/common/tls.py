"""Mutual TLS for the mesh's own links: every gRPC hop and NATS, from three PEM files.

Off by default: on one machine the links are loopback. Across machines, give every process the same CA and
a certificate it signed (``--tls-cert``, ``--tls-key``, ``--tls-ca``; ``harnessmesh up`` hands them to its
children): each server then requires a client certificate from that CA and each client checks the server's,
so a process without one can neither serve nor call a hop. Certificates name the host the peer dials (a
subjectAltName: the IP or DNS name in ``--advertise-host`` / the addresses the services are given) and carry
both the serverAuth and clientAuth key usages. The gRPC edge for harnesses (``AgentService``) is served over
TLS with the same certificate but asks clients for none: harnesses authenticate with the API key.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.errors import InvalidRequestError


@dataclass(frozen=True)
class TlsFiles:
    """Paths of this process's certificate, its key and the CA that signs every mesh certificate (PEM).

    All three empty: plaintext. Some but not all set is a configuration error (:meth:`check`).
    """

    cert: str = ""
    key: str = ""
    ca: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)

    def check(self) -> None:
        """Raise InvalidRequestError unless none or all three are given and readable."""
        if not self.enabled:
            return
        missing = [flag for flag, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca))
                   if not path]
        if missing:
            raise InvalidRequestError(f"TLS needs --tls-cert, --tls-key and --tls-ca together; missing {missing}")
        for path in (self.cert, self.key, self.ca):
            if not Path(path).is_file():
                raise InvalidRequestError(f"TLS file {path} does not exist")

    def _read(self) -> tuple[bytes, bytes, bytes]:
        self.check()
        return Path(self.cert).read_bytes(), Path(self.key).read_bytes(), Path(self.ca).read_bytes()

    def server_credentials(self, *, require_client_auth: bool = True) -> grpc.ServerCredentials:
        """A gRPC server's credentials: this certificate; clients must present one from the CA unless told not."""
        cert, key, ca = self._read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=require_client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A gRPC client's credentials: trust the CA only, and present this certificate."""
        cert, key, ca = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def client_context(self) -> ssl.SSLContext:
        """An SSL context for a NATS client: verify the server against the CA, present this certificate."""
        self.check()
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


PLAINTEXT = TlsFiles()
