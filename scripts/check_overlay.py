#!/usr/bin/env python3
"""Checks overlays of manifests/: what moved, and that nothing was lost.

Usage: check_overlay.py RENDERED.yaml NAMESPACE PREFIX
       check_overlay.py --patches MANIFESTS_DIR [-k KUBERNETES_VERSION]...

The first form checks that kustomize's `namespace:` and `namePrefix:` moved
everything (below). The second builds, in a temporary directory, an overlay
for each kind of patch users write over a copy of MANIFESTS_DIR (see
PATCHES) and checks, for each, that every container, init container (those
that are not sidecars in their order), volume and volume mount of the base render is still there
and unchanged but for what the overlay asked for, that what it asked for
is there, and that the render passes the Kubernetes schemas
(kubernetes-validate --strict for each -k version). A kustomize schema that
lacks the merge keys (an `openapi:` that replaces kustomize's built-in one
with a partial one) fails here: a patch naming one container then replaces
the whole list.

RENDERED.yaml is `kubectl kustomize` of an overlay that lists manifests/ as
its base and sets `namespace: NAMESPACE` and `namePrefix: PREFIX` (built by
scripts/check-manifests.sh, with and without the lease-protection
component). Prints one line per finding; exits 1 if there is any:

- every namespaced object is in NAMESPACE, no cluster-scoped one has a
  namespace, every object's name has PREFIX;
- `monitoring`, the namespace the files are written for, is left nowhere;
- every reference to an object of the render names it as renamed: pod
  service accounts and ConfigMap volumes, RoleBinding and ClusterRoleBinding
  subjects and roleRefs, the FlowSchema's service accounts, Role
  resourceNames, --lease-name (when the Leases are shipped) and
  --route-service, the EndpointSlice's service-name label, the admission
  policy's Lease names and its binding's policyName;
- the namespace selectors (NetworkPolicies, the admission policy binding)
  and the FlowSchema subjects name NAMESPACE.

Which names and references agree with each other (the Role grants the
Lease the flags name, ...) is scripts/check_manifests.py's part, run on the
same render.
"""

import copy
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

WRITTEN_FOR = "monitoring"
CLUSTER_KINDS = {
    "ClusterRole", "ClusterRoleBinding", "FlowSchema", "Namespace",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "PriorityLevelConfiguration", "CustomResourceDefinition",
}
# Names that are not objects of the render and must stay as written.
FOREIGN = {("PriorityLevelConfiguration", "leader-election")}

findings = []


def bad(where, message):
    findings.append(f"{where}: {message}")


def scalars(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from scalars(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from scalars(v, f"{path}[{i}]")
    else:
        yield path, node


def flag_values(args, flag):
    """Values of `--flag value` and `--flag=value` in a command line."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            yield args[i + 1]
        elif arg.startswith(flag + "="):
            yield arg.split("=", 1)[1]


def check_moved(docs, namespace, prefix):
    """Findings of the first form (a render with `namespace:`, `namePrefix:`)."""
    objects = {(d["kind"], d["metadata"]["name"]) for d in docs}
    leases_shipped = any(d["kind"] == "Lease" for d in docs)

    def refers(where, kind, name):
        if (kind, name) in FOREIGN:
            return
        if (kind, name) not in objects:
            bad(where, f"names {kind} {name!r}, which is not an object of the render (left unrenamed?)")

    def in_namespace(where, value):
        if value != namespace:
            bad(where, f"names namespace {value!r}, not {namespace!r}")

    for d in docs:
        kind, meta = d["kind"], d["metadata"]
        where = f"{kind}/{meta['name']}"
        if kind not in CLUSTER_KINDS and meta.get("namespace") != namespace:
            bad(where, f"in namespace {meta.get('namespace')!r}, not {namespace!r}")
        if kind in CLUSTER_KINDS and "namespace" in meta:
            bad(where, f"cluster-scoped, yet given metadata.namespace {meta['namespace']!r}")
        if not meta["name"].startswith(prefix):
            bad(where, f"name lacks the prefix {prefix!r}")
        for path, value in scalars(d):
            if isinstance(value, str) and WRITTEN_FOR in value.split("/") + value.split(":") + [value]:
                bad(where, f"{path} still says {value!r}")
        spec = d.get("spec") or {}
        template = (spec.get("template") or {}).get("spec")
        if template:
            refers(where, "ServiceAccount", template.get("serviceAccountName", "default"))
            for v in template.get("volumes", []):
                if "configMap" in v:
                    refers(f"{where} volume {v['name']}", "ConfigMap", v["configMap"]["name"])
            for c in template.get("initContainers", []) + template.get("containers", []):
                args = (c.get("command") or []) + (c.get("args") or [])
                cw = f"{where} container {c['name']}"
                if leases_shipped:
                    for lease in flag_values(args, "--lease-name"):
                        refers(f"{cw} --lease-name", "Lease", lease)
                for service in flag_values(args, "--route-service"):
                    refers(f"{cw} --route-service", "Service", service)
                    refers(f"{cw} --route-service", "EndpointSlice", f"{service}-leader")
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            refers(where, d["roleRef"]["kind"], d["roleRef"]["name"])
            for s in d.get("subjects") or []:
                if s.get("kind") == "ServiceAccount":
                    refers(f"{where} subject", "ServiceAccount", s["name"])
                    in_namespace(f"{where} subject {s['name']}", s.get("namespace", meta.get("namespace")))
        if kind == "Role":
            for rule in d.get("rules", []):
                for name in rule.get("resourceNames") or []:
                    resource = rule["resources"][0]
                    target = {"leases": "Lease", "endpointslices": "EndpointSlice"}.get(resource)
                    if target and (leases_shipped or target != "Lease"):
                        refers(f"{where} resourceNames", target, name)
        if kind == "FlowSchema":
            for rule in spec.get("rules", []):
                for s in rule.get("subjects", []):
                    sa = s.get("serviceAccount") or {}
                    if sa:
                        refers(f"{where} subject", "ServiceAccount", sa["name"])
                        in_namespace(f"{where} subject {sa['name']}", sa.get("namespace"))
        if kind == "NetworkPolicy":
            for rule in spec.get("ingress", []):
                for peer in rule.get("from", []):
                    labels = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
                    if "kubernetes.io/metadata.name" in labels:
                        in_namespace(f"{where} namespaceSelector", labels["kubernetes.io/metadata.name"])
        if kind == "EndpointSlice":
            service = meta.get("labels", {}).get("kubernetes.io/service-name")
            refers(f"{where} label kubernetes.io/service-name", "Service", service)
        if kind == "ValidatingAdmissionPolicy":
            for rule in spec.get("matchConstraints", {}).get("resourceRules", []):
                for name in rule.get("resourceNames") or []:
                    refers(f"{where} resourceNames", "Lease", name)
        if kind == "ValidatingAdmissionPolicyBinding":
            refers(where, "ValidatingAdmissionPolicy", spec.get("policyName"))
            labels = (spec.get("matchResources", {}).get("namespaceSelector") or {}).get("matchLabels") or {}
            in_namespace(f"{where} namespaceSelector", labels.get("kubernetes.io/metadata.name"))
    return leases_shipped


def main():
    if sys.argv[1:2] == ["--patches"]:
        return check_patches(sys.argv[2], sys.argv[3:])
    rendered, namespace, prefix = sys.argv[1:4]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    leases_shipped = check_moved(docs, namespace, prefix)
    for finding in findings:
        print(f"FAIL {finding}")
    shipped = "Leases shipped" if leases_shipped else "Leases not shipped"
    print(f"check_overlay: {len(docs)} objects in {namespace} with prefix {prefix} ({shipped}), {len(findings)} findings")
    return 1 if findings else 0


# --- The second form: the patches users write -------------------------------

GATE_IMAGE = "ghcr.io/leader-gate/leader-gate"
NEW_IMAGE = "registry.example.com/monitoring/leader-gate"
NEW_DIGEST = "sha256:" + "0123456789abcdef" * 4
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")


def workloads(docs):
    return [d for d in docs if d["kind"] in WORKLOAD_KINDS]


def pod(d):
    return d["spec"]["template"]["spec"]


def smp(d, pod_spec):
    """A strategic-merge patch of workload d's pod spec, as users write it."""
    return {
        "apiVersion": d["apiVersion"], "kind": d["kind"],
        "metadata": {"name": d["metadata"]["name"], "namespace": d["metadata"]["namespace"]},
        "spec": {"template": {"spec": pod_spec}},
    }


def sidecar_resources(base):
    """Raises the sidecar's memory limit, naming only the leader-gate container."""
    patches, expected = [], copy.deepcopy(base)
    for d, e in zip(workloads(base), workloads(expected)):
        for field in ("initContainers", "containers"):
            for c in pod(e).get(field, []):
                if c["name"] == "leader-gate":
                    patches.append(smp(d, {field: [{"name": "leader-gate", "resources": {"limits": {"memory": "128Mi"}}}]}))
                    c["resources"]["limits"]["memory"] = "128Mi"
    return {}, patches, expected


def collector_volume(base):
    """An extra volume, mounted into each workload's first (collector) container."""
    patches, expected = [], copy.deepcopy(base)
    volume = {"name": "extra-ca", "secret": {"secretName": "collector-ca"}}
    mount = {"name": "extra-ca", "mountPath": "/etc/extra-ca", "readOnly": True}
    for d, e in zip(workloads(base), workloads(expected)):
        collector = pod(d)["containers"][0]["name"]
        patches.append(smp(d, {"containers": [{"name": collector, "volumeMounts": [mount]}], "volumes": [volume]}))
        pod(e)["volumes"].append(volume)
        pod(e)["containers"][0].setdefault("volumeMounts", []).append(mount)
    return {}, patches, expected


def image(base):
    """The sidecar's image from a registry of one's own, by `images:`."""
    expected = copy.deepcopy(base)
    for e in workloads(expected):
        for c in pod(e).get("initContainers", []) + pod(e)["containers"]:
            if c["image"].split(":")[0] == GATE_IMAGE:
                c["image"] = f"{NEW_IMAGE}@{NEW_DIGEST}"
    return {"images": [{"name": GATE_IMAGE, "newName": NEW_IMAGE, "digest": NEW_DIGEST}]}, [], expected


def added_container(base):
    """One more container in every pod (a log shipper, a proxy)."""
    patches, expected = [], copy.deepcopy(base)
    extra = {
        "name": "log-tailer", "image": "busybox:1.36", "args": ["sleep", "infinity"],
        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    for d, e in zip(workloads(base), workloads(expected)):
        patches.append(smp(d, {"containers": [extra]}))
        pod(e)["containers"].append(extra)
    return {}, patches, expected


def namespace_prefix(base):
    """Another namespace and a name prefix together."""
    return {"namespace": "other", "namePrefix": "x-"}, [], copy.deepcopy(base)


# name -> how the overlay is built and what its render must hold.
PATCHES = {
    "the sidecar's resources": sidecar_resources,
    "an extra volume and mount on the collector": collector_volume,
    "the image by images:": image,
    "an added container": added_container,
    "namespace: and namePrefix:": namespace_prefix,
}


def same(b, r, renamed):
    if b == r:
        return True
    if renamed and isinstance(b, str) and isinstance(r, str):
        namespace, prefix = renamed
        return r == prefix + b or (b == WRITTEN_FOR and r == namespace)
    return False


def contained(b, r, where, out, renamed=None):
    """Every field of b is in r with the same value; lists of named items by name."""
    if isinstance(b, dict) and isinstance(r, dict):
        for k, v in b.items():
            if k not in r:
                out.append(f"{where}.{k} is gone")
            else:
                contained(v, r[k], f"{where}.{k}", out, renamed)
    elif isinstance(b, list) and isinstance(r, list) and all(isinstance(i, dict) and "name" in i for i in b):
        by_name = {i.get("name"): i for i in r if isinstance(i, dict)}
        for i in b:
            if i["name"] not in by_name:
                out.append(f"{where}[{i['name']}] is gone")
            else:
                contained(i, by_name[i["name"]], f"{where}[{i['name']}]", out, renamed)
    elif isinstance(b, list) and isinstance(r, list):
        if len(b) != len(r) or not all(same(x, y, renamed) or isinstance(x, (dict, list)) for x, y in zip(b, r)):
            out.append(f"{where} is {r!r}, not {b!r}")
        else:
            for n, (x, y) in enumerate(zip(b, r)):
                if isinstance(x, (dict, list)):
                    contained(x, y, f"{where}[{n}]", out, renamed)
    elif not same(b, r, renamed):
        out.append(f"{where} is {r!r}, not {b!r}")


def compare(expected, rendered, renamed):
    """Findings: what of each expected pod spec the render lost or changed."""
    out = []
    prefix = renamed[1] if renamed else ""
    got = {(d["kind"], d["metadata"]["name"]): d for d in workloads(rendered)}
    for e in workloads(expected):
        where = f"{e['kind']}/{e['metadata']['name']}"
        r = got.get((e["kind"], prefix + e["metadata"]["name"]))
        if r is None:
            out.append(f"{where} is not in the render")
            continue
        want, have = pod(e), pod(r)
        # kustomize puts the items a strategic-merge patch names first in
        # their list. That only matters for init containers that are not
        # sidecars (no restartPolicy: Always): they run one after another.
        steps = [c["name"] for c in want.get("initContainers", []) if c.get("restartPolicy") != "Always"]
        kept = [c.get("name") for c in have.get("initContainers", []) if c.get("name") in steps]
        if kept != steps:
            out.append(f"{where} init containers run as {kept}, not {steps}")
        for field in ("initContainers", "containers"):
            contained(want.get(field, []), have.get(field, []), f"{where} {field}", out, renamed)
        contained(want.get("volumes", []), have.get("volumes", []), f"{where} volumes", out, renamed)
    return out


def check_patches(manifests, args):
    versions = [args[i + 1] for i, a in enumerate(args) if a == "-k"]
    work = tempfile.mkdtemp(prefix="check-overlay-")
    try:
        shutil.copytree(manifests, os.path.join(work, "manifests"))
        base_yaml = subprocess.run(["kubectl", "kustomize", os.path.join(work, "manifests")],
                                   check=True, capture_output=True, text=True).stdout
        base = [d for d in yaml.safe_load_all(base_yaml) if d]
        failed = 0
        for number, (title, build) in enumerate(PATCHES.items()):
            fields, patches, expected = build(base)
            overlay = os.path.join(work, f"overlay-{number}")
            os.mkdir(overlay)
            kustomization = {"resources": ["../manifests"], **fields}
            if patches:
                kustomization["patches"] = []
                for n, patch in enumerate(patches):
                    with open(os.path.join(overlay, f"patch-{n}.yaml"), "w") as f:
                        yaml.safe_dump(patch, f)
                    kustomization["patches"].append({"path": f"patch-{n}.yaml"})
            with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
                yaml.safe_dump(kustomization, f)
            run = subprocess.run(["kubectl", "kustomize", overlay], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"FAIL overlay with {title}: kubectl kustomize failed: {run.stderr.strip()}")
                failed += 1
                continue
            rendered_path = os.path.join(work, f"overlay-{number}.yaml")
            with open(rendered_path, "w") as f:
                f.write(run.stdout)
            rendered = [d for d in yaml.safe_load_all(run.stdout) if d]
            renamed = (fields["namespace"], fields["namePrefix"]) if "namePrefix" in fields else None
            found = compare(expected, rendered, renamed)
            if renamed:
                del findings[:]
                check_moved(rendered, *renamed)
                found += findings
            if versions:
                cmd = ["kubernetes-validate", "--strict", "--quiet"]
                for v in versions:
                    cmd += ["-k", v]
                valid = subprocess.run(cmd + [rendered_path], capture_output=True, text=True)
                out = (valid.stdout + valid.stderr).strip()
                if valid.returncode != 0 or out:
                    found += [f"Kubernetes schemas ({' '.join(versions)}): {line}" for line in out.splitlines()]
            if found:
                failed += 1
                for finding in found[:12]:
                    print(f"FAIL overlay with {title}: {finding}")
                if len(found) > 12:
                    print(f"FAIL overlay with {title}: ... and {len(found) - 12} more findings")
            else:
                schemas = f", Kubernetes {' '.join(versions)} strict" if versions else ""
                print(f"ok   overlay with {title}: {len(patches)} patches, base intact{schemas}")
        print(f"check_overlay: {len(PATCHES) - failed} of {len(PATCHES)} overlays render intact")
        return 1 if failed else 0
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
