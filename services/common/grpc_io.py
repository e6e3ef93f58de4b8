"""gRPC's socket engine for the mesh's processes: the one setting that must be made before grpc loads.

Since grpcio 1.80, Python's gRPC clients and servers do their socket I/O on the EventEngine, whose
threads hand every message to the one that polls for the asyncio loop. On a small host that hand-off is
most of a hop: a bidi echo between two processes on this 2-vCPU machine takes 0.57-0.70 times as long
with grpc's poller I/O (``GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener``, the switch grpc
keeps for it; ``bench/grpc_io.py``: 0.21-0.24 ms against 0.33-0.35 ms), and a short request through the mesh's three
hops got its first token 0.6-1.0 ms sooner (4 alternating pairs of meshes; ``bench/vs_dynamo.py``
metric 2). So every service's entry point calls :func:`choose_grpc_io` before anything imports grpc
(set later, only part of it takes effect). A ``GRPC_EXPERIMENTS`` the operator set is kept as it is;
``GRPC_EXPERIMENTS=`` (empty) runs grpc's default.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

POLLER_IO = "-event_engine_client,-event_engine_listener"


def choose_grpc_io(environ: MutableMapping[str, str] = os.environ) -> str:
    """Select grpc's poller I/O unless ``GRPC_EXPERIMENTS`` is set already; returns the value in force."""
    return environ.setdefault("GRPC_EXPERIMENTS", POLLER_IO)
