"""A tiny random-weight model of a real architecture, saved in Hugging Face layout with the demo tokenizer.

Loaded by the torch engine exactly like a user's checkpoint (``AutoModelForCausalLM.from_pretrained``).
``initializer_range`` is large so greedy decoding has clear winners (no near-ties between logits).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from services.common.model_dir import DEMO_MODEL_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_model(dest: Path, arch: str = "llama", seed: int = 0, hidden: int = 64) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    common = dict(vocab_size=4102, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                  eos_token_id=[2, 0], bos_token_id=None, pad_token_id=0, initializer_range=0.3,
                  tie_word_embeddings=False)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    model.save_pretrained(dest)
    for name in TOKENIZER_FILES:
        shutil.copy(DEMO_MODEL_DIR / name, dest / name)
    return dest
