"""The TensorRT-LLM engine (``--engine trtllm``): our Engine contract over TensorRT-LLM's LLM API.

``tensorrt_llm`` itself is imported only in :func:`services.worker.trtllm.api.load_llm`.
"""

from services.worker.trtllm.api import INSTALL_HINT, TrtllmApi, load_llm
from services.worker.trtllm.engine import TrtllmEngine
from services.worker.trtllm.events import KvEventNormaliser

__all__ = ["INSTALL_HINT", "KvEventNormaliser", "TrtllmApi", "TrtllmEngine", "load_llm"]
