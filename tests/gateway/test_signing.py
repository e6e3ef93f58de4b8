"""The gateway's keyed MACs (``gateway/signing.py``): thinking signatures keep their format, sealed blobs open only
unchanged and under their own key, and a MAC made for one use never passes for another."""

from __future__ import annotations

import base64
import hashlib
import hmac

from gateway.signing import Sealer, SigningKey, ThinkingSigner


def test_thinking_signatures_are_the_hmac_of_the_text_under_the_root_key() -> None:
    digest = hmac.new(b"k", b"plan", hashlib.sha256).digest()
    assert ThinkingSigner("k").sign("plan") == "hm1." + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert ThinkingSigner(SigningKey("k")).verify("plan", ThinkingSigner("k").sign("plan")) == "valid"


def test_a_sealed_text_opens_only_unchanged_and_under_its_key() -> None:
    sealer = Sealer("k", use="a", prefix="x1.")
    for text in ["", "summary", "é工具\n" * 50]:
        blob = sealer.seal(text)
        assert blob.startswith("x1.") and sealer.open(blob) == text and sealer.verdict(blob) == "valid"
    blob = sealer.seal("the summary")
    body, _, mac = blob.rpartition(".")
    forged = "x1." + base64.urlsafe_b64encode(b"another summary").decode().rstrip("=") + "." + mac
    assert [sealer.verdict(b) for b in (forged, body + ".", blob + "A", blob[:-1], "gAAAA", "")] == [
        "invalid", "invalid", "invalid", "invalid", "foreign", "missing"]
    assert Sealer("other", use="a", prefix="x1.").open(blob) is None
    assert Sealer("k", use="b", prefix="x1.").open(blob) is None  # the same root key, another use
    assert Sealer(SigningKey("k"), use="a", prefix="x1.").open(blob) == "the summary"


def test_a_random_key_is_per_instance() -> None:
    blob = Sealer("", use="a", prefix="x1.").seal("t")
    assert Sealer("", use="a", prefix="x1.").open(blob) is None
