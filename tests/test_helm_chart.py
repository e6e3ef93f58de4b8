"""deploy/helm/harnessmesh cannot rot: rendered offline by Helm's own engine and checked against the real CLIs.

Rendering: ``helm-python-sdk`` (import name ``helm_python``) binds Helm v4's Go SDK through a C ABI shipped in
its wheel: the same template engine, values coalescing and subchart handling as ``helm template``, with no
``helm`` binary and no cluster (``lookup`` answers empty, as in ``helm template``). Every manifest is then
validated with ``kubernetes-validate`` against the Kubernetes OpenAPI schema of the oldest version the chart
supports and the newest the package knows, strict (unknown fields fail). Every container of ours is parsed
by its service's real settings parser (argv plus the env the pod gives it, as the kubelet expands it); every
probe by the real ``harnessmesh health`` parser; the NATS config by the real ``nats-server``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import nats
import pytest
import yaml

from services.common.settings import env_name, fields_of, parse_settings, settings_from_namespace
from services.common.tracing import sampler_from_env
from services.launcher import health_cmd
from services.launcher.cli import build_parser
from services.launcher.nats_server import find_nats_server
from services.launcher.specs import ALL_SERVICES, ServiceSpec
from services.launcher.supervisor import free_port, terminate

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "harnessmesh"
RELEASE, NAMESPACE = "hm", "mesh"
KUBE_VERSIONS = ("1.29.0", "1.37.0")  # Chart.yaml's kubeVersion floor, and the newest schema kubernetes-validate has
SPECS = {spec.module: spec for spec in ALL_SERVICES}
OTEL_VARS = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
             "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}
SECRET_PLACEHOLDER = "from-secret:{name}/{key}"
# A third set beside the two the issue names: every optional branch of the templates on at once.
OPTIONS_VALUES: dict[str, Any] = {
    "global": {"harnessmesh": {"existingSecret": "mesh-secrets"}},
    "tls": {"enabled": True, "secretName": "mesh-tls"},
    "nats": {"enabled": False},
    "externalNats": {"url": "nats://nats.infra.svc.cluster.local:4222"},
    "jaeger": {"enabled": False},
    "tracing": {"otlpEndpoint": "http://otel-collector.observability:4317", "samplerArg": "0.1"},
    "gateway": {"replicas": 3, "service": {"type": "LoadBalancer", "sessionAffinity": "ClientIP"},
                "extraArgs": ["--max-concurrent-requests", "128"]},
    "parse": {"replicas": 2},
    "router": {"replicas": 3, "extraArgs": ["--worker-timeout", "10"]},
    "worker": {"replicas": 4, "extraArgs": ["--speedup", "10"]},
}


def load_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / name).read_text())
    return values


def render(values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return rendered


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


VARIANTS = {"default": {}, "gpu": load_values("values-gpu.yaml"), "options": OPTIONS_VALUES}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    name: str = request.param
    return name, VARIANTS[name], manifests(render(VARIANTS[name]))


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return manifests(render({}))


@pytest.fixture(scope="module")
def gpu_docs() -> list[dict[str, Any]]:
    return manifests(render(VARIANTS["gpu"]))


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from (d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))


def ours(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any], ServiceSpec]]:
    """(workload, container, spec) for every container that runs a harnessmesh process."""
    for workload in workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            command = container.get("command", [])
            if command[:2] == ["python", "-m"]:
                yield workload, container, SPECS[command[2]]


def pod_env(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives the container of the workload's first pod: ``$(VAR)`` expanded from
    earlier variables, field references resolved, secret references as a placeholder naming secret and key."""
    pod_name = workload["metadata"]["name"] + ("-0" if workload["kind"] == "StatefulSet" else "-5d8f7-abcde")
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                       lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = SECRET_PLACEHOLDER.format(name=ref["name"], key=ref["key"])
        else:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", item
            env[item["name"]] = pod_name
    return env


def settings_of(workload: dict[str, Any], container: dict[str, Any], spec: ServiceSpec) -> Any:
    return parse_settings(spec.settings_class(), spec.name, container.get("args", []),
                          environ=pod_env(workload, container))


def component(docs: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any], Any]:
    for workload, container, spec in ours(docs):
        if spec.name == name:
            return workload, container, settings_of(workload, container, spec)
    raise AssertionError(f"no {name} rendered")


def fullname(name: str) -> str:
    return f"{RELEASE}-harnessmesh-{name}"


def fqdn(host: str) -> str:
    return f"{host}.{NAMESPACE}.svc.cluster.local"


def port_named(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


# --- the chart renders, lints and validates -------------------------------------------------------------------

def test_chart_lints_clean_with_helm() -> None:
    for values in VARIANTS.values():
        report = helm.lint(CHART, values, strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], report


def test_every_manifest_validates_against_the_kubernetes_schema(variant: Any) -> None:
    _name, _values, docs = variant
    assert len(docs) >= 12
    for doc in docs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail(default_docs: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(find(default_docs, "Deployment", fullname("gateway")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)


def test_every_component_is_rendered(variant: Any) -> None:
    name, values, docs = variant
    merged = render_values(values)
    assert find(docs, "Deployment", fullname("gateway"))["spec"]["replicas"] == merged["gateway"]["replicas"]
    assert find(docs, "Deployment", fullname("parse"))["spec"]["replicas"] == merged["parse"]["replicas"]
    assert find(docs, "StatefulSet", fullname("router"))["spec"]["replicas"] == merged["router"]["replicas"]
    assert find(docs, "StatefulSet", fullname("worker"))["spec"]["replicas"] == merged["worker"]["replicas"]
    for part in ("gateway", "parse", "router", "worker"):
        find(docs, "Service", fullname(part))
        find(docs, "PodDisruptionBudget", fullname(part))
    gateway_ports = {p["name"]: p["port"] for p in find(docs, "Service", fullname("gateway"))["spec"]["ports"]}
    assert set(gateway_ports) == {"http", "grpc"}
    if name == "options":
        assert not [d for d in docs if d["kind"] == "Secret"], "an existing Secret is used, none is made"
        assert not [d for d in docs if d["metadata"]["name"].endswith("jaeger")]
        assert not [d for d in docs if "nats" in d["metadata"]["name"]]
    else:
        find(docs, "StatefulSet", f"{RELEASE}-nats")
        find(docs, "Deployment", fullname("jaeger"))


def render_values(values: dict[str, Any]) -> dict[str, Any]:
    with helm.Chart.load(CHART) as chart:
        merged: dict[str, Any] = chart.merge_values(values)
    return merged


# --- every process's flags and env as the real CLIs read them -------------------------------------------------

def test_every_container_parses_with_the_real_cli(variant: Any) -> None:
    _name, _values, docs = variant
    seen = set()
    for workload, container, spec in ours(docs):
        settings_of(workload, container, spec)  # argparse exits (SystemExit) on an unknown flag or a bad value
        seen.add(spec.name)
    assert seen == {"gateway", "parse", "router", "worker"}


def test_every_env_var_is_one_the_services_read(variant: Any) -> None:
    _name, _values, docs = variant
    for workload, container, spec in ours(docs):
        env = pod_env(workload, container)
        known = {env_name(spec.name, f) for f in fields_of(spec.settings_class())}
        for key in env:
            assert key in known or key in OTEL_VARS, f"{spec.name}: {key} is read by no option of {spec.module}"
        sampler_from_env(env)  # the tracing module's own parser: raises on a sampler or ratio it does not take


def test_env_twins_take_effect(variant: Any) -> None:
    """An option given only through the environment reaches the settings (no flag silently wins over it)."""
    _name, _values, docs = variant
    for workload, container, spec in ours(docs):
        settings = settings_of(workload, container, spec)
        env = pod_env(workload, container)
        for f in fields_of(spec.settings_class()):
            key = env_name(spec.name, f)
            if key in env and "--" + f.name.replace("_", "-") not in container.get("args", []):
                value = getattr(settings, f.name)
                shown = ",".join(value) if isinstance(value, list) else str(value)
                assert shown.lower() == env[key].lower(), (spec.name, key, value)


def test_secrets_come_from_secrets_never_a_command_line(variant: Any) -> None:
    name, _values, docs = variant
    secret_name = "mesh-secrets" if name == "options" else fullname("secrets")
    secret_values: list[str] = []
    if name != "options":
        secret = find(docs, "Secret", secret_name)
        assert {"nats-token", "thinking-signature-key"} <= set(secret["data"])
        secret_values = [base64.b64decode(v).decode() for v in secret["data"].values()]
        assert all(len(v) >= 32 for v in secret_values)
    for _workload, container, spec in ours(docs):
        args = container.get("args", [])
        assert not any(v in arg for v in secret_values for arg in args)
        env_items = {item["name"]: item for item in container.get("env", [])}
        for f in fields_of(spec.settings_class()):
            if not f.metadata.get("secret"):
                continue
            assert "--" + f.name.replace("_", "-") not in args, f"{spec.name}: a secret on the command line"
            item = env_items.get(env_name(spec.name, f))
            if item is None:
                continue
            assert "value" not in item, f"{spec.name}: {item['name']} is a literal, not a secretKeyRef"
            assert item["valueFrom"]["secretKeyRef"]["name"] == secret_name
    settings = {spec.name: settings_of(w, c, spec) for w, c, spec in ours(docs)}
    token = SECRET_PLACEHOLDER.format(name=secret_name, key="nats-token")
    assert settings["router"].nats_token == token and settings["worker"].nats_token == token
    assert settings["gateway"].nats_token == settings["parse"].nats_token == token  # the state stores' NATS
    assert settings["gateway"].thinking_signature_key == SECRET_PLACEHOLDER.format(
        name=secret_name, key="thinking-signature-key")


def test_secrets_given_in_values_are_used_and_api_keys_reach_the_gateway() -> None:
    docs = manifests(render({"secrets": {"natsToken": "t" * 40, "apiKeys": ["key-a", "key-b"]}}))
    data = find(docs, "Secret", fullname("secrets"))["data"]
    assert base64.b64decode(data["nats-token"]).decode() == "t" * 40
    assert base64.b64decode(data["api-keys"]).decode() == "key-a,key-b"
    _w, container, _s = component(docs, "gateway")
    (item,) = [e for e in container["env"] if e["name"] == "HARNESSMESH_GATEWAY_API_KEY"]
    assert item["valueFrom"]["secretKeyRef"] == {"name": fullname("secrets"), "key": "api-keys", "optional": True}


# --- the processes find each other -----------------------------------------------------------------------------

def test_addresses_point_at_real_services_and_ports(variant: Any) -> None:
    name, values, docs = variant
    merged = render_values(values)
    _gw, gateway_container, gateway = component(docs, "gateway")
    _parse_workload, parse_container, parse = component(docs, "parse")
    router_workload, router_container, router = component(docs, "router")
    worker_workload, worker_container, worker = component(docs, "worker")

    assert gateway.host == parse.host == router.host == worker.host == "0.0.0.0"
    assert gateway.http_port == port_named(gateway_container, "http")
    assert gateway.grpc_port == port_named(gateway_container, "grpc")
    parse_service = find(docs, "Service", fullname("parse"))
    (parse_port,) = parse_service["spec"]["ports"]
    assert gateway.parse_address == f"{fullname('parse')}:{parse_port['port']}"
    assert parse_port["targetPort"] == "grpc" and port_named(parse_container, "grpc") == parse.port

    # parse dials every router replica by its pod name under the routers' headless Service
    router_service = find(docs, "Service", fullname("router"))
    assert router_service["spec"]["clusterIP"] == "None"
    assert router_workload["spec"]["serviceName"] == fullname("router")
    routers = fullname("router")
    assert parse.router_addresses() == [
        f"{fqdn(f'{routers}-{i}.{routers}')}:{router.port}" for i in range(merged["router"]["replicas"])]
    assert port_named(router_container, "grpc") == router.port

    # each worker announces its own pod name as id and its pod DNS name as the address the router dials
    worker_service = find(docs, "Service", fullname("worker"))
    assert worker_service["spec"]["clusterIP"] == "None" and worker_service["spec"]["publishNotReadyAddresses"]
    assert worker_workload["spec"]["serviceName"] == fullname("worker")
    workers = fullname("worker")
    assert worker.worker_id == f"{workers}-0"
    assert worker.advertise_host == fqdn(f"{workers}-0.{workers}")
    assert port_named(worker_container, "grpc") == worker.port

    if name == "options":
        assert router.nats_url == worker.nats_url == OPTIONS_VALUES["externalNats"]["url"]
    else:
        nats_name = f"{RELEASE}-nats"
        nats_service = find(docs, "Service", nats_name)
        (nats_port,) = [p["port"] for p in nats_service["spec"]["ports"] if p["name"] == "nats"]
        assert router.nats_url == worker.nats_url == f"nats://{fqdn(nats_name)}:{nats_port}"
    assert gateway.nats_url == parse.nats_url == router.nats_url  # the JetStream state stores (docs/state.md)


def test_services_and_budgets_select_their_pods(variant: Any) -> None:
    _name, _values, docs = variant
    pods = {w["metadata"]["name"]: w["spec"]["template"] for w in workloads(docs)}

    def selected(selector: dict[str, str]) -> list[str]:
        return [name for name, tpl in pods.items() if selector.items() <= tpl["metadata"]["labels"].items()]

    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["labels"].get("app.kubernetes.io/name") == "harnessmesh":
            (target,) = selected(doc["spec"]["selector"])
            container_ports = {p["name"] for c in pods[target]["spec"]["containers"] for p in c["ports"]}
            assert {p["targetPort"] for p in doc["spec"]["ports"]} <= container_ports, doc["metadata"]["name"]
        if doc["kind"] == "PodDisruptionBudget":
            (target,) = selected(doc["spec"]["selector"]["matchLabels"])
            assert target == doc["metadata"]["name"]
        if doc["kind"] == "StatefulSet":
            assert selected(doc["spec"]["selector"]["matchLabels"]) == [doc["metadata"]["name"]]


# --- probes, tracing, NATS ----------------------------------------------------------------------------------------

def health_settings(command: list[str]) -> tuple[str, health_cmd.HealthSettings]:
    assert command[:2] == ["harnessmesh", "health"], command
    ns = build_parser("health").parse_args(command[1:])
    settings = settings_from_namespace(health_cmd.HealthSettings, ns)
    assert health_cmd.usage_error(ns.service, settings) is None, command
    return ns.service, settings


def test_probes_run_the_health_subcommand_of_their_own_process(variant: Any) -> None:
    name, _values, docs = variant
    for workload, container, spec in ours(docs):
        settings = settings_of(workload, container, spec)
        probes = {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
        service, health = health_settings(probes["readinessProbe"]["exec"]["command"])
        assert service == spec.name
        if spec.name == "gateway":
            assert health.url == f"http://127.0.0.1:{settings.http_port}"
            # liveness and start-up ask the process alone: a gateway must not restart while workers load
            for kind in ("startupProbe", "livenessProbe"):
                assert probes[kind]["httpGet"] == {"path": "/health", "port": "http"}
        else:
            assert health.target == f"127.0.0.1:{settings.port}"
        if spec.name == "parse":
            for kind in ("startupProbe", "livenessProbe"):
                local = probes[kind].get("grpc") or probes[kind].get("tcpSocket")
                assert local in ({"port": settings.port}, {"port": "grpc"}), probes[kind]
                assert ("tcpSocket" in probes[kind]) == (name == "options")  # the kubelet speaks no mutual TLS
        if spec.name in ("router", "worker"):  # their checks are local (ListWorkers may list none, Info is its own)
            for kind in ("startupProbe", "livenessProbe"):
                assert health_settings(probes[kind]["exec"]["command"]) == (service, health)
            assert health.min_workers == 0


def test_spans_go_to_jaeger_over_otlp(variant: Any) -> None:
    name, _values, docs = variant
    for workload, container, spec in ours(docs):
        env = pod_env(workload, container)
        assert env["OTEL_SERVICE_NAME"] == f"harnessmesh-{spec.name}"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
        if name == "options":
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == OPTIONS_VALUES["tracing"]["otlpEndpoint"]
            continue
        jaeger = find(docs, "Service", fullname("jaeger"))
        (otlp,) = [p["port"] for p in jaeger["spec"]["ports"] if p["name"] == "otlp-grpc"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{fullname('jaeger')}:{otlp}"
    if name != "options":
        (container,) = find(docs, "Deployment", fullname("jaeger"))["spec"]["template"]["spec"]["containers"]
        repository, tag = container["image"].split(":")
        assert repository == "jaegertracing/jaeger" and tag.startswith("2.")
        assert {p["containerPort"] for p in container["ports"]} == {4317, 4318, 16686}


def test_nats_runs_jetstream_clustered_and_takes_the_token_from_the_secret(default_docs: list[dict[str, Any]]) -> None:
    nats_set = find(default_docs, "StatefulSet", f"{RELEASE}-nats")
    assert nats_set["spec"]["replicas"] == 3
    (server,) = [c for c in nats_set["spec"]["template"]["spec"]["containers"] if c["name"] == "nats"]
    (token,) = [e for e in server["env"] if e["name"] == "HARNESSMESH_NATS_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": fullname("secrets"), "key": "nats-token"}
    conf = find(default_docs, "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"]
    assert re.search(r'"authorization":\s*\{\s*"token":\s*\$HARNESSMESH_NATS_TOKEN\s*}', conf)
    assert '"jetstream"' in conf and '"store_dir": "/data"' in conf
    assert nats_set["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"


@pytest.fixture(scope="module")
def nats_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = manifests(render({}))
    path = tmp_path_factory.mktemp("nats") / "nats.conf"
    path.write_text(find(docs, "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"])
    return path


def test_the_real_nats_server_accepts_the_rendered_config_only_with_the_token(nats_conf: Path) -> None:
    base = {**os.environ, "SERVER_NAME": f"{RELEASE}-nats-0"}
    base.pop("HARNESSMESH_NATS_TOKEN", None)
    command = [find_nats_server(), "-t", "-c", str(nats_conf)]
    ok = subprocess.run(command, env={**base, "HARNESSMESH_NATS_TOKEN": "x" * 48}, capture_output=True,
                        text=True, timeout=20)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(command, env=base, capture_output=True, text=True, timeout=20)
    assert missing.returncode != 0 and "HARNESSMESH_NATS_TOKEN" in missing.stderr


async def test_the_rendered_nats_config_refuses_clients_without_the_token(tmp_path: Path) -> None:
    """The real nats-server on the chart's config for one node (cluster off: no routes to resolve), on
    loopback (flags override the listen addresses and pid file; the JetStream store moves to a temporary dir)."""
    docs = manifests(render({"nats": {"config": {"cluster": {"enabled": False}}}}))
    conf = find(docs, "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"]
    assert '"store_dir": "/data"' in conf and '"routes"' not in conf
    path = tmp_path / "nats.conf"
    path.write_text(conf.replace('"store_dir": "/data"', f'"store_dir": "{tmp_path / "js"}"'))
    port, token = free_port(), "helm-test-token"
    server = await asyncio.create_subprocess_exec(
        find_nats_server(), "-c", str(path), "-a", "127.0.0.1", "-p", str(port), "-m", "0",
        "-P", str(tmp_path / "nats.pid"),
        env={**os.environ, "HARNESSMESH_NATS_TOKEN": token, "SERVER_NAME": f"{RELEASE}-nats-0"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                nc = await nats.connect(url, token=token, connect_timeout=1, allow_reconnect=False)
                break
            except Exception:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("nats-server did not start with the chart's config")
        await nc.flush(timeout=2)
        await nc.close()
        for wrong in (None, "not-the-token"):
            with pytest.raises(Exception):  # noqa: B017 - nats-py raises several kinds for a refused connect
                await nats.connect(url, token=wrong, connect_timeout=1, allow_reconnect=False,
                                   max_reconnect_attempts=0)
    finally:
        await terminate([server], 5.0)


# --- state shared by replicas (docs/state.md) ---------------------------------------------------------------------

def test_state_is_in_jetstream_by_default_with_a_copy_per_nats_node(variant: Any) -> None:
    name, values, docs = variant
    merged = render_values(values)
    state = merged["state"]
    _gw, _gc, gateway = component(docs, "gateway")
    _pw, _pc, parse = component(docs, "parse")
    assert (gateway.responses_store, gateway.turn_links_store, parse.prefix_watch_store) == ("jetstream",) * 3
    # every copy of a bucket on its own NATS node: the chart's 3-node cluster, one external server
    replicas = merged["nats"]["config"]["cluster"]["replicas"] if name != "options" else 1
    assert gateway.responses_store_replicas == gateway.turn_links_replicas == parse.prefix_watch_replicas == replicas
    _ww, _wc, worker = component(docs, "worker")  # the worker registry bucket, read by every starting router
    assert (worker.registry_store, worker.registry_replicas) == ("jetstream", replicas)
    assert (gateway.responses_store_ttl, gateway.responses_store_max_bytes) == (
        state["responses"]["ttl"], state["responses"]["maxBytes"])
    assert (gateway.turn_links_ttl, gateway.turn_links_max_bytes) == (
        state["turnLinks"]["ttl"], state["turnLinks"]["maxBytes"])
    assert (parse.prefix_watch_ttl, parse.prefix_watch_max_bytes) == (
        state["prefixWatch"]["ttl"], state["prefixWatch"]["maxBytes"])
    gateway.validate()
    parse.validate()
    if name != "options":  # the chart's NATS runs JetStream with room for every bucket's cap on each node
        conf = find(docs, "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"]
        assert '"jetstream"' in conf
        caps = sum(state[kind]["maxBytes"] for kind in ("responses", "turnLinks", "prefixWatch"))
        size = merged["nats"]["config"]["jetstream"]["fileStore"]["pvc"]["size"]
        assert size.endswith("Gi") and caps < int(size[:-2]) << 30


def test_state_in_memory_gives_gateway_and_parse_no_nats() -> None:
    docs = manifests(render({"state": {"store": "memory"}, "gateway": {"service": {"sessionAffinity": "ClientIP"}}}))
    for part in ("gateway", "parse"):
        _w, container, _settings = component(docs, part)
        assert "--nats-url" not in container["args"] and "HARNESSMESH_NATS_TOKEN" not in pod_env(_w, container)
    _gw, _gc, gateway = component(docs, "gateway")
    _pw, _pc, parse = component(docs, "parse")
    assert (gateway.responses_store, gateway.turn_links_store, parse.prefix_watch_store) == ("memory",) * 3
    assert find(docs, "Service", fullname("gateway"))["spec"]["sessionAffinity"] == "ClientIP"
    _g, _c, explicit = component(manifests(render({"state": {"bucketReplicas": 2}})), "gateway")
    assert explicit.responses_store_replicas == explicit.turn_links_replicas == 2
    with pytest.raises(Exception, match=r"state\.store must be jetstream or memory"):
        render({"state": {"store": "redis"}})


# --- default (CPU) and GPU values ---------------------------------------------------------------------------------

def test_default_values_run_mocker_workers_on_cpu(default_docs: list[dict[str, Any]]) -> None:
    workload, container, worker = component(default_docs, "worker")
    assert worker.engine == "mocker" and worker.model == ""
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["image"] == "harnessmesh:0.1.0"
    assert workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > worker.drain_grace
    _w, _c, parse = component(default_docs, "parse")
    assert parse.reasoning_parser == "qwen3" and parse.tool_parser == "hermes"


def test_gpu_values_run_tensorrt_llm_workers_as_docs_gpu_md_says(gpu_docs: list[dict[str, Any]]) -> None:
    workload, container, worker = component(gpu_docs, "worker")
    pod = workload["spec"]["template"]["spec"]
    assert worker.engine == "trtllm"
    assert worker.block_size == 32  # TensorRT-LLM's tokens_per_block; the router compares equal sizes only
    assert worker.max_num_batched_tokens > 0  # the step budget: chunked prefill is always on with trtllm
    assert container["resources"]["limits"]["nvidia.com/gpu"] == worker.tensor_parallel_size
    assert pod["terminationGracePeriodSeconds"] > worker.drain_grace
    # the image: Dockerfile.trtllm's build, tagged with the TensorRT-LLM release docs/gpu.md and the Dockerfile pin
    release = re.search(r"nvcr\.io/nvidia/tensorrt-llm/release:(\S+)", (REPO / "Dockerfile.trtllm").read_text())
    assert release is not None
    assert f"release:{release.group(1)}" in (REPO / "docs" / "gpu.md").read_text()
    repository, tag = container["image"].split(":")
    assert repository == "harnessmesh-trtllm" and tag.endswith(f"trtllm{release.group(1)}")
    # the model directory: mounted read-only where --model points, in the workers and in parse (same tokenizer)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["model"]["mountPath"] == worker.model and mounts["model"]["readOnly"]
    assert mounts["shm"]["mountPath"] == "/dev/shm"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    parse_workload, parse_container, parse = component(gpu_docs, "parse")
    assert parse.model == worker.model
    parse_volumes = {v["name"]: v for v in parse_workload["spec"]["template"]["spec"]["volumes"]}
    assert parse_volumes["model"] == volumes["model"]
    assert {m["name"] for m in parse_container["volumeMounts"]} == {"model"}
    # a GPU worker loads for minutes: its start-up probe allows that before liveness applies
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60


# --- docs/deploy.md says what the chart does --------------------------------------------------------------------

def test_docs_deploy_md_matches_the_chart(default_docs: list[dict[str, Any]]) -> None:
    doc = (REPO / "docs" / "deploy.md").read_text()
    rows = {row.split("|")[1].strip(): [cell.strip() for cell in row.split("|")[1:-1]]
            for row in doc.split("## What runs", 1)[1].split("\n\n")[1].splitlines()[2:]}
    kinds = {"gateway": ("Deployment", fullname("gateway")), "parse": ("Deployment", fullname("parse")),
             "router": ("StatefulSet", fullname("router")), "worker": ("StatefulSet", fullname("worker")),
             "NATS": ("StatefulSet", f"{RELEASE}-nats"), "Jaeger": ("Deployment", fullname("jaeger"))}
    for row, (kind, name) in kinds.items():
        replicas = rows[row][3].split()[0]
        assert int(replicas) == find(default_docs, kind, name)["spec"]["replicas"], row
        assert rows[row][1].startswith(kind), row
    probes = doc.split("## Probes", 1)[1].split("\n\n")[1]
    for _workload, container, _spec in ours(default_docs):
        readiness = " ".join(container["readinessProbe"]["exec"]["command"])
        assert f"`{readiness}`" in probes, readiness
    gpu_tag = load_values("values.yaml")["gpuImage"]["tag"]
    assert f"harnessmesh-trtllm:{gpu_tag}" in doc
