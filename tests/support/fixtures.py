"""Where the data the tests and benchmarks read lies: ``tests/fixtures``, inside the repository.

Each file's source and licence are in ``tests/fixtures/SOURCES.md``. Nothing reads outside the repository,
so a fresh clone runs every test (``tests/test_standalone_clone.py`` checks it).
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = FIXTURES / "captures"  # requests recorded from real clients (Claude Code, Codex, the Python SDKs)
CODEX_MODEL_CATALOG = FIXTURES / "codex_model_catalog.json"  # a catalog entry in the shape Codex 0.169.0 loads
CONVERSATION_TRACE = FIXTURES / "traces" / "conversation_trace_head1000.jsonl"  # Mooncake's, first 1,000 requests
