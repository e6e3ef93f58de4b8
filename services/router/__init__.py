"""The KV-aware router: places each request on the worker holding its prefix, proxies the stream."""
