"""The gateway process: HTTP (OpenAI-compatible) and gRPC edge APIs in front of the parse service.

It converts each API's requests into the canonical ``ChatRequest`` and the parse service's typed
events back into the API's wire format. It never parses model text. Run it with ``python -m gateway``.
"""
