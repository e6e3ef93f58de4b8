"""compose.yaml and the Dockerfile cannot rot: every command, flag, port, env var and healthcheck is checked
against the real CLIs, the healthchecks run against a real mesh, and docker-compose validates the file
where it is installed (Debian's ``docker-compose`` package: ``config`` needs no Docker engine)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from services.common.settings import env_name, fields_of, parse_settings, settings_from_namespace
from services.launcher.cli import build_parser
from services.launcher.health_cmd import HealthSettings, usage_error
from services.launcher.nats_server import find_nats_server
from services.launcher.specs import ALL_SERVICES, ServiceSpec
from services.launcher.supervisor import free_port, terminate
from services.worker.registry import ENGINES
from tests.support.mesh import RunningMesh, running_mesh

REPO = Path(__file__).resolve().parents[1]
SPECS = {spec.module: spec for spec in ALL_SERVICES}
OTEL_VARS = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER"}
TOKEN_VAR = "HARNESSMESH_NATS_TOKEN"
PUBLISH_VAR = "HARNESSMESH_PUBLISH_ADDRESS"
BASE_ENV = {TOKEN_VAR: "compose-test-token"}
GPU_ENGINES = ("trtllm", "trtllm-grpc")
# Services that run another project's image with its own healthcheck: Jaeger, and TensorRT-LLM's own server
# beside the trtllm-grpc worker (NVIDIA's image, untouched).
THIRD_PARTY = {"jaeger", "trtllm-serve-1"}
GPU_PROFILES = ({"gpu"}, {"gpu-grpc"})
_VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


# --- compose.yaml as Compose sees it: YAML (anchors, merge keys), variables, .env, profiles ---

def dot_env() -> dict[str, str]:
    """The variables compose reads from ``.env`` beside compose.yaml."""
    lines = (REPO / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.lstrip().startswith("#"))


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``${VAR:?error}`` in every string."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match.groups()
        given = env.get(name)
        if op == ":?" and not given:
            raise LookupError(f"{name}: {arg}")
        if (op == ":-" and not given) or (op == "-" and given is None):
            return str(arg)
        return given or ""

    return _VARIABLE.sub(substitute, value)


def load(**variables: str) -> dict[str, Any]:
    """compose.yaml with its variables resolved from ``.env``, then ``variables`` (the shell's, which win)."""
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())
    data: dict[str, Any] = interpolate(raw, {**dot_env(), **BASE_ENV, **variables})
    return data


def active(compose: dict[str, Any], profiles: set[str]) -> set[str]:
    """The services ``docker compose`` starts with these profiles enabled."""
    return {name for name, svc in compose["services"].items()
            if not svc.get("profiles") or profiles & set(svc["profiles"])}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load()


def our_services(compose: dict[str, Any]) -> list[tuple[str, ServiceSpec, list[str], dict[str, str]]]:
    out = []
    for name, svc in compose["services"].items():
        command = svc.get("command", [])
        if command[:2] != ["python", "-m"]:
            continue
        out.append((name, SPECS[command[2]], command[3:], {k: str(v) for k, v in svc["environment"].items()}))
    return out


def settings_of(spec: ServiceSpec, argv: list[str], env: dict[str, str]) -> Any:
    return parse_settings(spec.settings_class(), spec.name, argv, environ=env)


def healthcheck_argv(svc: dict[str, Any]) -> list[str]:
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD", "exec form: no shell in between"
    return list(test[1:])


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- the file itself ---

def test_profiles_mocker_by_default_and_gpu_alone() -> None:
    compose = load()
    core = {"nats", "jaeger", "router", "parse", "gateway"}
    default = active(compose, set(dot_env()["COMPOSE_PROFILES"].split(",")))
    assert default == core | {"worker-1", "worker-2"}
    gpu = active(compose, {"gpu"})  # `--profile gpu` replaces COMPOSE_PROFILES: no mocker worker starts
    assert gpu == core | {n for n in compose["services"] if n.startswith("worker-gpu-")}
    assert len(gpu - core) >= 2
    grpc = active(compose, {"gpu-grpc"})  # the other TensorRT-LLM engine, on the same GPUs: alone too
    assert grpc == core | {"trtllm-serve-1", "worker-grpc-1"}
    for selected in (default, gpu, grpc):
        for name in selected:  # everything a started service waits for is started too
            assert set(compose["services"][name].get("depends_on", {})) <= selected, name


def test_every_service_is_health_checked_and_waits_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        assert svc["healthcheck"]["test"], name
        for dependency, condition in svc.get("depends_on", {}).items():
            assert dependency != "jaeger", f"{name} must start without Jaeger"
            if condition == {"condition": "service_started"}:
                # only a trtllm-grpc worker on its engine server: the worker waits for the server's HealthCheck
                # itself (--trtllm-grpc-connect-timeout), so it is up and visible while the model loads
                argv = svc["command"]
                assert flag(argv, "--engine") == "trtllm-grpc", (name, dependency)
                assert flag(argv, "--trtllm-grpc-target").split(":")[0] == dependency, (name, dependency)
                continue
            assert condition == {"condition": "service_healthy"}, (name, dependency)
    assert compose["services"]["gateway"]["depends_on"] == {"parse": {"condition": "service_healthy"}}
    assert compose["services"]["parse"]["depends_on"] == {"router": {"condition": "service_healthy"}}
    for name in ("router", "worker-1", "worker-2", "worker-gpu-1"):
        assert compose["services"][name]["depends_on"] == {"nats": {"condition": "service_healthy"}}
    assert compose["services"]["worker-grpc-1"]["depends_on"]["nats"] == {"condition": "service_healthy"}


def test_healthchecks_parse_with_the_real_cli_and_check_the_service_own_port(compose: dict[str, Any]) -> None:
    parser = build_parser()
    ports: dict[str, int] = {}
    for name, spec, argv, env in our_services(compose):
        settings = settings_of(spec, argv, env)
        ports[name] = settings.http_port if spec.name == "gateway" else settings.port
    nats_conf = (REPO / "deploy" / "nats" / "nats.conf").read_text()
    ports["nats"] = int(re.search(r"listen: [\d.]+:(\d+)", nats_conf).group(1))  # type: ignore[union-attr]
    for name, svc in compose["services"].items():
        if name in THIRD_PARTY:
            continue
        argv = healthcheck_argv(svc)
        assert argv[:2] == ["harnessmesh", "health"], name
        ns = parser.parse_args(argv[1:])  # argparse exits on an unknown flag or service
        assert usage_error(ns.service, settings_from_namespace(HealthSettings, ns)) is None, name
        kind = name.split("-")[0]
        assert ns.service == kind, name
        address = ns.url if kind in ("gateway", "nats") else f"//{ns.target}"
        assert address.endswith(f"//127.0.0.1:{ports[name]}"), (name, address)


def test_the_trtllm_server_healthcheck_connects_to_the_port_it_serves(compose: dict[str, Any]) -> None:
    server = compose["services"]["trtllm-serve-1"]
    bash, dash_c, script = server["command"]
    assert (bash, dash_c) == ("bash", "-c") and "trtllm-serve /models/model --grpc" in script
    port = int(re.search(r"--port (\d+)", script).group(1))  # type: ignore[union-attr]
    assert "--host 0.0.0.0" in script and "ports" not in server, "reached on the compose network only"
    check = healthcheck_argv(server)
    assert check[:2] == ["python3", "-c"] and f"('127.0.0.1', {port})" in check[2]
    compile(check[2], "healthcheck", "exec")  # the probe is valid Python (the image's python3 runs it)
    assert server["healthcheck"]["start_period"] == compose["services"]["worker-gpu-1"]["healthcheck"]["start_period"]
    config = yaml.safe_load((REPO / "deploy" / "trtllm" / "trtllm-serve.yaml").read_text())
    assert "./deploy/trtllm/trtllm-serve.yaml:/cfg.yaml:ro" in server["volumes"] and "/cfg.yaml" in script
    assert config["kv_cache_config"]["enable_block_reuse"] and config["kv_cache_config"]["event_buffer_max_size"] > 0
    assert config["enable_chunked_prefill"] is True and config["max_num_tokens"] == 8192
    worker = next(settings_of(spec, argv, env) for n, spec, argv, env in our_services(compose) if n == "worker-grpc-1")
    assert worker.trtllm_grpc_target == f"trtllm-serve-1:{port}"
    assert worker.block_size == config["kv_cache_config"]["tokens_per_block"]  # the wire does not carry it
    assert worker.trtllm_grpc_connect_timeout >= float(server["healthcheck"]["start_period"].rstrip("s"))


def test_every_command_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    for _name, spec, argv, env in our_services(compose):
        settings_of(spec, argv, env)  # argparse exits (SystemExit) on any unknown flag or bad value


def test_env_vars_are_real_env_twins(compose: dict[str, Any]) -> None:
    for name, spec, _argv, env in our_services(compose):
        known = {env_name(spec.name, f) for f in fields_of(spec.settings_class())}
        for key in env:
            assert key in known or key in OTEL_VARS, f"{name}: {key} is not an option of {spec.module}"


def test_addresses_point_at_real_ports(compose: dict[str, Any]) -> None:
    by_name = {name: settings_of(spec, argv, env) for name, spec, argv, env in our_services(compose)}
    router, parse, gateway = by_name["router"], by_name["parse"], by_name["gateway"]
    assert parse.router_address == f"router:{router.port}"
    assert gateway.parse_address == f"parse:{parse.port}"
    assert gateway.nats_url == parse.nats_url == "nats://nats:4222"  # the jetstream state stores' NATS
    for name, settings in by_name.items():
        if name.startswith("worker"):
            assert settings.advertise_host == name
            assert settings.worker_id == name
            assert settings.nats_url == "nats://nats:4222"
            assert settings.host == "0.0.0.0"
    assert router.nats_url == "nats://nats:4222"
    published = {p.split(":")[2] for p in compose["services"]["gateway"]["ports"]}
    assert published == {str(gateway.http_port), str(gateway.grpc_port)}


def test_env_twins_take_effect(compose: dict[str, Any]) -> None:
    for _name, spec, argv, env in our_services(compose):
        settings = settings_of(spec, argv, env)
        for f in fields_of(spec.settings_class()):
            key = env_name(spec.name, f)
            if key in env and f"--{f.name.replace('_', '-')}" not in argv:
                raw = env[key]
                value = getattr(settings, f.name)
                assert str(value).lower() == raw.lower() or float(value) == float(raw), (key, value)


def test_ports_are_published_on_loopback_unless_the_variable_says_otherwise() -> None:
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())
    published = [(name, p) for name, svc in raw["services"].items() for p in svc.get("ports", [])]
    assert published
    for name, port in published:
        assert port.startswith("${" + PUBLISH_VAR + ":-127.0.0.1}:"), (name, port)
    for address in ("127.0.0.1", "0.0.0.0"):
        compose = load(**({PUBLISH_VAR: address} if address != "127.0.0.1" else {}))
        for svc in compose["services"].values():
            assert all(p.startswith(f"{address}:") for p in svc.get("ports", []))
    services = raw["services"]
    assert "ports" not in services["nats"], "NATS stays inside the compose network"
    assert [p.rsplit(":", 1)[1] for p in services["jaeger"]["ports"]] == ["16686"], "only Jaeger's UI"


def test_one_build_per_image_and_every_harnessmesh_service_runs_it(compose: dict[str, Any]) -> None:
    builds: dict[str, int] = {}
    for svc in compose["services"].values():
        if "build" in svc:
            builds[svc["image"]] = builds.get(svc["image"], 0) + 1
    assert builds == {"harnessmesh:local": 1, "harnessmesh-trtllm:local": 1}
    for name, svc in compose["services"].items():
        if name not in THIRD_PARTY:
            assert svc["image"] in builds, name
    # The builder of each image is started whenever a user of that image is (compose builds it first).
    for profiles in ({"mocker"}, *GPU_PROFILES):
        selected = active(compose, profiles)
        for image in builds:
            users = {n for n in selected if compose["services"][n].get("image") == image}
            builders = {n for n in users if "build" in compose["services"][n]}
            assert not users or len(builders) == 1, (profiles, image)


def test_gpu_profiles_take_model_and_name_from_variables_and_run_registered_engines() -> None:
    compose = load(HARNESSMESH_MODEL_DIR="/srv/models/Qwen3-32B", HARNESSMESH_SERVED_MODEL_NAME="qwen3-32b")
    engines = set()
    for profiles in GPU_PROFILES:  # each TensorRT-LLM engine alone, its GPUs reserved once
        selected = active(compose, profiles) - active(compose, set())
        workers = [(n, spec, argv, env) for n, spec, argv, env in our_services(compose) if n in selected]
        assert workers, profiles
        for _name, spec, argv, env in workers:
            settings = settings_of(spec, argv, env)
            assert settings.engine in ENGINES and settings.engine in GPU_ENGINES and settings.model == "/models/model"
            engines.add(settings.engine)
        devices: list[str] = []
        for name in selected:
            svc = compose["services"][name]
            assert "/srv/models/Qwen3-32B:/models/model:ro" in svc["volumes"], name
            if "deploy" not in svc:
                continue
            (reservation,) = svc["deploy"]["resources"]["reservations"]["devices"]
            assert reservation["driver"] == "nvidia" and reservation["capabilities"] == ["gpu"]
            devices += reservation["device_ids"]
        assert devices and len(devices) == len(set(devices)), ("two containers reserve the same GPU", profiles)
    assert engines == set(GPU_ENGINES)
    assert "deploy" not in compose["services"]["worker-grpc-1"], "the trtllm-grpc worker needs no GPU"
    assert compose["services"]["worker-gpu-1"]["build"]["dockerfile"] == "Dockerfile.trtllm"
    release = re.search(r"nvcr\.io/nvidia/tensorrt-llm/release:\S+", (REPO / "Dockerfile.trtllm").read_text())
    assert release is not None and (REPO / "Dockerfile.trtllm").read_text().count(release.group(0)) == 1
    assert compose["services"]["trtllm-serve-1"]["image"] == release.group(0), "one TensorRT-LLM release"
    parse = next(settings_of(spec, argv, env) for n, spec, argv, env in our_services(compose) if n == "parse")
    gateway = next(settings_of(spec, argv, env) for n, spec, argv, env in our_services(compose) if n == "gateway")
    assert parse.model == "/models/model" and "/srv/models/Qwen3-32B:/models/model:ro" in compose["services"][
        "parse"]["volumes"], "parse tokenizes with the workers' model"
    assert parse.served_model_name == gateway.served_model_name == "qwen3-32b"
    assert load()["services"]["parse"]["environment"]["HARNESSMESH_SERVED_MODEL_NAME"] == "demo"


def test_jaeger_is_v2_with_its_own_healthcheck(compose: dict[str, Any]) -> None:
    jaeger = compose["services"]["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    assert jaeger["healthcheck"]["test"][1:] == ["wget", "-q", "--spider", "http://127.0.0.1:13133/status"]
    for _name, _spec, _argv, env in our_services(compose):
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"  # Jaeger 2 takes OTLP on 4317


def test_nats_requires_the_token_and_every_nats_client_gets_it(compose: dict[str, Any]) -> None:
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    variable = "${HARNESSMESH_NATS_TOKEN:?"
    assert raw["nats"]["environment"][TOKEN_VAR].startswith(variable)
    assert "./deploy/nats/nats.conf:/etc/nats/nats.conf:ro" in raw["nats"]["volumes"]
    for name, _spec, argv, _env in our_services(compose):
        if "--nats-url" in argv:
            assert raw[name]["environment"].get(TOKEN_VAR, "").startswith(variable), name
        assert not any("TOKEN" in arg.upper() for arg in argv), name  # secrets never on a command line
    with pytest.raises(LookupError, match=TOKEN_VAR):
        interpolate(raw, {})


def test_the_dockerfile_runs_unprivileged_with_one_copy_of_the_code_and_a_healthcheck() -> None:
    text = (REPO / "Dockerfile").read_text()
    run_stage = text.rsplit("\nFROM ", 1)[1]
    copies = [line for line in run_stage.splitlines() if line.startswith("COPY")]
    assert copies == ["COPY --from=build /opt/harnessmesh /opt/harnessmesh"], "the run stage gets the venv only"
    assert text.count("pip install") == 1
    user = re.search(r"^USER (\S+)", run_stage, re.M)
    assert user is not None and user.group(1).split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK .*CMD \[\"harnessmesh\", \"health\"", run_stage, re.M | re.S)
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", run_stage, re.M).group(1))  # type: ignore[union-attr]
    assert cmd[0] == "harnessmesh"
    build_parser().parse_args(cmd[1:])


# --- the real processes ---

def dockerfile_healthcheck() -> list[str]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.M)
    assert match is not None
    argv: list[str] = json.loads(match.group(1))
    return argv


def run_health(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``harnessmesh health ...`` as a container runs it (the same entry point, ``cli:main``)."""
    assert argv[0] == "harnessmesh"
    base = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
    return subprocess.run([sys.executable, "-m", "services.launcher", *argv[1:]], capture_output=True, text=True,
                          env={**base, **env}, cwd=REPO, timeout=30, check=False)


def child_address(mesh: RunningMesh, name: str) -> str:
    for line in mesh.log_path.read_text().splitlines():
        if '"mesh.child_started"' in line and f'"name": "{name}"' in line:
            return str(json.loads(line)["address"])
    raise AssertionError(f"no {name} in the launcher log")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A real mesh exporting spans to a collector that is not there (as compose's services without Jaeger)."""
    otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    args = ["--workers", "2", "--served-model-name", "demo", "--heartbeat-interval", "0.2"]
    with running_mesh(args, tmp_path_factory.mktemp("compose") / "mesh.log", env=otel) as running:
        yield running


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_every_compose_healthcheck_passes_against_the_real_mesh(compose: dict[str, Any], mesh: RunningMesh) -> None:
    workers = iter(mesh.workers)
    real = {"nats": mesh.nats, "gateway": mesh.http, "router": child_address(mesh, "router"),
            "parse": child_address(mesh, "parse")}
    checked = []
    for name, svc in compose["services"].items():
        if name == "jaeger" or not active(compose, {"mocker"}) >= {name}:
            continue
        argv = healthcheck_argv(svc)
        kind = argv[2]
        address = real[kind] if kind != "worker" else next(workers)
        option = "--url" if kind in ("gateway", "nats") else "--target"
        argv[argv.index(option) + 1] = address
        env = {k: str(v) for k, v in svc.get("environment", {}).items()}
        if TOKEN_VAR in env:
            env[TOKEN_VAR] = mesh.nats_token  # the container's token is the mesh's
        done = run_health(argv, env)
        lines = done.stdout.splitlines()
        assert done.returncode == 0 and len(lines) == 1 and ": healthy: " in lines[0], (name, done.stdout, done.stderr)
        checked.append(kind)
    assert sorted(checked) == ["gateway", "nats", "parse", "router", "worker", "worker"]
    image_check = dockerfile_healthcheck()
    image_check[image_check.index("--url") + 1] = mesh.http
    done = run_health(image_check, {})
    assert done.returncode == 0, done.stdout + done.stderr
    # The same checks fail, one line each, when the process is not there.
    for argv in (["harnessmesh", "health", "router", "--target", f"127.0.0.1:{free_port()}"],
                 ["harnessmesh", "health", "gateway", "--url", f"http://127.0.0.1:{free_port()}"]):
        done = run_health(argv, {})
        assert done.returncode == 1 and len(done.stdout.splitlines()) == 1, done.stdout
        assert "unhealthy" in done.stdout and "refused" in done.stdout.lower()


async def test_the_compose_nats_command_and_config_require_the_token_and_run_jetstream(tmp_path: Path) -> None:
    """The real nats-server with compose's command (its config file mapped back from the volume), the token
    in its environment as compose gives it; ``harnessmesh health nats`` as the healthcheck runs it. JetStream
    is on, its store on the named volume (moved to a temporary directory here)."""
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())
    nats_service = load()["services"]["nats"]
    command = list(nats_service["command"])
    assert command[0] == "nats-server"
    named = {}
    for volume in nats_service["volumes"]:
        host, container, *_mode = volume.split(":")
        if host.startswith("./"):
            command = [str(REPO / host) if arg == container else arg for arg in command]
        else:
            named[host] = container
    assert re.search(r"^jetstream \{", (REPO / "deploy" / "nats" / "nats.conf").read_text(), re.M)
    at = command.index("--store_dir") + 1
    ((volume, mount),) = named.items()
    assert volume in raw["volumes"] and command[at].startswith(mount + "/"), "the store lives on the named volume"
    store = tmp_path / "store"
    command[at] = str(store)
    port = free_port()
    token = "compose-test-token"
    server = await asyncio.create_subprocess_exec(
        find_nats_server(), *command[1:], "-a", "127.0.0.1", "-p", str(port),
        env={**os.environ, TOKEN_VAR: token}, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    argv = healthcheck_argv(nats_service)
    argv[argv.index("--url") + 1] = f"nats://127.0.0.1:{port}"
    try:
        for _ in range(100):
            done = await asyncio.to_thread(run_health, argv, {TOKEN_VAR: token})
            if done.returncode == 0:
                break
            await asyncio.sleep(0.1)
        assert done.returncode == 0, done.stdout
        for env in ({}, {TOKEN_VAR: "not-the-token"}):
            done = await asyncio.to_thread(run_health, argv, env)
            assert done.returncode == 1 and "Authorization Violation" in done.stdout, done.stdout
        nc = await nats.connect(f"nats://127.0.0.1:{port}", token=token)
        try:
            info = await nc.jetstream().account_info()  # JetStream answers: the state stores can open buckets
            assert info.limits.max_storage != 0
        finally:
            await nc.close()
        assert (store / "jetstream").is_dir()
    finally:
        await terminate([server], 5.0)


# --- a real Compose implementation ---

def docker_compose(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        print("SKIPPED: docker-compose is not installed (Debian: apt-get install --no-install-recommends "
              "docker-compose; .ci/run installs it)")
        pytest.skip("docker-compose is not installed: apt-get install --no-install-recommends docker-compose")
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run([binary, "-f", str(REPO / "compose.yaml"), *args], capture_output=True, text=True,
                          env={**base, **env}, cwd=REPO, timeout=60, check=False)


def test_docker_compose_validates_the_file_and_agrees_with_this_test(compose: dict[str, Any]) -> None:
    done = docker_compose("config", env=BASE_ENV)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)["services"]
    assert set(resolved) == set(compose["services"])
    for name, svc in compose["services"].items():
        theirs = resolved[name]
        assert theirs.get("command") == svc.get("command"), name
        assert theirs["healthcheck"]["test"] == svc["healthcheck"]["test"], name
        assert theirs.get("depends_on", {}) == svc.get("depends_on", {}), name
        assert theirs.get("image") == svc.get("image"), name
        ours_env = {k: str(v) for k, v in svc.get("environment", {}).items()}
        assert {k: str(v) for k, v in theirs.get("environment", {}).items()} == ours_env, name
        assert [p.removesuffix("/tcp") for p in theirs.get("ports", [])] == svc.get("ports", []), name
    refused = docker_compose("config", "-q", env={})
    assert refused.returncode != 0 and TOKEN_VAR in refused.stderr
