"""Keyed MACs on what the gateway hands a client and later takes back from it.

One key (``--thinking-signature-key``, the same on every gateway replica; empty: a random key per process,
so what it signed dies with the process) is the root of every use; each use signs with its own key derived
from it (HMAC-SHA256 of the root key and the use's name), so a MAC made for one use never passes for
another. Two uses:

- :class:`ThinkingSigner`: signatures of the Anthropic API's thinking blocks. A signature is ``hm1.`` +
  base64url(HMAC-SHA256(key, thinking)) with the root key itself (signatures made before the derived keys
  existed stay valid). On replay a block is ``valid``, ``missing`` (Claude Code sends ``""`` when nothing
  was streamed), ``foreign`` (another provider's) or ``invalid`` (ours, but the text changed or the key
  did). Only ``valid`` proves the text is what the model wrote; the others are accepted all the same and
  only counted, never fatal.
- :class:`Sealer`: opaque blobs that carry a text to the client and back unchanged (the Responses API's
  ``compaction`` items): ``PREFIX`` + base64url(text) + ``.`` + base64url(MAC). :meth:`Sealer.open` gives
  the text back only when the MAC is this gateway's; a caller refuses anything else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Iterable
from typing import Literal

Verdict = Literal["valid", "missing", "foreign", "invalid"]
_THINKING_PREFIX = "hm1."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SigningKey:
    """The gateway's root signing key; ``key`` empty: a random per-process key."""

    def __init__(self, key: str = "") -> None:
        self.root = key.encode() if key else secrets.token_bytes(32)

    def derive(self, use: str) -> bytes:
        """The key of one use (its name, e.g. ``"responses.compaction"``)."""
        return hmac.new(self.root, b"harnessmesh signing key: " + use.encode(), hashlib.sha256).digest()


class ThinkingSigner:
    """HMAC signer of thinking text (the root key: see the module docstring)."""

    def __init__(self, key: str | SigningKey = "") -> None:
        self._key = (key if isinstance(key, SigningKey) else SigningKey(key)).root

    def sign(self, thinking: str) -> str:
        return _THINKING_PREFIX + _b64(hmac.new(self._key, thinking.encode(), hashlib.sha256).digest())

    def verify(self, thinking: str, signature: str) -> Verdict:
        if not signature:
            return "missing"
        if not signature.startswith(_THINKING_PREFIX):
            return "foreign"
        return "valid" if hmac.compare_digest(signature, self.sign(thinking)) else "invalid"

    def verdicts(self, blocks: Iterable[tuple[str, str]]) -> Counter[Verdict]:
        """How many replayed (thinking, signature) blocks got each verdict."""
        return Counter(self.verify(text, sig) for text, sig in blocks)


class Sealer:
    """Seals a text into an opaque blob and opens only blobs it sealed (``prefix`` names the blob's kind and
    format version, ``use`` the derived key)."""

    def __init__(self, key: str | SigningKey, *, use: str, prefix: str) -> None:
        self._key = (key if isinstance(key, SigningKey) else SigningKey(key)).derive(use)
        self.prefix = prefix

    def _mac(self, payload: bytes) -> str:
        return _b64(hmac.new(self._key, payload, hashlib.sha256).digest())

    def seal(self, text: str) -> str:
        payload = text.encode()
        return f"{self.prefix}{_b64(payload)}.{self._mac(payload)}"

    def verdict(self, blob: str) -> Verdict:
        """``valid`` (ours, unchanged), ``missing`` (empty), ``foreign`` (not our format) or ``invalid``."""
        return self._open(blob)[0]

    def open(self, blob: str) -> str | None:
        """The text ``blob`` carries when this sealer sealed it unchanged, else None."""
        return self._open(blob)[1]

    def _open(self, blob: str) -> tuple[Verdict, str | None]:
        if not blob:
            return "missing", None
        if not blob.startswith(self.prefix):
            return "foreign", None
        body, _, mac = blob[len(self.prefix):].rpartition(".")
        try:
            payload = _unb64(body)
            text = payload.decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return "invalid", None
        if not hmac.compare_digest(mac, self._mac(payload)):
            return "invalid", None
        return "valid", text
