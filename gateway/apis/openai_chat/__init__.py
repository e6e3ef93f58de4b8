"""The OpenAI chat completions API (``POST /v1/chat/completions``): models, conversion, chunks, errors, endpoint."""
