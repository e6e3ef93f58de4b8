"""Generated protobuf and gRPC code for the mesh's wire contracts.

Everything here except this file and ``__main__.py`` is generated from ``proto/services/api/``
by ``python -m services.api``; ``python -m services.api --check`` fails when it is stale.
"""
