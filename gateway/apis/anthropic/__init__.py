"""The Anthropic Messages API of the gateway (``--enable-anthropic-api``).

``anthropic_routes`` is what ``gateway.app`` mounts; see "Anthropic Messages API" in the gateway
README for the mapping to the canonical ``ChatRequest`` and the stream invariants.
"""

from __future__ import annotations

from starlette.routing import Route

from gateway.apis.anthropic.endpoint import MessagesApi
from gateway.apis.anthropic.signing import ThinkingSigner
from gateway.parse_client import ParseClient
from gateway.settings import GatewaySettings


def anthropic_routes(parse: ParseClient, settings: GatewaySettings) -> list[Route]:
    """``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (``?beta=true`` is accepted and ignored)."""
    api = MessagesApi(
        parse,
        ThinkingSigner(settings.thinking_signature_key),
        strip=settings.strip_anthropic_preamble,
        max_messages=settings.max_messages,
    )
    return [
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
    ]
