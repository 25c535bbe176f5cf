"""Deploy assets (Kubernetes, Prometheus, Grafana) agree with the gateway and with each other.

The assets repeat names the gateway defines: its flags, ports and health paths, the routing
file format, the settings file, metric names and labels. Each test reads the value from the
gateway's own code and checks the asset against it, so a rename on either side fails here
instead of as an empty dashboard or an alert that can never fire. Prometheus' own tools
(`promtool`, and a real `prometheus` for the scrape configuration) judge the Prometheus files.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import pytest
import yaml

from serving import cli as serving_cli
from serving import routing_cli
from serving.config import GatewayConfig, load_config
from serving.metrics import ROUTES, GatewayMetrics
from serving.routing import parse_routing
from serving.routing_store import RoutingStore
from tests.support.ports import free_port
from tests.support.prometheus import binary
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "ops" / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "rules"
RULE_FILES = (RULES / "recording.yml", RULES / "alerts.yml")
DASHBOARD = DEPLOY / "grafana" / "slipway-gateway.json"

# Labels a series gains from being scraped (target labels of ../prometheus/prometheus.yml).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "component"})
# Seconds the gateway needs after its drain: closing the listeners (serving.server's
# CLOSE_GRACE_S, 1 s) and unloading models, before the kubelet's SIGKILL.
SHUTDOWN_MARGIN_S = 5
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)


# --------------------------------------------------------------------------- loading


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def kustomize_objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in yaml_documents(KUBERNETES / name)]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize_objects()


@pytest.fixture(scope="module")
def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment", "slipway-gateway")


@pytest.fixture(scope="module")
def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (gateway,) = [c for c in pod_spec["containers"] if c["name"] == "gateway"]
    return gateway


@pytest.fixture(scope="module")
def serve_args(container: dict[str, Any]) -> argparse.Namespace:
    """The container's command line, parsed by ``slipway serve``'s own argument parser."""
    parser = argparse.ArgumentParser(prog="slipway")
    serving_cli.register(parser.add_subparsers(dest="command", required=True))
    program, *arguments = container["command"]
    assert program == "slipway"
    return parser.parse_args(arguments)


@pytest.fixture
def settings(
    objects: list[dict[str, Any]],
    pod_spec: dict[str, Any],
    serve_args: argparse.Namespace,
    tmp_path: Path,
) -> GatewayConfig:
    """The gateway.yaml the container's --config names, loaded as the gateway loads it."""
    configmap, key = mounted_configmap_file(objects, pod_spec, PurePosixPath(serve_args.config))
    path = tmp_path / key
    path.write_text(find(objects, "ConfigMap", configmap)["data"][key])
    return load_config(path)


def volume_of(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == name]
    return volume


def mounted_configmap_file(
    objects: list[dict[str, Any]], pod_spec: dict[str, Any], path: PurePosixPath
) -> tuple[str, str]:
    """The ConfigMap and key that appear at ``path`` inside the gateway container."""
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "gateway"]
    for mount in container["volumeMounts"]:
        if PurePosixPath(mount["mountPath"]) == path.parent:
            source = volume_of(pod_spec, mount["name"])
            assert "configMap" in source, f"{path} is not in a ConfigMap volume"
            configmap = find(objects, "ConfigMap", source["configMap"]["name"])
            assert path.name in configmap["data"], (
                f"{configmap['metadata']['name']} has no {path.name}"
            )
            return configmap["metadata"]["name"], path.name
    raise AssertionError(f"nothing is mounted at {path.parent}")


# --------------------------------------------------------------------------- metric names


@dataclass(frozen=True)
class Catalogue:
    """Series names Prometheus may hold, each with its label names (None: not known)."""

    labels: dict[str, frozenset[str] | None]

    def __contains__(self, name: str) -> bool:
        return name in self.labels


def gateway_catalogue() -> Catalogue:
    """Every series name the gateway's registry exposes, with the labels it carries.

    Names come from the registry's metric families (a counter ``x`` is scraped as
    ``x_total``, a histogram as ``x_bucket``/``x_count``/``x_sum``). Label names come from
    samples, so the gateway's public helpers are called once each to create them.
    """
    metrics = GatewayMetrics()
    metrics.observe_request("m", 1, "stable", "OK", "grpc", 0.01)
    metrics.observe_batch("m", 1, "stable", 3, 4, [0.001], 0.002)
    metrics.set_queue_depth("m", 1, 0)
    with metrics.track_in_flight("m", 1):
        pass
    metrics.set_model_loaded("m", 1, True)
    metrics.observe_model_load("m", 1, 1.5)
    metrics.observe_shadow("m", 2, "OK", agreement=1.0, abs_diff=0.0)
    metrics.observe_failover("m", 2, 1)
    RoutingStore(registry=metrics.registry)  # the gateway's routing gauges
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
    }
    labels: dict[str, frozenset[str] | None] = {}
    for family in metrics.registry.collect():
        for suffix in suffixes[family.type]:
            labels[family.name + suffix] = None
        for sample in family.samples:
            labels[sample.name] = frozenset(sample.labels)
    return Catalogue(labels)


def controller_catalogue() -> Catalogue:
    """The rollout controller's metrics, as alerts.yml documents them in its header."""
    header = RULE_FILES[1].read_text(encoding="utf-8").split("\ngroups:")[0]
    documented = re.findall(r"^#\s+(slipway_rollout_\w+)\{([\w,]+)\}", header, re.MULTILINE)
    return Catalogue({name: frozenset(labels.split(",")) for name, labels in documented})


def rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def recorded_catalogue(gateway: Catalogue) -> Catalogue:
    """Recording rule outputs with their labels: a rule keeps its ``by (...)`` labels, or,
    when it only combines recorded series, theirs."""
    labels: dict[str, frozenset[str] | None] = {}
    for rule in rules(RULE_FILES[0]):
        expr = rule["expr"]
        groupings = re.findall(r"\bby\s*\(([^)]*)\)", expr)
        if groupings:
            kept = {label.strip() for group in groupings for label in group.split(",")}
            labels[rule["record"]] = frozenset(kept - {"le"})
        else:
            used = [labels[ref.name] for ref in references(expr) if ref.name in labels]
            assert used, f"cannot tell which labels {rule['record']} keeps"
            labels[rule["record"]] = frozenset().union(*used)
    return Catalogue(labels)


# --------------------------------------------------------------------------- PromQL references


@dataclass(frozen=True)
class Reference:
    """A series name used in a PromQL expression, and the label matchers put on it."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()


_STRING = r'"(?:[^"\\]|\\.)*"'
_SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)?\s*\{((?:[^{}\"]|" + _STRING + r")*)\}")
_MATCHER = re.compile(r"(\w+)\s*(=~|!~|!=|=)\s*(" + _STRING + ")")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def references(expr: str) -> list[Reference]:
    """Series names in a PromQL expression, without a full parser.

    Selectors with braces are read first (with their matchers), then strings, ranges,
    braces and grouping clauses are removed; what remains that is neither a keyword nor
    followed by ``(`` (a function or aggregation) is a bare series name.
    """
    found: list[Reference] = []
    for name, body in _SELECTOR.findall(expr):
        matchers = tuple(
            (label, op, json.loads(value)) for label, op, value in _MATCHER.findall(body)
        )
        if name:
            found.append(Reference(name, matchers))
    rest = _SELECTOR.sub(" ", expr)
    rest = re.sub(_STRING, " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = _GROUPING.sub(" ", rest)
    found += [
        Reference(name) for name in _IDENTIFIER.findall(rest) if name.lower() not in PROMQL_KEYWORDS
    ]
    return found


def check_reference(ref: Reference, known: list[Catalogue], where: str) -> list[str]:
    """Problems with one reference: unknown name, unknown label, impossible route or code."""
    catalogue = next((c for c in known if ref.name in c), None)
    if catalogue is None:
        return [f"{where}: unknown series {ref.name}"]
    problems = []
    labels = catalogue.labels[ref.name]
    for label, op, value in ref.matchers:
        if labels is not None and label not in labels | TARGET_LABELS:
            problems.append(f"{where}: {ref.name} has no label {label!r}")
        if label in ("route", "code"):
            allowed = set(ROUTES) if label == "route" else set(grpc.StatusCode.__members__)
            values = value.split("|") if op in ("=~", "!~") else [value]
            problems += [
                f"{where}: {label}={v!r} is never exported" for v in values if v not in allowed
            ]
    return problems


def dashboard_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and annotation query of the dashboard."""
    found = [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    found += [
        (f"annotation {a['name']!r}", a["expr"])
        for a in dashboard["annotations"]["list"]
        if "expr" in a
    ]
    return found


def as_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables filled in, as Prometheus would get it."""
    return (
        expr.replace("$__rate_interval", "5m").replace("$__range", "3h").replace("$model", "digits")
    )


@pytest.fixture(scope="module")
def catalogues() -> dict[str, Catalogue]:
    gateway = gateway_catalogue()
    return {
        "gateway": gateway,
        "controller": controller_catalogue(),
        "recorded": recorded_catalogue(gateway),
    }


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- promtool


def run_promtool(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def kubernetes_sd_supported(tmp_path: Path) -> bool:
    """Debian builds Prometheus without Kubernetes service discovery; upstream has it."""
    probe = tmp_path / "probe.yml"
    probe.write_text("scrape_configs:\n  - job_name: p\n    kubernetes_sd_configs: [{role: pod}]\n")
    result = run_promtool("check", "config", probe)
    return "kubernetes_sd_configs not found" not in result.stdout + result.stderr


def prometheus_config_without_kubernetes(
    pods: list[dict[str, str]], *, interval: str | None = None
) -> dict[str, Any]:
    """prometheus.yml with the Kubernetes pod discovery replaced by the pods given.

    Each pod is a set of ``__meta_kubernetes_pod_*`` labels such as discovery would
    produce, so the job's relabeling rules run unchanged on them. Rule files become
    absolute paths; ``interval`` shortens scrapes and rule evaluations.
    """
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    config["rule_files"] = [str(PROMETHEUS / path) for path in config["rule_files"]]
    for job in config["scrape_configs"]:
        if "kubernetes_sd_configs" in job:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{"targets": ["discovered:1"], "labels": pod} for pod in pods]
    if interval is not None:
        config["global"].update(
            scrape_interval=interval, scrape_timeout=interval, evaluation_interval=interval
        )
    return config


def discovered_gateway_pod(
    deployment: dict[str, Any], ip: str, **overrides: str
) -> list[dict[str, str]]:
    """The targets Kubernetes pod discovery makes of a running pod of the Deployment: one
    per container port, with the meta labels the relabeling reads (namespace, name, IP,
    phase, port, annotations and labels); ``overrides`` replaces some of them."""

    def sanitize(name: str) -> str:
        return re.sub(r"[^A-Za-z0-9_]", "_", name)

    metadata = deployment["spec"]["template"]["metadata"]
    pod = {
        "__meta_kubernetes_namespace": "serving",
        "__meta_kubernetes_pod_name": f"{deployment['metadata']['name']}-7d9f-x2x4q",
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in metadata.get("annotations", {}).items():
        pod[f"__meta_kubernetes_pod_annotation_{sanitize(key)}"] = value
    for key, value in metadata.get("labels", {}).items():
        pod[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
    pod.update(overrides)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [
        {
            **pod,
            "__meta_kubernetes_pod_container_name": container["name"],
            "__meta_kubernetes_pod_container_port_name": port["name"],
            "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        }
        for port in container["ports"]
    ]


# =========================================================================== tests: files


def test_every_asset_parses() -> None:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
    assert {p.relative_to(DEPLOY).as_posix() for p in files} >= {
        "kubernetes/gateway.yaml",
        "kubernetes/service.yaml",
        "kubernetes/hpa.yaml",
        "kubernetes/routing-configmap.yaml",
        "kubernetes/routing-source.yaml",
        "kubernetes/kustomization.yaml",
        "kubernetes/tfjob.yaml",
        "kubernetes/grpc-balancer.yaml",
        "prometheus/prometheus.yml",
        "prometheus/rules/recording.yml",
        "prometheus/rules/alerts.yml",
        "prometheus/rules/tests.yml",
        "grafana/slipway-gateway.json",
    }
    for path in files:
        if path.suffix == ".json":
            assert json.loads(path.read_text(encoding="utf-8")), path
        else:
            assert yaml_documents(path), path


# =========================================================================== tests: Kubernetes


def test_kustomization_holds_the_gateway_objects(objects: list[dict[str, Any]]) -> None:
    kinds = sorted((o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in objects)
    assert kinds == [
        ("apps/v1", "Deployment", "slipway-gateway"),
        ("apps/v1", "Deployment", "slipway-grpc-balancer"),
        ("apps/v1", "Deployment", "slipway-routing"),
        ("autoscaling/v2", "HorizontalPodAutoscaler", "slipway-gateway"),
        ("policy/v1", "PodDisruptionBudget", "slipway-gateway"),
        ("v1", "ConfigMap", "slipway-gateway-config"),
        ("v1", "ConfigMap", "slipway-grpc-balancer"),
        ("v1", "ConfigMap", "slipway-routing"),
        ("v1", "Service", "slipway-gateway"),
        ("v1", "Service", "slipway-gateway-headless"),
        ("v1", "Service", "slipway-grpc"),
        ("v1", "Service", "slipway-routing"),
    ]


def test_container_runs_slipway_serve_with_the_gateway_ports(
    container: dict[str, Any], serve_args: argparse.Namespace
) -> None:
    assert serve_args.handler is serving_cli.run_serve
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": serve_args.grpc_port, "rest": serve_args.rest_port}
    assert (serve_args.grpc_port, serve_args.rest_port) == (
        serving_cli.DEFAULT_GRPC_PORT,
        serving_cli.DEFAULT_REST_PORT,
    )
    # Exec form: the gateway is PID 1 and gets SIGTERM itself, no shell in between.
    assert "args" not in container and container["command"][0] == "slipway"


def test_probes_ask_the_health_endpoints_on_the_rest_port(
    container: dict[str, Any], serve_args: argparse.Namespace
) -> None:
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {kind: probe["path"] for kind, probe in probes.items()} == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    assert {ports[probe["port"]] for probe in probes.values()} == {serve_args.rest_port}
    assert (
        container["readinessProbe"]["periodSeconds"] < container["livenessProbe"]["periodSeconds"]
    )


def test_shutdown_is_a_sigterm_drain_that_fits_the_grace_period(
    pod_spec: dict[str, Any], container: dict[str, Any], settings: GatewayConfig
) -> None:
    assert "preStop" not in container.get("lifecycle", {})
    drain = settings.grace_period_s
    assert drain > 0
    assert pod_spec["terminationGracePeriodSeconds"] >= drain + SHUTDOWN_MARGIN_S


def test_volumes_and_mounts_match(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    volumes = {volume["name"] for volume in pod_spec["volumes"]}
    mounts = {mount["name"] for mount in container["volumeMounts"]}
    assert volumes == mounts
    for mount in container["volumeMounts"]:
        source = volume_of(pod_spec, mount["name"])
        if "configMap" in source or "secret" in source:
            # A subPath mount would never see the kubelet's update of the ConfigMap.
            assert "subPath" not in mount and mount["readOnly"] is True, mount["name"]
    paths = [mount["mountPath"] for mount in container["volumeMounts"]]
    assert len(paths) == len(set(paths))


def test_model_repository_is_the_volume_training_publishes_into(
    pod_spec: dict[str, Any], container: dict[str, Any], serve_args: argparse.Namespace
) -> None:
    (repository,) = [
        m
        for m in container["volumeMounts"]
        if PurePosixPath(m["mountPath"]) == serve_args.model_root
    ]
    assert repository["readOnly"] is True
    claim = volume_of(pod_spec, repository["name"])["persistentVolumeClaim"]["claimName"]
    (tfjob,) = yaml_documents(KUBERNETES / "tfjob.yaml")
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    workspace = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in worker["volumes"]
        if "persistentVolumeClaim" in v
    }
    (trainer,) = worker["containers"]
    (workspace_mount,) = [m for m in trainer["volumeMounts"] if m["name"] in workspace]
    assert claim == workspace[workspace_mount["name"]]
    # The trainer's export.model_root, as the README tells experiments to set it.
    model_root = PurePosixPath(workspace_mount["mountPath"]) / repository["subPath"]
    assert f"export.model_root: {model_root}" in (DEPLOY / "README.md").read_text()


def test_gateway_settings_load_and_name_mounted_files(
    objects: list[dict[str, Any]], pod_spec: dict[str, Any], settings: GatewayConfig
) -> None:
    config = settings
    assert config.routing_file is None and config.routing_source is not None
    # A canary rollout needs stable and canary loaded at once.
    assert config.version_policy.kind == "latest" and config.version_policy.num_versions >= 2
    (container,) = pod_spec["containers"]
    (secret_mount,) = [
        m for m in container["volumeMounts"] if "secret" in volume_of(pod_spec, m["name"])
    ]
    assert PurePosixPath(config.admin.token_file).parent == PurePosixPath(secret_mount["mountPath"])
    # The queue alert's threshold is 75% of the queue bound configured here.
    (saturated,) = [
        r for r in rules(RULE_FILES[1]) if r.get("alert") == "SlipwayBatchQueueSaturated"
    ]
    threshold = float(re.fullmatch(r"slipway_gateway_queue_depth >= (\d+)", saturated["expr"])[1])
    assert threshold == 0.75 * config.batching.max_enqueued_batches


def test_routing_configmap_is_a_valid_routing_file(objects: list[dict[str, Any]]) -> None:
    data = find(objects, "ConfigMap", "slipway-routing")["data"]
    assert list(data) == ["routing.yaml"]
    routing = parse_routing(data["routing.yaml"], source="routing-configmap.yaml")
    assert routing.models
    for name, model in routing.models.items():
        assert "stable" in model.labels, name


@pytest.fixture(scope="module")
def source_args(objects: list[dict[str, Any]]) -> argparse.Namespace:
    """The routing source container's command line, parsed by ``slipway``'s own parser."""
    (source,) = find(objects, "Deployment", "slipway-routing")["spec"]["template"]["spec"][
        "containers"
    ]
    parser = argparse.ArgumentParser(prog="slipway")
    serving_cli.register(parser.add_subparsers(dest="command", required=True))
    program, *arguments = source["command"]
    assert program == "slipway"
    return parser.parse_args(arguments)


def test_the_routing_source_is_one_writer_with_its_table_on_the_workspace(
    objects: list[dict[str, Any]], source_args: argparse.Namespace
) -> None:
    assert source_args.handler is routing_cli.run_routing_serve
    deployment = find(objects, "Deployment", "slipway-routing")
    # A second instance would be a second truth: one replica, never two during an update.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {PurePosixPath(m["mountPath"]): m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    state = mounts[source_args.state.parent]
    assert not state.get("readOnly") and "subPath" in state  # written on every change
    assert volumes[state["name"]]["persistentVolumeClaim"]["claimName"] == "slipway-workspace"
    seed = mounts[source_args.seed.parent]
    assert volumes[seed["name"]]["configMap"]["name"] == "slipway-routing"
    assert source_args.seed.name in find(objects, "ConfigMap", "slipway-routing")["data"]
    (token,) = [e for e in container["env"] if e["name"] == source_args.token_env]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "slipway-gateway-admin", "key": "token"}
    (port,) = container["ports"]
    assert port["containerPort"] == source_args.port == routing_cli.DEFAULT_PORT
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    service = find(objects, "Service", "slipway-routing")
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (source_args.port, port["name"])
    ]


def test_gateways_watch_the_source_and_cache_on_a_writable_volume(
    objects: list[dict[str, Any]],
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    serve_args: argparse.Namespace,
    settings: GatewayConfig,
) -> None:
    source = settings.routing_source
    url = urllib.parse.urlsplit(source.url)
    service = find(objects, "Service", "slipway-routing")
    assert (url.hostname, url.port) == (
        service["metadata"]["name"],
        service["spec"]["ports"][0]["port"],
    )
    # The cache is written on every change: a writable volume of the pod's own, which a
    # container restart keeps.
    (cache,) = [
        m
        for m in container["volumeMounts"]
        if PurePosixPath(m["mountPath"]) == PurePosixPath(source.cache_file).parent
    ]
    assert not cache.get("readOnly") and "emptyDir" in volume_of(pod_spec, cache["name"])
    # No gateway mounts the routing ConfigMap any more: nothing read-only to write to.
    assert all(
        volume.get("configMap", {}).get("name") != "slipway-routing"
        for volume in pod_spec["volumes"]
    )
    # Each replica reports the address the controller reaches it at: its pod IP.
    assert serve_args.advertise_url == f"http://$(POD_IP):{serve_args.rest_port}"
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_pods_are_annotated_for_scraping_on_the_metrics_port(
    deployment: dict[str, Any], serve_args: argparse.Namespace
) -> None:
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == serve_args.rest_port
    assert annotations["prometheus.io/path"] == "/metrics"


def test_services_budget_and_autoscaler_select_the_gateway_pods(
    objects: list[dict[str, Any]], deployment: dict[str, Any], container: dict[str, Any]
) -> None:
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {port["name"] for port in container["ports"]}
    services = [
        find(objects, "Service", name) for name in ("slipway-gateway", "slipway-gateway-headless")
    ]
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {port["targetPort"] for port in service["spec"]["ports"]} == port_names
    budget = find(objects, "PodDisruptionBudget", "slipway-gateway")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    hpa = find(objects, "HorizontalPodAutoscaler", "slipway-gateway")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        "Deployment",
        deployment["metadata"]["name"],
    )
    # The autoscaler owns the replica count; a value in the Deployment would reset it.
    assert "replicas" not in deployment["spec"]
    assert hpa["spec"]["minReplicas"] >= 2
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert container["resources"]["requests"]["cpu"]  # CPU utilization is relative to it
    assert metrics["Pods"]["pods"]["metric"]["name"] in gateway_catalogue()


# =========================================================================== tests: metric names


def test_the_grpc_balancer_spreads_calls_over_the_ready_gateway_pods(
    objects: list[dict[str, Any]],
) -> None:
    config_map = find(objects, "ConfigMap", "slipway-grpc-balancer")
    envoy = yaml.safe_load(config_map["data"]["envoy.yaml"])
    [cluster] = envoy["static_resources"]["clusters"]
    assert (cluster["type"], cluster["lb_policy"]) == ("STRICT_DNS", "ROUND_ROBIN")
    [endpoints] = cluster["load_assignment"]["endpoints"]
    [address] = [e["endpoint"]["address"]["socket_address"] for e in endpoints["lb_endpoints"]]
    headless = find(objects, "Service", "slipway-gateway-headless")
    grpc_port = next(p for p in headless["spec"]["ports"] if p["name"] == "grpc")
    assert (address["address"], address["port_value"]) == (
        "slipway-gateway-headless",
        grpc_port["port"],
    )
    options = cluster["typed_extension_protocol_options"]
    [protocol] = options.values()
    assert "http2_protocol_options" in protocol["explicit_http_config"]  # gRPC upstream
    assert cluster["health_checks"][0]["grpc_health_check"] == {}  # the gateway's health service
    [listener] = envoy["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    [route] = manager["route_config"]["virtual_hosts"][0]["routes"]
    retried = set(route["route"]["retry_policy"]["retry_on"].split(","))
    assert {"connect-failure", "unavailable"} <= retried

    balancer = find(objects, "Deployment", "slipway-grpc-balancer")
    pod = balancer["spec"]["template"]
    [container] = pod["spec"]["containers"]
    [port] = container["ports"]
    assert port["containerPort"] == listener["address"]["socket_address"]["port_value"]
    config_path = container["args"][container["args"].index("-c") + 1]
    [mount] = container["volumeMounts"]
    assert config_path == f"{mount['mountPath']}/envoy.yaml"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    service = find(objects, "Service", "slipway-grpc")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]


def test_reference_scanner_reads_names_and_matchers() -> None:
    expr = (
        'sum by (model, le) (rate(x_bucket{route=~"stable|canary", code!="OK"}[5m] offset 1m))'
        " / ignoring (code) group_left () level:y:rate5m * 1e-3 > bool 2 unless z"
    )
    assert references(expr) == [
        Reference("x_bucket", (("route", "=~", "stable|canary"), ("code", "!=", "OK"))),
        Reference("level:y:rate5m"),
        Reference("z"),
    ]


def test_controller_metrics_are_documented(catalogues: dict[str, Catalogue]) -> None:
    assert catalogues["controller"].labels == {
        "slipway_rollout_rollbacks_total": frozenset({"model"}),
        "slipway_rollout_state": frozenset({"model", "state"}),
    }


def test_rules_and_dashboard_use_only_exported_series_and_labels(
    catalogues: dict[str, Catalogue], dashboard: dict[str, Any]
) -> None:
    gateway, controller, recorded = (catalogues[k] for k in ("gateway", "controller", "recorded"))
    sources: list[tuple[str, str, list[Catalogue]]] = []
    # Recording rules read raw gateway series, and the rules recorded before them.
    for rule in rules(RULE_FILES[0]):
        sources.append((f"recording rule {rule['record']}", rule["expr"], [gateway, recorded]))
    for rule in rules(RULE_FILES[1]):
        sources.append((f"alert {rule['alert']}", rule["expr"], [gateway, controller, recorded]))
    for where, expr in dashboard_expressions(dashboard):
        sources.append((where, expr, [gateway, controller, recorded]))
    problems = [
        problem
        for where, expr, known in sources
        for ref in references(expr)
        for problem in check_reference(ref, known, where)
    ]
    assert problems == []


def test_recording_rule_names_state_the_labels_they_keep(catalogues: dict[str, Catalogue]) -> None:
    for record, labels in catalogues["recorded"].labels.items():
        level = record.split(":")[0]
        for label in sorted(labels, key=len, reverse=True):
            assert label in level, f"{record} keeps {label!r} but does not say so"
            level = level.replace(label, "", 1)
        assert set(level) <= {"_"}, f"{record} names labels it does not keep"


def test_rule_unit_tests_feed_real_series(catalogues: dict[str, Catalogue]) -> None:
    known = [catalogues["gateway"], catalogues["controller"]]
    tests = yaml.safe_load((RULES / "tests.yml").read_text())["tests"]
    problems = [
        problem
        for test in tests
        for series in test["input_series"]
        for ref in references(series["series"])
        for problem in check_reference(ref, known, test["name"])
    ]
    assert problems == []


def test_every_alert_fires_in_a_rule_unit_test() -> None:
    alerts = {rule["alert"] for rule in rules(RULE_FILES[1])}
    tests = yaml.safe_load((RULES / "tests.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert alerts - fired == set()
    for rule in rules(RULE_FILES[1]):
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_autoscaler_metric_is_a_gauge_of_the_gateway(objects: list[dict[str, Any]]) -> None:
    hpa = find(objects, "HorizontalPodAutoscaler", "slipway-gateway")
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    families = {family.name: family.type for family in GatewayMetrics().registry.collect()}
    assert families[pods["metric"]["name"]] == "gauge"


# =========================================================================== tests: Grafana


def test_dashboard_panels_are_laid_out_and_filtered_by_model(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["model"]["type"] == "query"
    model_query = re.fullmatch(r"label_values\((\w+), (\w+)\)", variables["model"]["definition"])
    assert model_query[2] in gateway_catalogue().labels[model_query[1]]

    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{panel['title']!r} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'model="$model"' in target["expr"], panel["title"]


def test_dashboard_covers_the_gateway_signals(dashboard: dict[str, Any]) -> None:
    used = {ref.name for _, expr in dashboard_expressions(dashboard) for ref in references(expr)}
    signals = (
        "slipway_gateway_requests:",
        "request_error_ratio:",
        "request_seconds:p99",
        "batch_size:",
        "batch_padding_ratio:",
        "slipway_gateway_queue_depth",
        "slipway_gateway_in_flight",
        "shadow_agreement:",
        "failovers:",
        "slipway_gateway_model_loaded",
        "slipway_rollout_state",
        "slipway_rollout_rollbacks_total",
    )
    assert [s for s in signals if not any(s in name for name in used)] == []


@pytest.mark.process  # promtool
def test_dashboard_queries_are_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    expressions = dashboard_expressions(dashboard)
    rule_file = tmp_path / "dashboard_queries.yml"
    rule_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "dashboard",
                        "rules": [
                            {"record": f"dashboard:query_{index}", "expr": as_promql(expr)}
                            for index, (_, expr) in enumerate(expressions)
                        ],
                    }
                ]
            }
        )
    )
    result = run_promtool("check", "rules", rule_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(expressions)} rules found" in result.stdout


# =========================================================================== tests: promtool


@pytest.mark.process  # promtool
def test_promtool_accepts_the_rule_files() -> None:
    result = run_promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process  # promtool
def test_promtool_accepts_the_prometheus_config(deployment: dict[str, Any], tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (pods_job,) = [job for job in config["scrape_configs"] if "kubernetes_sd_configs" in job]
    assert pods_job["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert [str(PROMETHEUS / path) for path in config["rule_files"]] == list(map(str, RULE_FILES))
    if kubernetes_sd_supported(tmp_path):
        result = run_promtool("check", "config", PROMETHEUS / "prometheus.yml")
    else:
        # This build cannot parse kubernetes_sd_configs: check everything else, the
        # relabeling included, with a discovered gateway pod in its place.
        pod = discovered_gateway_pod(deployment, "10.0.0.7")
        checked = tmp_path / "prometheus.yml"
        checked.write_text(yaml.safe_dump(prometheus_config_without_kubernetes(pod)))
        result = run_promtool("check", "config", checked)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout + result.stderr


@pytest.mark.process  # promtool
def test_rule_unit_tests_pass() -> None:
    tests = yaml.safe_load((RULES / "tests.yml").read_text())
    assert {Path(f).name for f in tests["rule_files"]} == {p.name for p in RULE_FILES}
    result = run_promtool("test", "rules", RULES / "tests.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# =========================================================================== tests: Prometheus


@pytest.fixture
def gateway_metrics_endpoint() -> Iterator[int]:
    """A /metrics endpoint serving a GatewayMetrics registry whose canary fails 10% of its
    requests: every scrape is answered, then 18 stable, 9 canary OK and 1 canary error are
    counted, so rates and ratios are steady from the second scrape on."""
    metrics = GatewayMetrics()

    def traffic() -> None:
        for _ in range(18):
            metrics.observe_request("digits", 1, "stable", "OK", "grpc", 0.004)
        for _ in range(9):
            metrics.observe_request("digits", 2, "canary", "OK", "rest", 0.004)
        metrics.observe_request("digits", 2, "canary", "INTERNAL", "rest", 0.004)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = metrics.render(self.headers.get("Accept"))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            traffic()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    traffic()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


@pytest.mark.process
def test_prometheus_scrapes_annotated_gateway_pods_and_records_the_rules(
    deployment: dict[str, Any], gateway_metrics_endpoint: int, tmp_path: Path
) -> None:
    prometheus = binary("prometheus")
    port = str(gateway_metrics_endpoint)
    annotated_port = {"__meta_kubernetes_pod_annotation_prometheus_io_port": port}
    gateway = discovered_gateway_pod(deployment, "127.0.0.1", **annotated_port)
    finished = discovered_gateway_pod(
        deployment, "127.0.0.2", __meta_kubernetes_pod_phase="Succeeded", **annotated_port
    )
    unannotated = discovered_gateway_pod(
        deployment, "127.0.0.3", __meta_kubernetes_pod_annotation_prometheus_io_scrape="false"
    )
    settings = prometheus_config_without_kubernetes(gateway + finished + unannotated, interval="1s")
    # Only the pods: the static example job would scrape whatever listens on port 8501.
    settings["scrape_configs"] = [
        job for job in settings["scrape_configs"] if job["job_name"] == "kubernetes-pods"
    ]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(settings))
    api_port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{api_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    ratio_query = 'model_route:slipway_gateway_request_error_ratio:rate1m{model="digits"}'

    def both_ratios() -> dict[str, float]:
        """The recorded error ratio of each route, once Prometheus has both."""
        try:
            result = api(api_port, "query", query=ratio_query)["result"]
        except OSError:  # not listening yet
            return {}
        ratios = {s["metric"]["route"]: float(s["value"][1]) for s in result}
        return ratios if len(ratios) == 2 else {}

    try:
        try:
            ratios = wait_until(both_ratios, "recorded error ratios of both routes", 45)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{log_path.read_text()[-3000:]}") from None
        targets = api(api_port, "targets")
    finally:
        process.terminate()
        process.wait(timeout=30)

    assert ratios == {"canary": pytest.approx(0.1), "stable": 0.0}
    # One target for the pod, at the annotated port, whichever container port found it.
    (active,) = targets["activeTargets"]
    assert active["scrapeUrl"] == f"http://127.0.0.1:{port}/metrics"
    assert active["labels"] == {
        "instance": f"127.0.0.1:{port}",
        "job": "kubernetes-pods",
        "namespace": "serving",
        "pod": gateway[0]["__meta_kubernetes_pod_name"],
        "component": "gateway",
    }
    dropped = {t["discoveredLabels"]["__meta_kubernetes_pod_ip"] for t in targets["droppedTargets"]}
    assert dropped == {"127.0.0.2", "127.0.0.3"}
