"""The Responses API's routes over one ``ResponsesApi``.

``gateway.app.create_app`` mounts them over the store it is given (the composition root, ``gateway/server.py``,
opens the one ``--responses-store`` chooses: ``gateway/shared_state.py``), inside the app's middleware (API
key, body limit, admission, spans).
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from gateway.apis.responses.endpoint import ResponsesApi

PATH = "/v1/responses"


def responses_routes(api: ResponsesApi) -> list[BaseRoute]:
    """``POST /v1/responses``, ``POST /v1/responses/compact`` and ``GET`` / ``DELETE
    /v1/responses/{response_id}``."""
    return [
        Route(PATH, api.create, methods=["POST"]),
        Route(PATH + "/compact", api.compact, methods=["POST"]),
        Route(PATH + "/{response_id}", api.retrieve, methods=["GET"]),
        Route(PATH + "/{response_id}", api.delete, methods=["DELETE"]),
    ]
