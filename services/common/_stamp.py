import os
import time

_F = None
def stamp(tag: str) -> None:
    global _F
    d = os.environ.get("HM_STAMP")
    if not d:
        return
    if _F is None:
        _F = open(f"{d}/st.{os.getpid()}", "a", buffering=1)
    _F.write(f"{time.time():.6f} {tag}\n")
