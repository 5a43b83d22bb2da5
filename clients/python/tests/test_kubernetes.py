"""The Kubernetes manifests (deploy/kubernetes), checked without a cluster:
the base and the with-redis overlay are built as kustomize builds them
(resources, labels, images, strategic-merge patches of maps), every object
is validated against the Kubernetes 1.33 schemas (kubernetes-validate,
strict), the references between objects hold, and the container's own
arguments, configuration and Secret start the real binary, which answers
the probes the Deployment names on the ports it names."""

from __future__ import annotations

import copy
import os
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml

from conftest import REPO, Redis, binary, free_port, stop_process
from ctxbudget import BudgetClient

KUBE = REPO / "deploy" / "kubernetes"
VERSION = "1.33.0"


def _merge(base: Any, patch: Any) -> Any:
    """A strategic-merge patch as the manifests use it: maps merge key by
    key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(patch)


def build(directory: pathlib.Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k directory`` would apply."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for resource in k.get("resources", []):
        path = (directory / resource).resolve()
        if path.is_dir():
            objects += build(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch_ref in k.get("patches", []):
        patch = yaml.safe_load((directory / patch_ref["path"]).read_text())
        matches = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])]
        assert len(matches) == 1, f"{patch_ref['path']} patches exactly one object"
        objects[objects.index(matches[0])] = _merge(matches[0], patch)
    for label in k.get("labels", []):
        for o in objects:
            o["metadata"].setdefault("labels", {}).update(label["pairs"])
    for image in k.get("images", []):
        for o in objects:
            for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if c["image"] == image["name"]:
                    c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name}"
    return found[0]


BUILDS = {"base": KUBE / "base", "with-redis": KUBE / "overlays" / "with-redis"}


@pytest.mark.parametrize("name", BUILDS)
def test_every_object_validates_against_kubernetes_1_33(name):
    objects = build(BUILDS[name])
    kinds = sorted(o["kind"] for o in objects)
    expected = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret", "Secret", "Service"]
    if name == "with-redis":
        expected = sorted(expected + ["Service", "StatefulSet"])
    assert kinds == expected
    for o in objects:
        kubernetes_validate.validate(o, VERSION, strict=True)


def test_a_broken_manifest_is_refused():
    # The validator is not a formality: a misspelt field fails.
    deployment = copy.deepcopy(one(build(BUILDS["base"]), "Deployment", "ctxbudget"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)


@pytest.mark.parametrize("name", BUILDS)
def test_the_objects_refer_to_each_other_correctly(name):
    objects = build(BUILDS[name])
    deployment = one(objects, "Deployment", "ctxbudget")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = pod["spec"]["containers"][0]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(objects, "Service", "ctxbudget")
    assert service["spec"]["selector"].items() <= labels.items()
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in port_names, p
    pdb = one(objects, "PodDisruptionBudget", "ctxbudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one(objects, "HorizontalPodAutoscaler", "ctxbudget")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ctxbudget" and "cpu" in str(hpa["spec"]["metrics"])
    assert container["resources"]["requests"]["cpu"], "the autoscaler needs a CPU request"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = container[probe]
        port = p.get("grpc", p.get("httpGet", {})).get("port")
        assert port in port_names or port in port_names.values(), (probe, port)
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in one(objects, "Secret", ref["name"])["stringData"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config = one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["subPath"] in config["data"]
    tokens = one(objects, "Secret", volumes["tokens"]["secret"]["secretName"])["stringData"]
    token_dir = next(m for m in container["volumeMounts"] if m["name"] == "tokens")["mountPath"]
    for path in re.findall(r'token_file = "([^"]+)"', config["data"][mount["subPath"]]):
        assert os.path.dirname(path) == token_dir and os.path.basename(path) in tokens, path
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] < pod["spec"]["terminationGracePeriodSeconds"]
    monitor = yaml.safe_load((KUBE / "optional" / "servicemonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == container["livenessProbe"]["httpGet"]["path"]
    if name == "with-redis":
        url = one(objects, "Secret", "ctxbudget-redis")["stringData"]["url"]
        redis = one(objects, "Service", "ctxbudget-redis")
        assert url == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"
        statefulset = one(objects, "StatefulSet", "ctxbudget-redis")
        assert "--appendonly" in statefulset["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_container_as_configured_starts_and_answers_its_probes():
    """The with-redis Deployment's container, run here: its arguments (each
    fixed port moved to a free one, the same for probes), its ConfigMap's
    file at the path it mounts, its Secret's tokens as files, its Redis a
    local one."""
    objects = build(BUILDS["with-redis"])
    pod = one(objects, "Deployment", "ctxbudget")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["containerPort"]: free_port() for p in container["ports"]}
    named = {p["name"]: ports[p["containerPort"]] for p in container["ports"]}
    root = pathlib.Path(tempfile.mkdtemp(prefix="ctxbudget-kube-"))
    moved = lambda s: s.replace("/etc/ctxbudget", str(root))  # noqa: E731
    config = one(objects, "ConfigMap", "ctxbudget-config")["data"]["ctxbudget.toml"]
    (root / "ctxbudget.toml").write_text(moved(config))
    (root / "tokens").mkdir()
    tokens = one(objects, "Secret", "ctxbudget-tokens")["stringData"]
    for key, value in tokens.items():
        (root / "tokens" / key).write_text(value + "\n")
    args = []
    for a in container["args"]:
        for fixed, free in ports.items():
            a = a.replace(f"0.0.0.0:{fixed}", f"127.0.0.1:{free}")
        args.append(moved(a))
    redis = Redis()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXBUDGET_", "OTEL_"))}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env["CTXBUDGET_REDIS_URL"] = redis.url
    log = open(root / "service.log", "w")
    proc = subprocess.Popen([binary(), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        probe = container["livenessProbe"]["httpGet"]
        url = f"http://127.0.0.1:{named[probe['port']]}{probe['path']}"
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, (root / "service.log").read_text()
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200 and b"ctxbudget_" in r.read()
                break
            except OSError:
                assert time.time() < deadline, "the liveness probe's path answers"
                time.sleep(0.2)
        # The readiness probe: grpc.health.v1 on the port it names, SERVING.
        grpc_port = ports[container["readinessProbe"]["grpc"]["port"]]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            # HealthCheckRequest{service: ""} is empty; the answer's field 1 is 1 (SERVING).
            assert check(b"", timeout=10) == b"\x08\x01"
        # The Secret's token, read from its file, admits a caller; none does not.
        with BudgetClient(f"127.0.0.1:{grpc_port}", token=tokens["gateway"]) as client:
            assert client.check_and_reserve(tenant="acme", user="u", tier="pro", prompt_tokens=10).allowed
        with BudgetClient(f"127.0.0.1:{grpc_port}") as client, pytest.raises(Exception):
            client.check_and_reserve(tenant="acme", user="u", tier="pro", prompt_tokens=10)
        # The HTTP port serves the API and the console.
        with urllib.request.urlopen(f"http://127.0.0.1:{named['http']}/openapi.json", timeout=5) as r:
            assert r.status == 200
        # JSON logs, as the container's arguments ask.
        first = (root / "service.log").read_text().splitlines()[0]
        assert first.startswith("{"), first
    finally:
        stop_process(proc)
        log.close()
        redis.stop()
