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

Then, for every pod the recipes describe (a Beat's or Agent's pod template,
an OpenTelemetryCollector, chart values): the leader-gate `serve` container's
--lease-name is a Lease shipped next to it, and the Roles bound to the pod's
service account grant what the flags need on it and nothing more (no
`create`: the Lease is shipped); every leader-gate command line is run by
the real binary, as scripts/check_manifests.py does for manifests/; where a
gate (`exec`, `file-gate`) runs beside the sidecar, the gate socket is wired
as check_manifests.py requires (--gate-socket in a mounted emptyDir, every
gate mounting that volume and naming `unix:<the socket>` as its URL), and
an `exec` gate's --grace is at least 1 s below the sidecar's gate lag and
margin (check_manifests.py's rule). For a
Metricbeat Beat fed by the file gate: the modules glob takes the copy and
not its temporary file, reload.period fits the timings, and the copy's
owner and mode pass Metricbeat's strict.perms check.
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
import check_manifests  # noqa: E402  (role grants, RBAC needs, the binary runs)

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


def pods_of(doc, values_sa=None):
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


def check_leader_gate(where, pod, sa, namespace, docs, binary):
    containers = pod.get("initContainers", []) + pod.get("containers", [])
    gates = [(c, check_manifests.gate_argv(c)) for c in containers]
    gates = [(c, argv) for c, argv in gates if argv]
    serves = [(c, argv) for c, argv in gates if argv[0] == "serve"]
    if gates and len(serves) != 1:
        return bad(where, f"{len(serves)} leader-gate `serve` containers, expected 1")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
    for c, argv in gates:
        if argv[0] in ("serve", "file-gate") and (c not in pod.get("initContainers", []) or c.get("restartPolicy") != "Always"):
            bad(f"{where} container {c['name']}", f"`{argv[0]}` is not a native sidecar (init container, restartPolicy Always)")
        check_manifests.run_binary(binary, where, c, argv, configmaps, volumes)
    if not serves:
        return
    serve, argv = serves[0]
    opts = check_manifests.flags(argv[1:])
    check_manifests.check_gate_socket(where, pod, serve, opts, gates)
    check_exec_grace(where, serve, opts, gates)
    lease = opts.get("lease-name")
    if not sa:
        return bad(where, "no service account: the Roles cannot be checked")
    if not any(d.get("kind") == "Lease" and d["metadata"]["name"] == lease
               and d["metadata"].get("namespace") == namespace for d in docs):
        bad(where, f"--lease-name {lease}: no such Lease shipped in namespace {namespace} beside the recipe")
    if not any(d.get("kind") == "ServiceAccount" and d["metadata"]["name"] == sa for d in docs):
        bad(where, f"service account {sa} is not shipped beside the recipe")
    check_metricbeat_modules(where, pod, gates, opts, docs)
    granted = check_manifests.role_grants(docs, namespace, sa, lease)
    missing = {"get", "update", "list", "watch"} - granted
    if missing:
        bad(where, f"service account {sa} lacks {sorted(missing)} on Lease {lease}")
    check_manifests.check_rbac_needed(docs, where, namespace, sa, opts, [lease], True, serve)


def check_exec_grace(where, serve, opts, gates):
    """check_manifests.py's rule for `exec --grace` against the sidecar's timings."""
    duration = check_manifests.seconds(opts.get("lease-duration", "15s"))
    deadline = check_manifests.seconds(opts.get("renew-deadline", "10s"))
    if "gate-lag" in opts:
        lag = check_manifests.seconds(opts["gate-lag"])
    else:
        lag = check_manifests.default_gate_lag(duration, deadline)
    for c, argv in gates:
        if argv[0] == "exec":
            grace = check_manifests.seconds(check_manifests.flags(argv[1:]).get("grace", "3s"))
            check_manifests.check_exec_grace(f"{where} container {c['name']}", f"{where} container {serve['name']}",
                                             grace, lag, duration - deadline)


# The image users: Metricbeat's image runs as `metricbeat` (1000), the
# leader-gate image as 65532 (the Dockerfile's USER).
IMAGE_USERS = {"metricbeat": 1000, "leader-gate": check_manifests.USER}


def run_as(container, pod, default):
    for sc in (container.get("securityContext") or {}, pod.get("securityContext") or {}):
        if "runAsUser" in sc:
            return sc["runAsUser"]
    return default


def check_metricbeat_modules(where, pod, gates, opts, docs):
    """A Beat of type metricbeat fed by the file gate: the modules glob takes
    the copy but not its temporary file, reload.period fits the timings, and
    Metricbeat's strict.perms check accepts a copy the file gate owns."""
    beats = [d for d in docs if d.get("kind") == "Beat" and (d.get("spec") or {}).get("type") == "metricbeat"]
    file_gates = [(c, argv) for c, argv in gates if argv[0] == "file-gate"]
    if not beats or not file_gates:
        return
    spec = beats[0]["spec"]
    config = spec.get("config") or {}
    modules = config.get("metricbeat.config.modules") or {}
    pattern = modules.get("path", "")
    duration = check_manifests.seconds(opts.get("lease-duration", "15s"))
    deadline = check_manifests.seconds(opts.get("renew-deadline", "10s"))
    margin = duration - deadline
    lag = check_manifests.seconds(opts["gate-lag"]) if "gate-lag" in opts else 0.8 * margin
    if modules.get("reload.enabled") is not True:
        bad(where, "metricbeat.config.modules reload.enabled is not true: the file gate's copy would never be loaded or dropped")
    period = check_manifests.seconds(modules.get("reload.period", "10s"))
    if not (period < margin and period <= lag):
        bad(where, f"reload.period {period}s must be below the margin {margin}s and at most --gate-lag {lag}s")
    metricbeat = next((c for c in pod.get("containers", []) if c.get("name") == "metricbeat"), {})
    mb_user = run_as(metricbeat, pod, IMAGE_USERS["metricbeat"])
    relaxed = "-strict.perms=false" in (metricbeat.get("args") or []) + (metricbeat.get("command") or [])
    for container, argv in file_gates:
        gate_user = run_as(container, pod, IMAGE_USERS["leader-gate"])
        mode = int(check_manifests.flags(argv[1:]).get("mode", "0644"), 8)
        for mapping in check_manifests.positional(argv):
            dst = mapping.split(":", 1)[1]
            tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.leader-gate.tmp")
            if not check_manifests.glob_match(pattern, dst):
                bad(where, f"modules glob {pattern!r} does not match the file gate's DST {dst}")
            if check_manifests.glob_match(pattern, tmp):
                bad(where, f"modules glob {pattern!r} matches the file gate's temporary file {tmp}")
        if relaxed:
            continue
        if gate_user not in (0, mb_user):
            bad(where, f"strict.perms: Metricbeat runs as uid {mb_user} and loads only module files owned by it or root, but the file gate {container['name']} writes as uid {gate_user} (docs/recipes.md \"The strict.perms trap\")")
        if mode & 0o022:
            bad(where, f"strict.perms: the file gate's --mode {oct(mode)} lets group or others write, which Metricbeat refuses")


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

    # leader-gate's wiring, per recipe directory (a recipe and its RBAC).
    for directory, group in sorted(by_dir.items()):
        docs = [d for d in group["docs"] if isinstance(d.get("metadata"), dict)]
        for doc in docs:
            namespace = doc["metadata"].get("namespace", "default")
            for where, pod, sa in pods_of(doc):
                check_leader_gate(f"{os.path.relpath(directory, examples)}: {where}", pod, sa, namespace, docs, binary)
        for values in group["values"]:
            pod = {
                "initContainers": values.get("initContainers", []),
                "containers": values.get("extraContainers", []),
                "volumes": values.get("extraVolumes", []),
            }
            sa = (values.get("serviceAccount") or {}).get("name")
            namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa}
            namespace = next(iter(namespaces), "default")
            check_leader_gate(f"{os.path.relpath(directory, examples)}: values.yaml", pod, sa, namespace, docs, binary)

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
