"""The mesh's back-end processes: parse, router and worker, plus the launcher and shared code."""
