#!/usr/bin/env python3
"""Checks that kustomize's `namespace:` and `namePrefix:` moved everything.

Usage: check_overlay.py RENDERED.yaml NAMESPACE PREFIX

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

import sys

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


def main():
    rendered, namespace, prefix = sys.argv[1:4]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
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

    for finding in findings:
        print(f"FAIL {finding}")
    shipped = "Leases shipped" if leases_shipped else "Leases not shipped"
    print(f"check_overlay: {len(docs)} objects in {namespace} with prefix {prefix} ({shipped}), {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
