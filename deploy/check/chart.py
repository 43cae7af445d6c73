#!/usr/bin/env python3
"""Checks the Helm chart in deploy/helm/ferrox (run by scripts/check-deploy.sh).

Helm itself (its Go SDK, through the helm-python-sdk package) lints the chart and renders it
with several sets of values; every rendered object of a Kubernetes kind is validated against
the Kubernetes schemas (kubernetes-validate, offline, strict); the custom resources
(InferencePool, HTTPRoute, ServiceMonitor) are checked against the fields of their published
schemas that the chart sets; then the objects are checked against each other (selectors,
ports, the secret, the memory formula, the entry point's variables).
"""

import math
import re
import sys
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/ferrox"
ENTRYPOINT = ROOT / "deploy/docker/entrypoint.sh"
DOC = ROOT / "docs/DEPLOY.md"
ADAPTER = ROOT / "deploy/prometheus-adapter/values.yaml"
# The oldest Kubernetes the chart is meant for (autoscaling/v2, startup probes, appProtocol
# are all older) and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
CUSTOM_KINDS = {"InferencePool", "HTTPRoute", "ServiceMonitor"}
# Values of other charts that docs/DEPLOY.md names (the extension's inferencepool chart).
OTHER_CHARTS_VALUES = {"inferencePool.modelServers.matchLabels", "inferencePool.targetPorts"}

SCENARIOS = {
    "defaults": {},
    "everything": {
        "replicaCount": 2,
        "image": {"repository": "registry.example/ferrox", "tag": "0.1.0"},
        "model": {"file": "/models/big/qwen3-30b-a3b-q4_k_m.gguf", "sizeBytes": 18556686336, "alias": "qwen3"},
        "server": {"kvMemoryMiB": 8192, "threads": 16, "extraArgs": ["--max-queue", "128", "--chat-template", "chatml"],
                   "extraEnv": [{"name": "FERROX_ISA", "value": "avx2"}]},
        "apiKey": {"existingSecret": "llm-keys", "existingSecretKey": "ferrox"},
        "persistence": {"accessModes": ["ReadOnlyMany"], "storageClass": "nfs", "size": "100Gi"},
        "resources": {"cpu": 16, "memoryHeadroomMiB": 2048},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8, "targetCPUUtilizationPercentage": 80},
        "inferencePool": {"enabled": True, "endpointPicker": {"service": "qwen3-epp", "failureMode": "FailOpen"},
                          "httpRoute": {"parentRefs": [{"name": "inference-gateway", "namespace": "gateways",
                                                        "sectionName": "http"}],
                                        "hostnames": ["llm.example.com"], "requestTimeout": "300s"}},
        "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"],
                            "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
    },
    "existing-claim": {
        "persistence": {"existingClaim": "shared-models"},
        "apiKey": {"value": "a-fixed-key"},
        "resources": {"override": {"requests": {"cpu": "2", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}},
        "metrics": {"podAnnotations": False},
        "inferencePool": {"enabled": True, "httpRoute": {"enabled": False}},
        "server": {"preStopSleepSeconds": 0},
    },
    "no-persistence": {"persistence": {"enabled": False}},
}

failures = []


def fail(scenario, message):
    failures.append(f"{scenario}: {message}")


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_inference_pool(s, obj):
    """The v1 InferencePool fields (inference.networking.k8s.io_inferencepools.yaml)."""
    spec = obj.get("spec") or {}
    allowed = {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    if set(spec) - allowed:
        fail(s, f"InferencePool: unknown spec fields {sorted(set(spec) - allowed)}")
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if not 1 <= len(labels) <= 64 or set(spec["selector"]) != {"matchLabels"}:
        fail(s, "InferencePool: spec.selector must hold matchLabels (1 to 64) only")
    for k, v in labels.items():
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            fail(s, f"InferencePool: bad label value {k}={v!r}")
    ports = spec.get("targetPorts") or []
    numbers = [p.get("number") for p in ports]
    if not 1 <= len(ports) <= 8 or len(set(numbers)) != len(numbers):
        fail(s, "InferencePool: targetPorts needs 1 to 8 unique ports")
    for p in ports:
        if set(p) != {"number"} or not isinstance(p["number"], int) or not 1 <= p["number"] <= 65535:
            fail(s, f"InferencePool: bad target port {p}")
    if spec.get("appProtocol", "http") not in ("http", "kubernetes.io/h2c"):
        fail(s, "InferencePool: appProtocol must be http or kubernetes.io/h2c")
    epp = spec.get("endpointPickerRef")
    if not isinstance(epp, dict):
        fail(s, "InferencePool: endpointPickerRef is required (v1.0 of the CRD)")
        return
    if set(epp) - {"group", "kind", "name", "port", "failureMode"}:
        fail(s, f"InferencePool: unknown endpointPickerRef fields {sorted(set(epp))}")
    if not epp.get("name") or len(epp["name"]) > 253:
        fail(s, "InferencePool: endpointPickerRef.name is required")
    if epp.get("kind", "Service") == "Service" and not isinstance((epp.get("port") or {}).get("number"), int):
        fail(s, "InferencePool: endpointPickerRef.port.number is required for a Service")
    if epp.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
        fail(s, "InferencePool: failureMode must be FailOpen or FailClose")


def check_http_route(s, obj, pool_names):
    spec = obj.get("spec") or {}
    parents = spec.get("parentRefs") or []
    if not parents or any(not p.get("name") for p in parents):
        fail(s, "HTTPRoute: parentRefs needs named Gateways")
    for rule in spec.get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            if ref.get("group") != "inference.networking.k8s.io" or ref.get("kind") != "InferencePool":
                fail(s, f"HTTPRoute: backendRef {ref} is not an InferencePool")
            elif ref.get("name") not in pool_names:
                fail(s, f"HTTPRoute: backendRef names no rendered InferencePool ({ref.get('name')})")
            if "port" in ref:
                fail(s, "HTTPRoute: an InferencePool backendRef takes no port")
        for m in rule.get("matches") or []:
            path = m.get("path") or {}
            if path.get("type") not in ("PathPrefix", "Exact") or not str(path.get("value", "")).startswith("/"):
                fail(s, f"HTTPRoute: bad path match {path}")
        t = (rule.get("timeouts") or {}).get("request")
        if t is not None and not re.match(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$", t):
            fail(s, f"HTTPRoute: bad timeout {t!r}")
    if not spec.get("rules"):
        fail(s, "HTTPRoute: no rules")


def check_service_monitor(s, obj):
    for ep in (obj.get("spec") or {}).get("endpoints") or []:
        auth = ep.get("authorization") or {}
        creds = auth.get("credentials") or {}
        if auth.get("type") != "Bearer" or not creds.get("name") or not creds.get("key"):
            fail(s, "ServiceMonitor: the endpoint must send the API key (authorization.credentials)")
        if ep.get("path") != "/metrics" or ep.get("port") != "http":
            fail(s, "ServiceMonitor: must scrape port http, path /metrics")


def memory_mib(values):
    return (math.ceil(values["model"]["sizeBytes"] / 2**20) + values["server"]["kvMemoryMiB"]
            + values["resources"]["memoryHeadroomMiB"])


def check_consistency(s, values, objs):
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    deploy = by_kind["Deployment"][0]
    pod = deploy["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    selector = deploy["spec"]["selector"]["matchLabels"]
    if not selector.items() <= pod_labels.items():
        fail(s, "Deployment: selector does not match the pod labels")
    svc = by_kind["Service"][0]
    if not svc["spec"]["selector"].items() <= pod_labels.items():
        fail(s, "Service: selector does not match the pod labels")
    [c] = [c for c in pod["spec"]["containers"] if c["name"] == "ferrox"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}.get("http")
    if port != 8080:
        fail(s, "container: port http must be 8080 (the image's FERROX_PORT)")
    env = {e["name"]: e for e in c["env"]}
    for name in ("FERROX_MODEL", "FERROX_API_KEY"):
        if name not in env:
            fail(s, f"container: {name} is not set")
    if env.get("FERROX_HOST", {}).get("value") != "0.0.0.0" or env.get("FERROX_PORT", {}).get("value") != "8080":
        fail(s, "container: must listen on 0.0.0.0:8080")
    entry = ENTRYPOINT.read_text()
    for name in env:
        if name.startswith("FERROX_") and name not in ("FERROX_MODELS_DIR", "FERROX_ISA") and name not in entry:
            fail(s, f"container: the entry point does not read {name}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != "/health" or get.get("port") not in ("http", 8080):
            fail(s, f"container: {probe} must GET /health on the http port")
    if not c["livenessProbe"].get("initialDelaySeconds"):
        fail(s, "container: the liveness probe needs an initial delay")
    sc, psc = c.get("securityContext") or {}, pod["spec"].get("securityContext") or {}
    if not psc.get("runAsNonRoot") or not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation"):
        fail(s, "pod: must run as non-root with a read-only root filesystem")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    if "/models" not in mounts or not mounts["/models"].get("readOnly"):
        fail(s, "container: the model volume must be mounted read-only at /models")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    models = volumes[mounts["/models"]["name"]]
    claims = {o["metadata"]["name"] for o in by_kind.get("PersistentVolumeClaim", [])}
    if values["persistence"]["enabled"]:
        claim = models.get("persistentVolumeClaim", {}).get("claimName")
        expected = values["persistence"]["existingClaim"] or claim
        if claim != expected or (not values["persistence"]["existingClaim"] and claim not in claims):
            fail(s, f"pod: the model volume's claim {claim} is not the chart's")
    elif "emptyDir" not in models or claims:
        fail(s, "pod: without persistence the model volume is an emptyDir and no claim is made")
    # The API key: the Secret the pod and the ServiceMonitor read, made by the chart or not.
    ref = env["FERROX_API_KEY"]["valueFrom"]["secretKeyRef"]
    secrets = {o["metadata"]["name"]: o for o in by_kind.get("Secret", [])}
    if values["apiKey"]["existingSecret"]:
        if secrets or ref != {"name": values["apiKey"]["existingSecret"], "key": values["apiKey"]["existingSecretKey"]}:
            fail(s, "the API key must come from apiKey.existingSecret, and no Secret be made")
    elif ref["name"] not in secrets or ref["key"] not in secrets[ref["name"]].get("data", {}):
        fail(s, "the API key's Secret is not rendered")
    # Resources: the documented formula unless overridden.
    res = c["resources"]
    if values["resources"]["override"]:
        if res != values["resources"]["override"]:
            fail(s, "resources.override is not used as given")
    else:
        want = f"{memory_mib(values)}Mi"
        if res["requests"]["memory"] != want or res["limits"]["memory"] != want:
            fail(s, f"memory is {res['requests']['memory']}, the formula gives {want}")
    annotations = pod["metadata"].get("annotations") or {}
    if values["metrics"]["podAnnotations"] != (annotations.get("prometheus.io/scrape") == "true"):
        fail(s, "prometheus.io/scrape annotation does not follow metrics.podAnnotations")
    if annotations.get("prometheus.io/scrape") and (annotations.get("prometheus.io/path") != "/metrics"
                                                    or annotations.get("prometheus.io/port") != "8080"):
        fail(s, "prometheus.io annotations must name /metrics on 8080")
    for sm in by_kind.get("ServiceMonitor", []):
        if not sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items():
            fail(s, "ServiceMonitor: selector does not match the Service")
        creds = sm["spec"]["endpoints"][0]["authorization"]["credentials"]
        if creds != {"name": ref["name"], "key": ref["key"]}:
            fail(s, "ServiceMonitor: sends another secret than the pods use")
    for hpa in by_kind.get("HorizontalPodAutoscaler", []):
        if "replicas" in deploy["spec"]:
            fail(s, "Deployment: replicas must be left to the autoscaler")
        target = hpa["spec"]["scaleTargetRef"]
        if target["kind"] != "Deployment" or target["name"] != deploy["metadata"]["name"]:
            fail(s, "HPA: does not target the Deployment")
        pods = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        name = pods[0]["pods"]["metric"]["name"] if pods else ""
        if not pods or ":" in name or "num_requests_waiting" not in name:
            fail(s, f"HPA: needs a Pods metric for the renamed vllm:num_requests_waiting, has {name!r}")
    if values["autoscaling"]["enabled"] != bool(by_kind.get("HorizontalPodAutoscaler")):
        fail(s, "HPA: rendered iff autoscaling.enabled")
    pools = by_kind.get("InferencePool", [])
    if values["inferencePool"]["enabled"] != bool(pools):
        fail(s, "InferencePool: rendered iff inferencePool.enabled")
    for pool in pools:
        if pool["spec"]["selector"]["matchLabels"] != selector:
            fail(s, "InferencePool: selector is not the Deployment's")
        if [p["number"] for p in pool["spec"]["targetPorts"]] != [port]:
            fail(s, "InferencePool: targetPorts is not the container's port")
    routes = by_kind.get("HTTPRoute", [])
    if bool(routes) != (values["inferencePool"]["enabled"] and values["inferencePool"]["httpRoute"]["enabled"]):
        fail(s, "HTTPRoute: rendered iff inferencePool.enabled and inferencePool.httpRoute.enabled")


def has_path(values, dotted):
    node = values
    for part in dotted.split("."):
        part = re.sub(r"\[\d+\]$", "", part)
        if isinstance(node, list):
            node = node[0] if node else {}
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_docs(defaults):
    """Every value docs/DEPLOY.md names, in `--set` flags for this chart or in backquotes,
    exists in values.yaml; the adapter rule serves the HPA's metric name."""
    text = DOC.read_text()
    names = set()
    for command in re.sub(r"\\\n\s*", " ", text).splitlines():
        if "deploy/helm/ferrox" in command:
            names |= set(re.findall(r"--set '?([A-Za-z][\w.\[\]]*)=", command))
    for token in re.findall(r"`([a-z][A-Za-z]*(?:\.[A-Za-z][A-Za-z0-9]*)+)`", text):
        if token.split(".")[0] in defaults and token not in OTHER_CHARTS_VALUES:
            names.add(token)
    for name in sorted(names):
        if not has_path(defaults, name):
            fail("docs", f"docs/DEPLOY.md names {name}, which values.yaml does not have")
    adapter = yaml.safe_load(ADAPTER.read_text())
    renamed = [r["name"]["as"] for r in adapter["rules"]["custom"]
               if "vllm:num_requests_waiting" in r["seriesQuery"]]
    if renamed != [defaults["autoscaling"]["metricName"]]:
        fail("docs", f"the adapter rule serves {renamed}, the HPA reads {defaults['autoscaling']['metricName']}")
    return len(names)


def main():
    report = helm.lint(str(CHART), strict=True)
    for m in report["messages"]:
        print(f"helm lint: [{['UNKNOWN', 'INFO', 'WARNING', 'ERROR'][m['severity']]}] {m['path']}: {m['error']}")
        if m["severity"] >= 2:
            fail("lint", f"{m['path']}: {m['error']}")
    for e in report["errors"]:
        fail("lint", e)
    with helm.Chart.load(str(CHART)) as chart:
        defaults = chart.values
        for s, over in SCENARIOS.items():
            lint = helm.lint(str(CHART), over, strict=True)
            for m in lint["messages"]:
                if m["severity"] >= 2:
                    fail(s, f"helm lint: {m['path']}: {m['error']}")
            values = deep_merge(defaults, over)
            rendered = chart.render(over, name="demo", namespace="llm", is_install=True)
            objs = []
            for path, text in sorted(rendered.items()):
                if path.endswith("NOTES.txt"):
                    continue
                for doc in yaml.safe_load_all(text):
                    if doc:
                        objs.append(doc)
            kinds = sorted(o["kind"] for o in objs)
            names = [(o["kind"], o["metadata"]["name"]) for o in objs]
            if len(set(names)) != len(names):
                fail(s, f"duplicate objects {names}")
            for o in objs:
                if not DNS_LABEL.match(o["metadata"]["name"]) or len(o["metadata"]["name"]) > 63:
                    fail(s, f"bad object name {o['metadata']['name']!r}")
                if o["kind"] in CUSTOM_KINDS:
                    continue
                for version in KUBE_VERSIONS:
                    try:
                        kubernetes_validate.validate(o, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        fail(s, f"{o['kind']}/{o['metadata']['name']} (Kubernetes {version}): "
                                f"{'.'.join(map(str, e.path))}: {e.message}")
                    except kubernetes_validate.SchemaNotFoundError as e:
                        fail(s, f"{o['kind']}: no Kubernetes {version} schema ({e})")
            pool_names = {o["metadata"]["name"] for o in objs if o["kind"] == "InferencePool"}
            for o in objs:
                if o["kind"] == "InferencePool":
                    check_inference_pool(s, o)
                elif o["kind"] == "HTTPRoute":
                    check_http_route(s, o, pool_names)
                elif o["kind"] == "ServiceMonitor":
                    check_service_monitor(s, o)
            check_consistency(s, values, objs)
            print(f"chart [{s}]: {len(objs)} objects ({', '.join(kinds)})")
    print(f"docs: {check_docs(defaults)} values named in docs/DEPLOY.md exist; the adapter rule matches the HPA")
    if failures:
        for f in failures:
            print(f"FAIL {f}", file=sys.stderr)
        sys.exit(1)
    print(f"chart: lint and {len(SCENARIOS)} renderings checked (Helm SDK {helm.helm_sdk_version()}, "
          f"Kubernetes schemas {', '.join(KUBE_VERSIONS)})")


if __name__ == "__main__":
    main()
