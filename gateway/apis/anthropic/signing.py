"""Signatures of the thinking blocks this gateway emits, so that a replayed block can be checked.

A signature is ``hm1.`` + base64url(HMAC-SHA256(key, thinking)). On replay a block is ``valid``,
``missing`` (Claude Code sends ``""`` when nothing was streamed), ``foreign`` (another provider's) or
``invalid`` (ours, but the text changed or the key did). Only ``valid`` proves the text is what the
model wrote; the others are accepted all the same and only counted — never fatal.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Iterable
from typing import Literal

Verdict = Literal["valid", "missing", "foreign", "invalid"]
_PREFIX = "hm1."


class ThinkingSigner:
    """HMAC signer of thinking text; ``key`` empty: a random per-process key (signatures die with it)."""

    def __init__(self, key: str = "") -> None:
        self._key = key.encode() if key else secrets.token_bytes(32)

    def sign(self, thinking: str) -> str:
        digest = hmac.new(self._key, thinking.encode(), hashlib.sha256).digest()
        return _PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def verify(self, thinking: str, signature: str) -> Verdict:
        if not signature:
            return "missing"
        if not signature.startswith(_PREFIX):
            return "foreign"
        return "valid" if hmac.compare_digest(signature, self.sign(thinking)) else "invalid"

    def verdicts(self, blocks: Iterable[tuple[str, str]]) -> Counter[Verdict]:
        """How many replayed (thinking, signature) blocks got each verdict."""
        return Counter(self.verify(text, sig) for text, sig in blocks)
