"""Compare our block hashes with ``ai-dynamo-runtime``'s ``compute_block_hash_for_seq`` (run in a venv that has it).

    python -m venv /tmp/dyn && /tmp/dyn/bin/pip install ai-dynamo-runtime xxhash
    /tmp/dyn/bin/python bench/dynamo_hash_check.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.block_hash import local_block_hashes, seed_for


def main() -> int:
    try:
        from dynamo._core import compute_block_hash_for_seq
    except ImportError:
        print("ai-dynamo-runtime is not installed in this interpreter; nothing compared")
        return 0
    rng = random.Random(0)
    checked = 0
    for _ in range(200):
        block = rng.choice([16, 32, 64])
        tokens = [rng.randrange(1 << 32) for _ in range(block * rng.randrange(1, 20) + rng.randrange(block))]
        lora = rng.choice([None, "adapter-a", "my-lora"])
        theirs = compute_block_hash_for_seq(tokens, block, lora_name=lora)
        ours = local_block_hashes(tokens, block, seed_for(lora or ""))
        if list(theirs) != ours:
            print(f"MISMATCH block={block} lora={lora}: {theirs[:3]} != {ours[:3]}")
            return 1
        checked += len(ours)
    print(f"ok: {checked} block hashes equal to ai-dynamo-runtime's compute_block_hash_for_seq (incl. LoRA seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
