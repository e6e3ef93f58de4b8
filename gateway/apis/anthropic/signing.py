"""Signatures of the thinking blocks this gateway emits: :class:`gateway.signing.ThinkingSigner` (the gateway's
one signing mechanism, shared with the Responses API's compaction items), named here for this API's modules."""

from __future__ import annotations

from gateway.signing import ThinkingSigner, Verdict

__all__ = ["ThinkingSigner", "Verdict"]
