#!/usr/bin/env python3
"""`leader-gate inject` on the upstream fixtures, checked as a user's cluster would.

Usage: check_inject.py LEADER_GATE_BINARY WORKDIR KUBERNETES_VERSION...

For each upstream manifest in tests/fixtures/upstream/ that inject gates (and
ECK's Beat recipe with a kube-state-metrics provider added, as Elastic's own
manifest has one; the chart's Deployment with an init container of its own,
which must keep running first; the OpenTelemetry Operator's e2e collector
with an image, whose every pipeline is cluster-wide):

- the gated stream passes the Kubernetes schemas (kubernetes-validate,
  strict, every version given) and, for ECK's Beat and the OpenTelemetry
  Operator's OpenTelemetryCollector, the CRD in examples/schemas/
  (check_recipes.py's validators);
- `leader-gate inject --check` finds nothing in it;
- `leader-gate inject --patch DIR` with the upstream file in DIR renders,
  through `kubectl kustomize DIR`, the same objects as the gated stream:
  equal but for nulls (kustomize drops them) and the order of list items
  merged by name or mount path (kustomize puts added ones first; no pod
  depends on that order; init containers, whose order is when they run,
  are compared in order).

Prints one line per check, the findings of any that failed; exit 1 if any.
"""

import copy
import os
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_recipes  # noqa: E402  (the schema validators)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "upstream")
GATED = [
    "elastic-beats-metricbeat-kubernetes.yaml",
    "elastic-agent-standalone-kubernetes.yaml",
    "otel-helm-deployment-cluster-metrics.yaml",
    "otel-helm-daemonset-cluster-metrics.yaml",
    "prometheus-operator-prometheusagent.yaml",
    "otel-kube-stack-daemon.yaml",
]
# Kinds whose CRD this repository does not keep (examples/schemas/): their
# objects are checked by `inject --check` only, and the output says so.
NO_SCHEMA_HERE = {("monitoring.coreos.com/v1alpha1", "PrometheusAgent")}
KEYED = {"containers": "name", "volumes": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def eck_with_unique_provider(workdir):
    """ECK's Beat recipe, plus the provider Elastic's manifest runs once per cluster."""
    with open(os.path.join(FIXTURES, "eck-beat-metricbeat-hosts.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    beat = next(d for d in docs if d["kind"] == "Beat")
    beat["spec"]["config"]["metricbeat"]["autodiscover"]["providers"].append({
        "type": "kubernetes", "scope": "cluster", "node": "${NODE_NAME}", "unique": True,
        "templates": [{"config": [{"module": "kubernetes", "hosts": ["kube-state-metrics:8080"],
                                   "period": "10s", "metricsets": ["state_node", "state_pod"]}]}],
    })
    path = os.path.join(workdir, "eck-beat-with-unique-provider.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return path


def deployment_with_init_container(workdir):
    """The chart's Deployment with an init container of its own, which must
    still run first (its order is when it runs)."""
    with open(os.path.join(FIXTURES, "otel-helm-deployment-cluster-metrics.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "own-init", "image": "busybox:1.36", "command": ["true"]}]
    path = os.path.join(workdir, "otel-deployment-with-init-container.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return path


def operator_collector_with_image(workdir):
    """The operator's e2e collector (k8s_cluster its only receiver) with the
    image it leaves to the operator's --collector-image: inject keeps the
    operator's collector on an idle nop pipeline."""
    with open(os.path.join(FIXTURES, "otel-operator-collector-k8scluster.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    docs[0]["spec"]["image"] = "otel/opentelemetry-collector-contrib:0.158.0"
    path = os.path.join(workdir, "otel-operator-collector-with-image.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return path


def normal(node, field=""):
    """Nulls dropped; lists merged by key sorted by it (init containers kept in order)."""
    if isinstance(node, dict):
        return {k: normal(v, k) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        items = [normal(v) for v in node]
        key = KEYED.get(field)
        if key and all(isinstance(i, dict) and key in i for i in items):
            items.sort(key=lambda i: str(i[key]))
        return items
    return node


def objects(text):
    return {(d["kind"], d["metadata"]["name"]): normal(d) for d in yaml.safe_load_all(text) if d}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    binary, workdir, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
    crds = check_recipes.load_crds(os.path.join(ROOT, "examples", "schemas"))
    inputs = [os.path.join(FIXTURES, n) for n in GATED] + [
        eck_with_unique_provider(workdir), deployment_with_init_container(workdir),
        operator_collector_with_image(workdir)]
    failed = 0
    for path in inputs:
        name = os.path.basename(path)
        out = run([binary, "inject", path])
        if out.returncode != 0:
            print(f"FAIL inject {name}: exit {out.returncode}\n{out.stderr}")
            failed += 1
            continue
        gated = out.stdout
        check_recipes.findings.clear()
        with open(path) as f:
            upstream = [d for d in yaml.safe_load_all(f) if d]
        with_crd = False
        for doc in yaml.safe_load_all(gated):
            if not doc:
                continue
            where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
            key = (doc["apiVersion"], doc["kind"])
            if key not in crds and doc in upstream and doc["apiVersion"].endswith((".k8s.elastic.co/v1",)):
                # Elasticsearch, Kibana: passed through untouched, no schema here.
                continue
            if key in NO_SCHEMA_HERE:
                print(f"note {where}: no CRD schema here, checked by inject --check only")
                continue
            if key in crds:
                with_crd = True
                validator, _ = crds[key]
                for error in validator.iter_errors(doc):
                    check_recipes.bad(where, f"{error.message} at {check_recipes.error_path(error)}")
            else:
                check_recipes.validate_builtin(where, doc, versions)
        if check_recipes.findings:
            print(f"FAIL schemas {name}")
            print("\n".join("     " + f for f in check_recipes.findings))
            failed += 1
        else:
            print(f"ok   schemas {name} (Kubernetes {' '.join(versions)}{', CRD' if with_crd else ''})")
        checked = run([binary, "inject", "--check"], input=gated)
        if checked.returncode != 0:
            print(f"FAIL inject --check {name}\n{checked.stderr}")
            failed += 1
        else:
            print(f"ok   inject --check {name}")
        # --patch over the untouched upstream file.
        base = os.path.join(workdir, "patch-" + name.removesuffix(".yaml"))
        os.makedirs(base)
        shutil.copy(path, os.path.join(base, "upstream.yaml"))
        patched = run([binary, "inject", "--patch", base, os.path.join(base, "upstream.yaml")])
        rendered = run(["kubectl", "kustomize", base]) if patched.returncode == 0 else patched
        if rendered.returncode != 0:
            print(f"FAIL inject --patch {name}: {rendered.stderr}")
            failed += 1
        elif objects(rendered.stdout) != objects(gated):
            a, b = objects(rendered.stdout), objects(gated)
            differ = sorted({k for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
            print(f"FAIL inject --patch {name}: kubectl kustomize renders other objects: {differ}")
            failed += 1
        else:
            print(f"ok   inject --patch {name}: kubectl kustomize renders the gated stream")
    # The checks can fail: a broken gated stream is refused by each.
    broken = run([binary, "inject", os.path.join(FIXTURES, GATED[0])]).stdout
    broken = broken.replace("restartPolicy: Always", "restartPolicyy: Always", 1)
    check_recipes.findings.clear()
    for doc in yaml.safe_load_all(broken):
        if doc and doc["kind"] == "DaemonSet":
            check_recipes.validate_builtin("broken", doc, versions[:1])
    if not check_recipes.findings:
        print("FAIL the schemas accepted a misspelt restartPolicy")
        failed += 1
    else:
        print("ok   the schemas refuse a broken copy")
    clean = run([binary, "inject", os.path.join(FIXTURES, GATED[0])]).stdout
    if run([binary, "inject", "--check"], input=clean.replace("--gate-lag=12s", "--gate-lag=20s")).returncode != 1:
        print("FAIL inject --check accepted --gate-lag=20s beside a 15 s margin")
        failed += 1
    else:
        print("ok   inject --check refuses a broken copy")
    a = objects(run([binary, "inject", os.path.join(FIXTURES, GATED[0])]).stdout)
    b = copy.deepcopy(a)
    b[("DaemonSet", "metricbeat")]["spec"]["template"]["spec"]["initContainers"].reverse()
    if a == b:
        print("FAIL the comparison ignores the init containers' order")
        failed += 1
    else:
        print("ok   the comparison sees the init containers' order")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
