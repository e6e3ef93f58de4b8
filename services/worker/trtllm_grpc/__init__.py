"""The ``trtllm-grpc`` engine: our Engine contract over TensorRT-LLM's own gRPC server (``trtllm-serve --grpc``)."""

from services.worker.trtllm_grpc.client import TrtllmGrpcClient
from services.worker.trtllm_grpc.engine import TrtllmGrpcEngine

__all__ = ["TrtllmGrpcClient", "TrtllmGrpcEngine"]
