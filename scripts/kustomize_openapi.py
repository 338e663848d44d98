#!/usr/bin/env python3
"""Writes manifests/kustomize-openapi.json, the schema kustomize uses there.

Usage: kustomize_openapi.py KUBERNETES_VERSION [OUT]   (OUT defaults to
manifests/kustomize-openapi.json; scripts/check-manifests.sh writes it to a
temporary file and fails if it differs from the one in manifests/)

Why a whole schema: `openapi:` in a kustomization *replaces* kustomize's
built-in schema for the whole build, overlays included. The built-in one
predates FlowSchema v1 and the ValidatingAdmissionPolicy kinds, so without
help `namespace:` gives them a metadata.namespace; but a schema that knows
only those kinds leaves kustomize without the merge keys of every other
kind, and a strategic-merge patch then replaces whole lists (a patch naming
one container drops the others). So this file carries every definition of
Kubernetes KUBERNETES_VERSION — merge keys and all — plus the paths that
tell kustomize which newer kinds are cluster-scoped (the scope of the older
kinds kustomize knows by itself, with or without a schema).

The definitions come from kubernetes-validate (PyPI, pinned by
check-manifests.sh), which ships Kubernetes' own OpenAPI definitions; only
the descriptions are dropped (they are most of the bytes and kustomize does
not read them). Nothing is fetched.
"""

import json
import os
import sys

import kubernetes_validate

# Cluster-scoped kinds newer than kustomize's built-in scope list, each
# (group, version, plural, kind). FlowSchema and the admission policy are
# shipped by manifests/; the other two are their companions a user may add.
CLUSTER_SCOPED = [
    ("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", "PriorityLevelConfiguration"),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
]


def strip(node):
    """The node without descriptions, in swagger 2.0 form."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            if key == "$ref" and isinstance(value, str):
                out[key] = value.replace("#/$defs/", "#/definitions/")
            elif key == "type" and isinstance(value, list):
                # JSON Schema's ["string", "null"]: swagger 2.0 has one type.
                types = [t for t in value if t != "null"]
                out[key] = types[0] if len(types) == 1 else types
            else:
                out[key] = strip(value)
        return out
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main():
    version = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "manifests/kustomize-openapi.json"
    source = os.path.join(os.path.dirname(kubernetes_validate.__file__),
                          "kubernetes-json-schema", f"v{version}-local", "_definitions.json")
    with open(source) as f:
        definitions = {name: strip(d) for name, d in json.load(f)["$defs"].items()}
    paths = {}
    for group, api_version, plural, kind in CLUSTER_SCOPED:
        gvk = {"group": group, "version": api_version, "kind": kind}
        if not any(gvk in d.get("x-kubernetes-group-version-kind", []) for d in definitions.values()):
            sys.exit(f"kustomize_openapi.py: Kubernetes {version} has no {group}/{api_version} {kind}")
        paths[f"/apis/{group}/{api_version}/{plural}/{{name}}"] = {
            "get": {"x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}},
        }
    schema = {
        "swagger": "2.0",
        "info": {
            "title": f"Kubernetes {version} definitions for kustomize (written by scripts/kustomize_openapi.py)",
            "version": f"v{version}",
        },
        "paths": paths,
        "definitions": definitions,
    }
    with open(out, "w") as f:
        json.dump(schema, f, indent=0, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
