"""The one API-key check of every edge: HTTP (``Authorization: Bearer KEY`` or ``x-api-key``) and the gRPC
edge (the same two as call metadata). Keys compare in constant time; several keys may be valid at once
(rotation). No keys configured: every request is allowed."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence


class ApiKeys:
    """The accepted keys and the check of a request's headers or metadata against them."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [k.encode() for k in keys if k]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def allows(self, headers: Mapping[str, str]) -> bool:
        """``headers``: lower-case names (HTTP headers or gRPC text metadata)."""
        if not self._keys:
            return True
        auth = headers.get("authorization", "")
        offered = [auth[7:].strip() if auth.lower().startswith("bearer ") else "", headers.get("x-api-key", "")]
        return any(hmac.compare_digest(token.encode(), key) for token in offered if token for key in self._keys)
