"""NATS subject names. Everything the mesh publishes lives under ``harnessmesh.<namespace>.``."""

from __future__ import annotations


def kv_events(namespace: str, worker_id: str) -> str:
    """KvEventBatch messages of one worker."""
    return f"harnessmesh.{namespace}.kv.{worker_id}"


def heartbeat(namespace: str) -> str:
    """WorkerHeartbeat messages of every worker."""
    return f"harnessmesh.{namespace}.workers.heartbeat"


def discover(namespace: str) -> str:
    """A router asks every live worker to heartbeat now."""
    return f"harnessmesh.{namespace}.workers.discover"


def namespace_all(namespace: str) -> str:
    """Every subject of a namespace (one subscription keeps KV events and heartbeats in order)."""
    return f"harnessmesh.{namespace}.>"
