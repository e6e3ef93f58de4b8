"""The gateway's client APIs, one package each: models, convert, encode, errors, endpoint (or service)."""
