"""``encrypted_content`` of reasoning items: the reasoning text, wrapped so that it survives a round trip.

Clients such as Codex send ``store: false`` and replay reasoning items with ``encrypted_content``
but no ``content``. The gateway keeps no state for them, so the opaque blob carries the text
itself (versioned, base64url; not a secret: it is the model's own reasoning, which the stream
already showed). Blobs from other servers are not ours and decode to ``None``.
"""

from __future__ import annotations

import base64
import binascii

_PREFIX = "hmr1."


def encode_reasoning(text: str) -> str:
    """The opaque ``encrypted_content`` for ``text``."""
    return _PREFIX + base64.urlsafe_b64encode(text.encode()).decode()


def decode_reasoning(blob: str | None) -> str | None:
    """The text inside one of our blobs; ``None`` for anything else."""
    if not blob or not blob.startswith(_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(blob[len(_PREFIX):].encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
