"""The torch engine (``--engine torch``): a Hugging Face causal LM over one paged KV pool (CPU or GPU).

Needs the ``torch`` extra (``pip install -e '.[torch]'``); nothing outside this package imports it.
"""

from services.worker.torch_engine.engine import TorchConfig, TorchEngine
from services.worker.torch_engine.runner import ModelRunner
from services.worker.torch_engine.sampler import Sampler

__all__ = ["ModelRunner", "Sampler", "TorchConfig", "TorchEngine"]
