"""The KV engine core: paged KV blocks, one continuous-batching scheduler, per-request state and output
buffering, driven one step at a time by a real-clock loop (the mocker and torch engines) or by the
replay simulator's clock. See README.md."""
