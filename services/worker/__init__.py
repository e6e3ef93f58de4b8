"""The worker process: serves the token-level Generate stream from one engine and publishes KV events."""
