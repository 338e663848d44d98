#!/usr/bin/env python3
"""Whether two Kubernetes YAML streams hold the same objects, as the API
server would read them: `check-helm.sh` compares the chart rendered with
`inject --helm-values`' values against the chart's rendering gated by
`inject`, which must agree.

Held equal: the same objects (kind, namespace, name); within each, the same
fields and values, where a ConfigMap value that is a YAML mapping is compared
as that mapping (the chart and inject write it with different spacing), and a
ClusterRole's rules as a set (a rule a preset still grants may come twice).
Not compared: the pod template's `checksum/config` annotation, the chart's
checksum of the collector's config, which differs because the config does
(inject leaves the annotation as the chart rendered it; the pods roll anyway,
since their spec changed).
Prints each difference, exits 1 when there is any.

    check_helm.py EXPECTED ACTUAL
"""
import json
import sys

import yaml


def objects(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    out = {}
    for d in docs:
        meta = d.get("metadata", {})
        key = (d.get("kind"), meta.get("namespace", ""), meta.get("name"))
        if key in out:
            sys.exit(f"{path}: {key} twice")
        out[key] = normal(d)
    return out


def normal(doc):
    doc = json.loads(json.dumps(doc))
    template = (doc.get("spec") or {}).get("template") or {}
    (template.get("metadata") or {}).get("annotations", {}).pop("checksum/config", None)
    if doc.get("kind") == "ConfigMap":
        for key, value in (doc.get("data") or {}).items():
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            if isinstance(parsed, dict):
                doc["data"][key] = parsed
    if doc.get("kind") == "ClusterRole":
        rules = {json.dumps(r, sort_keys=True) for r in doc.get("rules") or []}
        doc["rules"] = sorted(rules)
    return doc


def differences(expected, actual, path="", out=None):
    out = [] if out is None else out
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            elif key not in expected:
                out.append(f"{path}.{key}: not expected: {json.dumps(actual[key])[:200]}")
            else:
                differences(expected[key], actual[key], f"{path}.{key}", out)
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (e, a) in enumerate(zip(expected, actual)):
            differences(e, a, f"{path}[{i}]", out)
    elif expected != actual:
        out.append(f"{path}: expected {json.dumps(expected)[:200]}, got {json.dumps(actual)[:200]}")
    return out


def main():
    expected, actual = objects(sys.argv[1]), objects(sys.argv[2])
    found = []
    for key in sorted(set(expected) | set(actual), key=str):
        name = "/".join(k for k in key if k)
        if key not in actual:
            found.append(f"{name}: missing")
        elif key not in expected:
            found.append(f"{name}: not expected")
        else:
            found += [f"{name}: {d}" for d in differences(expected[key], actual[key])]
    for line in found:
        print(line)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
