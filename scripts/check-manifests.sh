#!/usr/bin/env bash
# Validates manifests/ offline, as .ci/run does after `cargo test`:
#
# 1. renders the kustomization with `kubectl kustomize manifests/`;
# 2. validates every manifest file, and the rendered whole, against the
#    Kubernetes OpenAPI schemas with kubernetes-validate (PyPI), in strict
#    mode (unknown fields are errors, so a misspelt field fails), for the
#    newest Kubernetes version the package ships and for 1.29, the oldest
#    the manifests support (native sidecars, FlowSchema v1);
# 3. runs scripts/check_manifests.py on the rendered whole: the leader-gate
#    wiring by `leader-gate inject --check` (flags as start-up validates
#    them, timing rules, the gate socket, preStop hooks, RBAC for each Lease,
#    the Metricbeat modules glob), and the project's policy (security context
#    everywhere, resources, least privilege, NetworkPolicy, FlowSchema);
# 4. renders manifests/ again with the lease-protection component on (a
#    copy whose kustomization lists it), validates that against the schemas
#    of the newest version and of 1.30 (its ValidatingAdmissionPolicy's
#    oldest), runs check_manifests.py on it (the shipped Leases, Roles
#    without `create`) and scripts/check_lease_policy.py, which evaluates
#    the policy's CEL offline with cel-python (PyPI, installed if missing);
# 5. renders both again through an overlay with `namespace: other` and
#    `namePrefix: x-` and runs scripts/check_overlay.py (every object and
#    every reference moved, no `monitoring` left) and check_manifests.py
#    (names and flags still agree) on each;
# 6. shows that check_manifests.py (through inject --check) refuses gates off the gate socket: a copy
#    with a gate left on TCP, a gate without the socket's volume and a socket
#    outside an emptyDir must be refused, each named; and a copy whose exec
#    gate's --grace equals the default gate lag (the margin rule: --grace at
#    least 1 s below the gate lag and the margin);
#    and a copy whose preStop hooks name another Lease and ask over TCP
#    beside a gate socket (each hook must reach its own sidecar);
# 7. checks that manifests/kustomize-openapi.json is what
#    scripts/kustomize_openapi.py writes from kubernetes-validate's
#    definitions, then builds the overlays users write (the sidecar's
#    resources, a volume and mount on the collector, the image by `images:`,
#    an added container, `namespace:` with `namePrefix:`) with
#    `check_overlay.py --patches`: each render keeps every container, init
#    container, volume and mount of the base and passes the schemas; and
#    shows that check refuses a kustomization whose `openapi:` schema lacks
#    the merge keys (one that knows only the cluster-scoped kinds).
#
# kubernetes-validate ships the schemas inside the package and fetches
# nothing; it is installed here if missing. kubectl comes with this
# project's machines; where it is missing, Debian's kubernetes-client
# package provides one (an older kubectl whose built-in kustomize renders
# these files the same).
set -euo pipefail
cd "$(dirname "$0")/.."

# The pins and KUBERNETES_VERSIONS.
source scripts/lib/python-checks.sh
pip_pin "kubernetes-validate==$KUBERNETES_VALIDATE" "cel-python==$CEL_PYTHON"
if ! command -v kubectl >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi
echo "kubernetes-validate $KUBERNETES_VALIDATE; $(kubectl version --client 2>/dev/null | head -1)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

kubectl kustomize manifests/ >"$work/rendered.yaml"
echo "rendered manifests/: $(grep -c '^kind:' "$work/rendered.yaml") objects"
passed=$((passed + 1))

version_args=()
for version in "${KUBERNETES_VERSIONS[@]}"; do version_args+=(-k "$version"); done
for file in manifests/*.yaml "$work/rendered.yaml"; do
    case "$(basename "$file")" in kustomization.yaml | kustomizeconfig.yaml) continue ;; esac
    # A kind without a schema is only a warning there (exit 0): fail on it too.
    if out=$(kubernetes-validate --strict --quiet "${version_args[@]}" "$file" 2>&1) && [ -z "$out" ]; then
        echo "ok   $file (Kubernetes ${KUBERNETES_VERSIONS[*]}, strict)"
        passed=$((passed + 1))
    else
        echo "FAIL $file"
        echo "$out" | sed 's/^/     /'
        failed=$((failed + 1))
    fi
done

cargo build --quiet --bin leader-gate
if python3 scripts/check_manifests.py "$work/rendered.yaml" manifests \
    "${CARGO_TARGET_DIR:-target}/debug/leader-gate"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi

# The lease-protection component (docs/operations.md "Deleting the Lease"), on.
cp -r manifests "$work/protected"
printf 'components:\n  - lease-protection\n' >>"$work/protected/kustomization.yaml"
if kubectl kustomize "$work/protected" >"$work/protected.yaml"; then
    echo "rendered manifests/ with lease-protection: $(grep -c '^kind:' "$work/protected.yaml") objects"
    passed=$((passed + 1))
    if out=$(kubernetes-validate --strict --quiet -k "${KUBERNETES_VERSIONS[0]}" -k 1.30.0 \
        "$work/protected.yaml" 2>&1) && [ -z "$out" ]; then
        echo "ok   lease-protection rendered (Kubernetes ${KUBERNETES_VERSIONS[0]} 1.30.0, strict)"
        passed=$((passed + 1))
    else
        echo "FAIL lease-protection rendered"
        echo "$out" | sed 's/^/     /'
        failed=$((failed + 1))
    fi
    for check in "scripts/check_manifests.py $work/protected.yaml $work/protected ${CARGO_TARGET_DIR:-target}/debug/leader-gate" \
        "scripts/check_lease_policy.py $work/protected.yaml"; do
        # shellcheck disable=SC2086
        if python3 $check; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    done
else
    echo "FAIL kubectl kustomize with lease-protection"
    failed=$((failed + 1))
fi

# Another namespace and a name prefix (manifests/kustomizeconfig.yaml): an
# overlay `namespace: other`, `namePrefix: x-` over a copy of manifests/,
# without and with the lease-protection component; check_overlay.py finds
# what did not move, check_manifests.py what no longer agrees.
for variant in plain protected; do
    mkdir -p "$work/adapt-$variant/overlay"
    cp -r manifests "$work/adapt-$variant/manifests"
    if [ "$variant" = protected ]; then
        printf 'components:\n  - lease-protection\n' >>"$work/adapt-$variant/manifests/kustomization.yaml"
    fi
    printf 'namespace: other\nnamePrefix: x-\nresources:\n  - ../manifests\n' \
        >"$work/adapt-$variant/overlay/kustomization.yaml"
    out="$work/adapt-$variant.yaml"
    if ! kubectl kustomize "$work/adapt-$variant/overlay" >"$out"; then
        echo "FAIL kubectl kustomize of the namespace/prefix overlay ($variant)"
        failed=$((failed + 1))
        continue
    fi
    echo "rendered manifests/ ($variant) with namespace: other, namePrefix: x-: $(grep -c '^kind:' "$out") objects"
    checks=("scripts/check_overlay.py $out other x-"
        "scripts/check_manifests.py $out $work/adapt-$variant/manifests ${CARGO_TARGET_DIR:-target}/debug/leader-gate")
    [ "$variant" = protected ] && checks+=("scripts/check_lease_policy.py $out")
    for check in "${checks[@]}"; do
        # shellcheck disable=SC2086
        if python3 $check; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    done
done

# check_overlay.py can fail: without kustomizeconfig.yaml the same overlay
# leaves `monitoring` and unprefixed names behind, and must be refused.
sed -i '/^configurations:/,/kustomizeconfig.yaml/d' "$work/adapt-protected/manifests/kustomization.yaml"
kubectl kustomize "$work/adapt-protected/overlay" >"$work/adapt-broken.yaml"
if python3 scripts/check_overlay.py "$work/adapt-broken.yaml" other x- >"$work/adapt-broken.out"; then
    echo "FAIL check_overlay.py accepted an overlay rendered without kustomizeconfig.yaml"
    failed=$((failed + 1))
elif grep -q "FlowSchema.*still says 'monitoring'" "$work/adapt-broken.out" \
    && grep -q "names Lease 'metricbeat-leader', which is not an object" "$work/adapt-broken.out"; then
    echo "ok   check_overlay.py refuses the overlay rendered without kustomizeconfig.yaml ($(grep -c '^FAIL' "$work/adapt-broken.out") findings)"
    passed=$((passed + 1))
else
    echo "FAIL check_overlay.py refused the broken overlay for other reasons:"
    sed 's/^/     /' "$work/adapt-broken.out"
    failed=$((failed + 1))
fi

# check_manifests.py refuses gates that do not use the gate socket: a copy of
# manifests/ whose Metricbeat file gate is left on TCP (no LEADER_GATE_URL),
# whose exec gate does not mount the socket's volume, and whose split
# Metricbeat keeps the socket in a hostPath instead of an emptyDir.
cp -r manifests "$work/socket-broken"
python3 - "$work/socket-broken" <<'EOF'
import sys
root = sys.argv[1]
for name, old, new in [
    ("metricbeat-daemonset.yaml",
     "          env:\n            # The sidecar's gate socket.\n"
     "            - name: LEADER_GATE_URL\n              value: unix:/run/leader-gate/gate.sock\n", ""),
    ("exec-gate.yaml",
     "            - {name: gate-socket, mountPath: /run/leader-gate, readOnly: true}\n", ""),
    ("metricbeat-cluster-split.yaml",
     "        - name: gate-socket\n          emptyDir: {medium: Memory, sizeLimit: 1Mi}\n",
     "        - name: gate-socket\n          hostPath: {path: /run/leader-gate, type: DirectoryOrCreate}\n"),
]:
    path = f"{root}/{name}"
    text = open(path).read()
    assert text.count(old) == 1, f"{name} no longer has the wiring this test breaks: update it"
    open(path, "w").write(text.replace(old, new))
EOF
kubectl kustomize "$work/socket-broken" >"$work/socket-broken.yaml"
if python3 scripts/check_manifests.py "$work/socket-broken.yaml" "$work/socket-broken" \
    "${CARGO_TARGET_DIR:-target}/debug/leader-gate" >"$work/socket-broken.out"; then
    echo "FAIL check_manifests.py accepted gates off the gate socket"
    failed=$((failed + 1))
elif grep -qF 'DaemonSet/metricbeat container file-gate: `file-gate` is on TCP (http://127.0.0.1:4040), which the sidecar refuses beside --gate-socket' "$work/socket-broken.out" \
    && grep -qF "Deployment/otel-cluster-collector container collector: does not mount the gate socket's volume gate-socket" "$work/socket-broken.out" \
    && grep -qF "Deployment/otel-cluster-collector container collector preStop hook: does not mount the gate socket's volume gate-socket" "$work/socket-broken.out" \
    && grep -qF "Deployment/metricbeat-cluster container leader-gate: --gate-socket /run/leader-gate/gate.sock is not in an emptyDir" "$work/socket-broken.out" \
    && [ "$(grep -c '^FAIL' "$work/socket-broken.out")" -eq 4 ]; then
    echo "ok   check_manifests.py refuses a gate on TCP, a gate or hook without the socket's volume, a socket outside an emptyDir"
    passed=$((passed + 1))
else
    echo "FAIL check_manifests.py did not refuse the broken gate sockets as expected:"
    sed 's/^/     /' "$work/socket-broken.out"
    failed=$((failed + 1))
fi

# check_manifests.py refuses an exec --grace that is not a second below the
# gate lag: a copy of manifests/ whose exec gate has --grace 4s, the default
# gate lag (the example once shipped so; the SIGKILL went out 0.4 ms before
# the release).
cp -r manifests "$work/grace-broken"
python3 - "$work/grace-broken/exec-gate.yaml" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
old = "            - --grace\n            - 3s\n"
assert text.count(old) == 1, "exec-gate.yaml no longer has the --grace this test breaks: update it"
open(path, "w").write(text.replace(old, "            - --grace\n            - 4s\n"))
EOF
kubectl kustomize "$work/grace-broken" >"$work/grace-broken.yaml"
if python3 scripts/check_manifests.py "$work/grace-broken.yaml" "$work/grace-broken" \
    "${CARGO_TARGET_DIR:-target}/debug/leader-gate" >"$work/grace-broken.out"; then
    echo "FAIL check_manifests.py accepted an exec --grace equal to the gate lag"
    failed=$((failed + 1))
elif grep -qF "Deployment/otel-cluster-collector container collector: --grace 4s is not 1s below the sidecar's gate lag 4s" "$work/grace-broken.out" \
    && [ "$(grep -c '^FAIL' "$work/grace-broken.out")" -eq 1 ]; then
    echo "ok   check_manifests.py refuses an exec --grace equal to the default gate lag"
    passed=$((passed + 1))
else
    echo "FAIL check_manifests.py did not refuse the exec --grace as expected:"
    sed 's/^/     /' "$work/grace-broken.out"
    failed=$((failed + 1))
fi

# check_manifests.py refuses preStop hooks that would ask another sidecar,
# or none: a copy of manifests/ whose routing hook names another Lease and
# whose exec-gate hook asks over TCP, beside a sidecar that takes a step-down
# from its gate socket only.
cp -r manifests "$work/hook-broken"
python3 - "$work/hook-broken" <<'EOF'
import sys
root = sys.argv[1]
for name, old, new in [
    ("deployment-routing.yaml",
     "                  - --lease\n                  - statsd-exporter-leader\n",
     "                  - --lease\n                  - otel-cluster-collector-leader\n"),
    ("exec-gate.yaml",
     "                  - --url=unix:/run/leader-gate/gate.sock\n",
     "                  - --url=http://127.0.0.1:4040\n"),
]:
    path = f"{root}/{name}"
    text = open(path).read()
    assert text.count(old) == 1, f"{name} no longer has the hook this test breaks: update it"
    open(path, "w").write(text.replace(old, new))
EOF
kubectl kustomize "$work/hook-broken" >"$work/hook-broken.yaml"
if python3 scripts/check_manifests.py "$work/hook-broken.yaml" "$work/hook-broken" \
    "${CARGO_TARGET_DIR:-target}/debug/leader-gate" >"$work/hook-broken.out"; then
    echo "FAIL check_manifests.py accepted preStop hooks that ask another sidecar"
    failed=$((failed + 1))
elif grep -qF "Deployment/statsd-exporter container statsd-exporter preStop hook: --lease otel-cluster-collector-leader is not one of the sidecar's Leases" "$work/hook-broken.out" \
    && grep -qF 'Deployment/otel-cluster-collector container collector preStop hook: `prestop` is on TCP (http://127.0.0.1:4040): the sidecar takes a step-down from its gate socket only' "$work/hook-broken.out" \
    && [ "$(grep -c '^FAIL' "$work/hook-broken.out")" -eq 2 ]; then
    echo "ok   check_manifests.py refuses a preStop hook naming another Lease, and one off the gate socket"
    passed=$((passed + 1))
else
    echo "FAIL check_manifests.py did not refuse the broken preStop hooks as expected:"
    sed 's/^/     /' "$work/hook-broken.out"
    failed=$((failed + 1))
fi

# kustomize's schema for manifests/ (see the comment in its kustomization.yaml).
python3 scripts/kustomize_openapi.py "${KUBERNETES_VERSIONS[0]}" "$work/kustomize-openapi.json"
if cmp -s manifests/kustomize-openapi.json "$work/kustomize-openapi.json"; then
    echo "ok   manifests/kustomize-openapi.json is what scripts/kustomize_openapi.py ${KUBERNETES_VERSIONS[0]} writes"
    passed=$((passed + 1))
else
    echo "FAIL manifests/kustomize-openapi.json differs from what scripts/kustomize_openapi.py ${KUBERNETES_VERSIONS[0]} writes: run it"
    failed=$((failed + 1))
fi

# The overlays users write, each over a copy of manifests/.
if python3 scripts/check_overlay.py --patches manifests "${version_args[@]}"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi

# ... and the same check refuses a schema without merge keys: a copy of
# manifests/ whose kustomize-openapi.json keeps only the cluster-scoped
# kinds' definitions (what it once was). A patch naming the sidecar then
# replaces every list it touches.
cp -r manifests "$work/partial-schema"
python3 - "$work/partial-schema/kustomize-openapi.json" <<'EOF'
import json, sys
schema = json.load(open(sys.argv[1]))
kinds = {p["get"]["x-kubernetes-group-version-kind"]["kind"] for p in schema["paths"].values()}
schema["definitions"] = {name: d for name, d in schema["definitions"].items()
                         if any(g["kind"] in kinds for g in d.get("x-kubernetes-group-version-kind", []))}
json.dump(schema, open(sys.argv[1], "w"))
EOF
if python3 scripts/check_overlay.py --patches "$work/partial-schema" >"$work/partial-schema.out"; then
    echo "FAIL check_overlay.py --patches accepted a kustomize schema without merge keys"
    failed=$((failed + 1))
elif grep -qF "FAIL overlay with the sidecar's resources: Deployment/metricbeat-cluster initContainers[leader-gate].image is gone" "$work/partial-schema.out" \
    && grep -qF "FAIL overlay with an added container: DaemonSet/metricbeat containers[metricbeat] is gone" "$work/partial-schema.out"; then
    echo "ok   check_overlay.py --patches refuses a kustomize schema without merge keys ($(grep -c '^FAIL' "$work/partial-schema.out") findings)"
    passed=$((passed + 1))
else
    echo "FAIL check_overlay.py --patches refused the schema without merge keys for other reasons:"
    sed 's/^/     /' "$work/partial-schema.out"
    failed=$((failed + 1))
fi

echo "manifests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
