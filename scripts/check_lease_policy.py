#!/usr/bin/env python3
"""Offline checks of manifests/lease-protection's ValidatingAdmissionPolicy.

Usage: check_lease_policy.py RENDERED.yaml

RENDERED.yaml is `kubectl kustomize` of manifests/ with the lease-protection
component. No API server is involved: the policy's CEL (matchConditions,
validations, messageExpression) is evaluated with cel-python on the
admission requests an API server would build for a DELETE of a Lease:

- held (spec.holderIdentity set), deleted by a user: refused, and the
  message names the Lease and its holder;
- released (holder cleared, as leader-gate's graceful release leaves it),
  empty holder, or no spec at all: allowed;
- held, deleted by the namespace controller: the policy does not apply.

And the wiring: a binding with validationActions [Deny] names the policy,
its namespaceSelector selects the Leases' namespace, and the policy's
resourceRules match DELETE of every shipped Lease by name. Prints one line
per finding; exits 1 if there is any.
"""

import sys

import celpy
import yaml

findings = []


def bad(message):
    findings.append(message)


def cel(expression):
    env = celpy.Environment()
    return env.program(env.compile(expression))


def evaluate(program, activation):
    return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def lease(name, namespace, spec):
    obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "uid": "4c3e1b0a-5b7f-4a51-9b0c-1e2f3a4b5c6d"},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


def request(user):
    return {
        "operation": "DELETE",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }


def admit(policy, old, user):
    """None when the policy does not apply, else (allowed, message)."""
    activation = {"object": None, "oldObject": old, "request": request(user), "params": None}
    for condition in policy["spec"].get("matchConditions", []):
        if not bool(evaluate(cel(condition["expression"]), activation)):
            return None
    for validation in policy["spec"]["validations"]:
        if not bool(evaluate(cel(validation["expression"]), activation)):
            message = validation.get("message", "")
            if "messageExpression" in validation:
                message = str(evaluate(cel(validation["messageExpression"]), activation))
            return False, message
    return True, ""


def main():
    with open(sys.argv[1]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    leases = [d for d in docs if d["kind"] == "Lease"]
    if not policies:
        bad("no ValidatingAdmissionPolicy rendered")
    if not leases:
        bad("no Lease rendered")
    for binding in bindings:
        name = binding["metadata"]["name"]
        if binding["spec"]["policyName"] not in policies:
            bad(f"binding {name} names no rendered policy ({binding['spec']['policyName']})")
        if "Deny" not in binding["spec"].get("validationActions", []):
            bad(f"binding {name} does not Deny")
    for policy_name, policy in policies.items():
        bound = [b for b in bindings if b["spec"]["policyName"] == policy_name]
        if not bound:
            bad(f"policy {policy_name} has no binding")
        selected = set()
        for b in bound:
            labels = (b["spec"].get("matchResources") or {}).get("namespaceSelector", {}).get("matchLabels", {})
            selected.add(labels.get("kubernetes.io/metadata.name"))
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        for lease_doc in leases:
            name = lease_doc["metadata"]["name"]
            namespace = lease_doc["metadata"].get("namespace", "default")
            where = f"policy {policy_name}, Lease {namespace}/{name}"
            if not any(
                "coordination.k8s.io" in r.get("apiGroups", [])
                and "leases" in r.get("resources", [])
                and ("DELETE" in r.get("operations", []) or "*" in r.get("operations", []))
                and (not r.get("resourceNames") or name in r["resourceNames"])
                for r in rules
            ):
                bad(f"{where}: no resourceRule matches its DELETE")
            if None not in selected and namespace not in selected:
                bad(f"{where}: no binding selects namespace {namespace}")
            user = "kubernetes-admin"
            cases = [
                ("held", {"holderIdentity": "metricbeat-x7k2p", "leaseDurationSeconds": 15}, False),
                ("released", {"leaseDurationSeconds": 15, "leaseTransitions": 3}, True),
                ("holder empty", {"holderIdentity": ""}, True),
                ("fresh, empty spec", {}, True),
                ("no spec", None, True),
            ]
            for case, spec, allowed in cases:
                verdict = admit(policy, lease(name, namespace, spec), user)
                if verdict is None:
                    bad(f"{where}: {case}: the policy does not apply to {user}'s DELETE")
                    continue
                if verdict[0] != allowed:
                    bad(f"{where}: {case}: DELETE {'allowed' if verdict[0] else 'refused'}, expected {'allowed' if allowed else 'refused'}")
                if not verdict[0]:
                    for part in (f"{namespace}/{name}", "metricbeat-x7k2p", "clear"):
                        if part not in verdict[1]:
                            bad(f"{where}: {case}: the message {verdict[1]!r} lacks {part!r}")
            held = lease(name, namespace, {"holderIdentity": "metricbeat-x7k2p"})
            for controller in ("system:serviceaccount:kube-system:namespace-controller",):
                if admit(policy, held, controller) is not None:
                    bad(f"{where}: the namespace controller's DELETE is refused: namespace deletion would hang")
    for finding in findings:
        print(f"FAIL {finding}")
    print(
        f"check_lease_policy: {len(policies)} policies, {len(leases)} Leases, "
        f"CEL evaluated offline, {len(findings)} findings"
    )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
