"""One hub-free model dir served by both stacks: our demo model's tokenizer and chat template, long context.

Both stacks then tokenize and template the same way (same prompt token counts, same prefix-cache blocks).
``config.json`` is Qwen3-0.6B-shaped (as ``shared/dynamo-peer/build_model.py`` writes it: Dynamo's mocker
reads the dims for KV bytes per token; no weights exist) with the demo model's vocab and EOS ids and
``max_position_embeddings`` raised: harnessmesh's workers take their context from it (``up
--max-model-len`` reaches only the parse service), Dynamo's mocker and frontend too. The chat template is
also embedded in ``tokenizer_config.json``, where Dynamo's preprocessor looks for it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from services.common.model_dir import DEMO_MODEL_DIR

_QWEN3_06B_SHAPE = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_window_layers": 28,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
}


def build_model_dir(dest: Path, context: int) -> Path:
    """Write the shared model dir to ``dest`` (context ``context`` tokens) and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in DEMO_MODEL_DIR.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)
    demo = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    eos = demo["eos_token_id"]
    config = {**_QWEN3_06B_SHAPE, "vocab_size": demo["vocab_size"], "eos_token_id": eos,
              "bos_token_id": None, "max_position_embeddings": context}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    tok_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = (DEMO_MODEL_DIR / "chat_template.jinja").read_text()
    tok_config["model_max_length"] = context
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return dest
