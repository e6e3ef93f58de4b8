"""The OpenAI Responses API (``POST /v1/responses``): models, conversion, events, errors, store, endpoint."""
