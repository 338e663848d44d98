#!/usr/bin/env python3
"""Validates every YAML document under examples/ offline, against real schemas.

Usage: check_recipes.py EXAMPLES_DIR LEADER_GATE_BINARY [KUBERNETES_VERSION...]

Owns the recipes' validation (scripts/check-recipes.sh runs it); prints one
line per finding and exits 1 if there is any. Per document:

- a kind defined by a CRD in EXAMPLES_DIR/schemas/ (ECK Beat and Agent,
  OpenTelemetryCollector, PrometheusRule, PodMonitor, ServiceMonitor):
  validated with jsonschema against that CRD's openAPIV3Schema for the
  document's apiVersion, with unknown fields refused wherever the schema
  does not keep them (x-kubernetes-preserve-unknown-fields), as
  `kubectl apply --validate=strict` does; the pod templates that ECK's CRDs
  leave unchecked are validated as Kubernetes PodTemplateSpecs;
- a built-in kind: kubernetes-validate, strict, for each KUBERNETES_VERSION;
- any other kind, or a document without apiVersion and kind: a finding;
- a `kustomization.yaml`: `kubectl kustomize` renders its directory; a
  Prometheus rules file (only `groups`): `promtool check rules`;
- a Helm values file (`values.yaml` in a directory `<chart>-chart/`): every
  key must be one that EXAMPLES_DIR/schemas/<chart>-chart.yaml lists, of its
  type; container, volume and mount lists are validated as Kubernetes
  objects with kubernetes-validate.

Then leader-gate in each recipe directory (a recipe and its RBAC): the
directory's objects, with a chart's values as the workload the chart
renders from them (chart_workload: no chart is rendered offline), go to
`LEADER_GATE_BINARY inject --check` for the wiring (every command line as
start-up validates it, native sidecars, timings, the gate socket, preStop
hooks, the grants each Lease needs, Metricbeat's modules glob, reload period
and strict.perms); each line it prints is a finding. What stays here is the
project's policy for its recipes: the leader-gate `serve` container's
Leases and service account are shipped beside it, and the Roles bound to
that account grant nothing its flags do not use and no `create` on Leases
(scripts/check_manifests.py's rule).
"""

import copy
import glob
import os
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_manifests  # noqa: E402  (command lines, RBAC needs)

findings = []


def bad(where, message):
    findings.append(f"{where}: {message}")


# === CRD schemas ===


def strict_schema(schema):
    """The CRD schema with unknown fields refused where the API server would
    prune them: every object with `properties` and neither
    `additionalProperties` nor x-kubernetes-preserve-unknown-fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-kubernetes-embedded-resource"):
                props = node.setdefault("properties", {})
                for field in ("apiVersion", "kind"):
                    props.setdefault(field, {"type": "string"})
                props.setdefault("metadata", {"type": "object"})
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def load_crds(schemas_dir):
    """{(group/version, kind): (validator, crd file)} from the CRD files."""
    crds = {}
    for path in sorted(glob.glob(os.path.join(schemas_dir, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                for version in spec["versions"]:
                    if not version.get("served", True):
                        continue
                    schema = strict_schema(version["schema"]["openAPIV3Schema"])
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    crds[key] = (jsonschema.Draft7Validator(schema), os.path.basename(path))
    return crds


def error_path(error):
    return "." + ".".join(str(p) for p in error.absolute_path) if error.absolute_path else "(top)"


# === built-in kinds ===


def validate_builtin(where, doc, versions):
    ok = True
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            bad(where, f"no schema for {doc.get('apiVersion')} {doc.get('kind')} (Kubernetes {version}, nor a CRD in examples/schemas/)")
            return False
        except kubernetes_validate.ValidationError as e:
            at = "." + ".".join(str(p) for p in e.path) if e.path else "(top)"
            bad(where, f"Kubernetes {version}: {e.message} at {at}")
            ok = False
        except kubernetes_validate.InvalidSchemaError as e:
            bad(where, f"Kubernetes {version}: {e}")
            ok = False
    return ok


def validate_pod_parts(where, versions, containers=(), init_containers=(), volumes=(), mounts=()):
    """Container, volume and mount lists, validated inside a Pod."""
    main = list(containers) or [{"name": "placeholder", "image": "placeholder:0", "volumeMounts": list(mounts)}]
    if containers and mounts:
        main[0] = dict(main[0], volumeMounts=list(main[0].get("volumeMounts", [])) + list(mounts))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "values"},
        "spec": {"containers": main, "initContainers": list(init_containers), "volumes": list(volumes)},
    }
    validate_builtin(where, pod, versions)


# === Helm values ===


def check_values(where, values, keys, versions):
    """Every key of `values` one of `keys` (dotted paths), of its type."""
    def walk(node, prefix):
        for key, value in (node or {}).items():
            path = f"{prefix}{key}"
            if path in keys:
                check_value(f"{where} {path}", value, keys[path], versions)
            elif any(k.startswith(path + ".") for k in keys) and isinstance(value, dict):
                walk(value, path + ".")
            else:
                bad(where, f"unknown key {path} (not a key of the chart that examples/schemas/ lists)")

    walk(values, "")
    for path, spec in keys.items():
        node = values
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if spec.get("required") and node in (None, ""):
            bad(where, f"{path} is required by the chart")


def check_value(where, value, spec, versions):
    kind = spec["type"]
    simple = {"string": str, "boolean": bool, "object": dict}
    if kind in simple:
        if not isinstance(value, simple[kind]):
            bad(where, f"is {type(value).__name__}, not {kind}")
        elif "enum" in spec and value not in spec["enum"]:
            bad(where, f"{value!r} is not one of {spec['enum']}")
    elif kind in ("containers", "volumes", "volumeMounts"):
        if not isinstance(value, list):
            return bad(where, f"is {type(value).__name__}, not a list")
        arg = {"containers": "containers", "volumes": "volumes", "volumeMounts": "mounts"}[kind]
        validate_pod_parts(where, versions, **{arg: value})
    else:
        bad(where, f"the keys file names an unknown type {kind!r}")


def load_chart_keys(path):
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict) or not data.get("version"):
        bad(path, "not a chart keys file (chart, version, keys)")
        return {}
    for key, spec in data["keys"].items():
        if not isinstance(spec, dict) or "type" not in spec or not spec.get("source"):
            bad(path, f"key {key}: needs a type and the source it was read from")
    return data["keys"]


# === other YAML a recipe may hold ===


def check_kustomization(where, directory):
    """A kustomization: it must render (its objects are validated as files)."""
    result = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True)
    if result.returncode != 0:
        bad(where, f"kubectl kustomize fails: {result.stderr.strip()[-300:]}")


def check_prometheus_rules(where, path):
    """A plain Prometheus rules file (top-level `groups` only): promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return bad(where, "a Prometheus rules file, and no promtool to check it (Debian: prometheus)")
    result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
    if result.returncode != 0:
        bad(where, f"promtool check rules: {(result.stdout + result.stderr).strip()[-300:]}")


# === leader-gate in the recipes ===


def pods_of(doc):
    """(where, pod spec, service account) of the pods a document describes."""
    kind = doc.get("kind")
    name = f"{kind}/{(doc.get('metadata') or {}).get('name')}"
    spec = doc.get("spec") or {}
    if kind in ("Beat", "Agent"):
        for mode in ("daemonSet", "deployment", "statefulSet"):
            template = (spec.get(mode) or {}).get("podTemplate")
            if template:
                pod = template.get("spec") or {}
                yield f"{name} {mode}", pod, pod.get("serviceAccountName") or spec.get("serviceAccountName")
    elif kind == "OpenTelemetryCollector":
        pod = {
            "initContainers": spec.get("initContainers", []),
            "containers": spec.get("additionalContainers", []),
            "volumes": spec.get("volumes", []),
        }
        yield name, pod, spec.get("serviceAccount")


# The workload kind the opentelemetry-collector chart renders for each `mode`.
CHART_KINDS = {"daemonset": "DaemonSet", "deployment": "Deployment", "statefulset": "StatefulSet"}


def chart_workload(chart, values, namespace):
    """The workload the chart renders from `values`, as far as leader-gate's
    wiring sees it (no chart is rendered here: Helm and the chart are not
    available offline). As the opentelemetry-collector chart's
    templates/_pod.tpl lays the pod out: its collector container (the chart's
    name, `/<command.name>` with its --config from the chart's ConfigMap
    mounted at /conf, plus extraVolumeMounts) and then extraContainers,
    initContainers as given, the ConfigMap's volume and then extraVolumes,
    serviceAccount.name; the chart sets no terminationGracePeriodSeconds."""
    image = values.get("image") or {}
    collector = {
        "name": chart,
        "image": f"{image.get('repository')}:{image.get('tag', 'latest')}",
        "args": ["--config=/conf/relay.yaml"],
        "volumeMounts": [{"name": f"{chart}-configmap", "mountPath": "/conf"}]
        + list(values.get("extraVolumeMounts") or []),
    }
    command = (values.get("command") or {}).get("name")
    if command:
        collector["command"] = [f"/{command}"]
    labels = {"app.kubernetes.io/name": chart}
    pod = {
        "serviceAccountName": (values.get("serviceAccount") or {}).get("name") or chart,
        "initContainers": list(values.get("initContainers") or []),
        "containers": [collector] + list(values.get("extraContainers") or []),
        "volumes": [{"name": f"{chart}-configmap", "configMap": {"name": chart}}]
        + list(values.get("extraVolumes") or []),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": CHART_KINDS.get(values.get("mode"), "Deployment"),
        "metadata": {"name": chart, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def check_wiring(where, binary, docs):
    """`leader-gate inject --check` on a recipe's stream (its objects and its
    RBAC): every command line as start-up validates it, native sidecars,
    timings, the gate socket, preStop hooks, the grants each Lease needs,
    Metricbeat's modules glob, reload period and strict.perms. Each line it
    prints is a finding. Run with an empty environment, as any user's shell."""
    stream = yaml.safe_dump_all(docs, sort_keys=False)
    result = subprocess.run(
        [binary, "inject", "--check", "-"], input=stream, env={}, capture_output=True, text=True, timeout=60
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode not in (0, 1) or (result.returncode == 1) != bool(lines):
        return bad(where, f"leader-gate inject --check exited {result.returncode}: {result.stderr.strip()[-300:]}")
    for line in lines:
        bad(where, line)


def check_policy(where, pod, sa, namespace, docs):
    """The project's policy for a recipe's gated pod (its wiring is
    check_wiring's): the service account and the Lease shipped beside the
    recipe, and the Roles bound to the account granting nothing its flags do
    not use, no `create` on Leases among it (check_manifests.py's rule)."""
    containers = pod.get("initContainers", []) + pod.get("containers", [])
    gates = [check_manifests.gate_argv(c) for c in containers]
    serves = [(c, argv) for c, argv in zip(containers, gates) if argv and argv[0] == "serve"]
    if len(serves) != 1:
        return  # inject --check says what is wrong.
    serve, argv = serves[0]
    if not sa:
        return bad(where, "no service account: the Roles cannot be checked")
    leases = check_manifests.lease_names(argv[1:])
    for lease in leases:
        if not any(d.get("kind") == "Lease" and d["metadata"]["name"] == lease
                   and d["metadata"].get("namespace") == namespace for d in docs):
            bad(where, f"--lease-name {lease}: no such Lease shipped in namespace {namespace} beside the recipe")
    if not any(d.get("kind") == "ServiceAccount" and d["metadata"]["name"] == sa for d in docs):
        bad(where, f"service account {sa} is not shipped beside the recipe")
    opts = check_manifests.flags(argv[1:])
    check_manifests.check_rbac_needed(docs, where, namespace, sa, opts, leases, True, serve)


# === main ===


def main():
    examples, binary = sys.argv[1:3]
    versions = sys.argv[3:] or [kubernetes_validate.latest_version()]
    schemas_dir = os.path.join(examples, "schemas")
    crds = load_crds(schemas_dir)
    files = sorted(
        p for p in glob.glob(os.path.join(examples, "**", "*"), recursive=True)
        if p.endswith((".yaml", ".yml")) and os.path.isfile(p)
    )
    by_dir = {}
    counted = {"crd": 0, "builtin": 0, "values": 0, "schema files": 0}
    for path in files:
        rel = os.path.relpath(path, examples)
        directory = os.path.dirname(path)
        with open(path) as f:
            try:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                bad(rel, f"not YAML: {e}")
                continue
        base = os.path.basename(directory)
        if os.path.basename(path) == "values.yaml" and base.endswith("-chart"):
            keys_file = os.path.join(schemas_dir, f"{base}.yaml")
            if not os.path.exists(keys_file):
                bad(rel, f"Helm values without examples/schemas/{base}.yaml listing the chart's keys")
                continue
            keys = load_chart_keys(keys_file)
            for doc in docs:
                check_values(rel, doc, keys, versions)
                counted["values"] += 1
            by_dir.setdefault(directory, {"docs": [], "values": []})["values"].extend(docs)
            continue
        if directory == schemas_dir and base == "schemas" and path.endswith("-chart.yaml"):
            load_chart_keys(path)
            counted["schema files"] += 1
            continue
        if os.path.basename(path) == "kustomization.yaml":
            check_kustomization(rel, directory)
            continue
        if docs and all(isinstance(d, dict) and set(d) == {"groups"} for d in docs):
            check_prometheus_rules(rel, path)
            continue
        for i, doc in enumerate(docs):
            where = f"{rel} document {i + 1}"
            if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
                bad(where, "no apiVersion and kind: not a Kubernetes object (nor Helm values of a known chart)")
                continue
            where = f"{where} ({doc['kind']} {(doc.get('metadata') or {}).get('name')})"
            key = (doc["apiVersion"], doc["kind"])
            if key in crds:
                validator, crd_file = crds[key]
                errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
                for error in errors:
                    bad(where, f"{crd_file}: {error.message} at {error_path(error)}")
                counted["crd"] += 1
                for pod_where, pod, _ in pods_of(doc):
                    template = (doc["spec"].get(pod_where.split()[-1]) or {}).get("podTemplate")
                    if doc["kind"] in ("Beat", "Agent") and template is not None:
                        validate_builtin(f"{where} {pod_where.split()[-1]}.podTemplate", {
                            "apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": "podtemplate"}, "template": template,
                        }, versions)
            elif any(k[1] == doc["kind"] for k in crds):
                served = sorted(k[0] for k in crds if k[1] == doc["kind"])
                bad(where, f"apiVersion {doc['apiVersion']} is not served by the CRD (served: {served})")
                continue
            else:
                validate_builtin(where, doc, versions)
                counted["builtin"] += 1
            by_dir.setdefault(directory, {"docs": [], "values": []})["docs"].append(doc)

    # leader-gate in each recipe directory (a recipe and its RBAC): the
    # wiring by `inject --check` on the directory's stream, the policy here.
    for directory, group in sorted(by_dir.items()):
        rel = os.path.relpath(directory, examples)
        docs = [d for d in group["docs"] if isinstance(d.get("metadata"), dict)]
        for doc in docs:
            namespace = doc["metadata"].get("namespace", "default")
            for where, pod, sa in pods_of(doc):
                check_policy(f"{rel}: {where}", pod, sa, namespace, docs)
        workloads = []
        chart = os.path.basename(directory)[: -len("-chart")]
        for values in group["values"]:
            sa = (values.get("serviceAccount") or {}).get("name")
            namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa}
            namespace = next(iter(namespaces), "default")
            workload = chart_workload(chart, values, namespace)
            workloads.append(workload)
            check_policy(f"{rel}: values.yaml", workload["spec"]["template"]["spec"], sa, namespace, docs)
        where = f"{rel}: values.yaml as the chart renders it" if workloads else rel
        check_wiring(where, binary, docs + workloads)

    findings.extend(check_manifests.findings)
    for finding in findings:
        print(f"FAIL {finding}")
    print(
        f"check_recipes: {len(files)} files; {counted['crd']} objects against CRDs, "
        f"{counted['builtin']} built-in objects (Kubernetes {' '.join(versions)}, strict), "
        f"{counted['values']} Helm values files, {len(crds)} CRD versions; {len(findings)} findings"
    )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
