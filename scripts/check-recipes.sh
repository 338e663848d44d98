#!/usr/bin/env bash
# Validates the recipes under examples/ offline, as .ci/run does: every YAML
# document against the CRDs in examples/schemas/ (jsonschema, PyPI) or the
# Kubernetes schemas (kubernetes-validate, PyPI, strict, for the newest
# version it ships and 1.29, the oldest with native sidecars), Helm values
# against the chart keys listed there, and leader-gate's wiring in each
# recipe (scripts/check_recipes.py, which hands each recipe's stream, the
# chart's values as the workload the chart renders from them, to
# `leader-gate inject --check`). Then shows that the check can fail: a copy of
# examples/ with a misspelt Beat field and an unknown chart key must be
# refused with both named, one whose file gate writes as another user
# than Metricbeat must be refused for strict.perms, one with gates off
# the gate socket (a gate on TCP, a gate without the socket's volume, a
# socket outside an emptyDir) must be refused with each named, and one
# whose only fault is wiring (the ECK sidecar's --gate-lag above its
# margin, which only inject --check knows) must be refused for it alone.
# Installs the pinned PyPI packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The pins and KUBERNETES_VERSIONS.
source scripts/lib/python-checks.sh
pip_pin "kubernetes-validate==$KUBERNETES_VALIDATE" "jsonschema==$JSONSCHEMA"
cargo build --quiet --bin leader-gate
binary="${CARGO_TARGET_DIR:-target}/debug/leader-gate"

python3 scripts/check_recipes.py examples "$binary" "${KUBERNETES_VERSIONS[@]}"

# The check can fail: a misspelt field in the Beat, an unknown chart key.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r examples "$work/examples"
sed -i 's/^  daemonSet:$/  daemonSett:/' "$work/examples/eck/metricbeat.yaml"
sed -i 's/^extraVolumes:$/extraVolume:/' "$work/examples/opentelemetry-collector-chart/values.yaml"
if python3 scripts/check_recipes.py "$work/examples" "$binary" "${KUBERNETES_VERSIONS[0]}" >"$work/out" 2>&1; then
    echo "FAIL check_recipes.py accepted a misspelt Beat field and an unknown chart key"
    exit 1
fi
for expected in "'daemonSett' was unexpected" "unknown key extraVolume"; do
    if ! grep -qF "$expected" "$work/out"; then
        echo "FAIL check_recipes.py did not report: $expected"
        cat "$work/out"
        exit 1
    fi
done
# And the strict.perms trap: the file gate as 65532 beside a root Metricbeat.
cp -r examples "$work/perms"
python3 - "$work/perms/eck/metricbeat.yaml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
root = "            securityContext:\n              runAsUser: 0\n              runAsGroup: 0\n"
assert root in text, "the ECK recipe's file gate no longer runs as root: update this test"
open(path, "w").write(text.replace(root, root.replace(": 0", ": 65532")))
PY
if python3 scripts/check_recipes.py "$work/perms" "$binary" "${KUBERNETES_VERSIONS[0]}" >"$work/out" 2>&1 \
    || ! grep -q "strict.perms: Metricbeat runs as uid 0" "$work/out"; then
    echo "FAIL check_recipes.py did not report the strict.perms trap"
    cat "$work/out"
    exit 1
fi
# And gates off the gate socket: the ECK file gate left on TCP (no
# LEADER_GATE_URL), the operator's gated collector without the socket's
# volume, the chart's socket outside its emptyDir.
cp -r examples "$work/socket"
python3 - "$work/socket" <<'EOF'
import sys
root = sys.argv[1]
for name, old, new in [
    ("eck/metricbeat.yaml",
     "            env:\n              # The sidecar's gate socket.\n"
     "              - name: LEADER_GATE_URL\n                value: unix:/run/leader-gate/gate.sock\n", ""),
    ("opentelemetry-operator/collector.yaml",
     "        - {name: gate-socket, mountPath: /run/leader-gate, readOnly: true}\n", ""),
    ("opentelemetry-collector-chart/values.yaml",
     "      - --gate-socket=/run/leader-gate/gate.sock\n", "      - --gate-socket=/tmp/gate.sock\n"),
]:
    path = f"{root}/{name}"
    text = open(path).read()
    assert text.count(old) == 1, f"{name} no longer has the wiring this test breaks: update it"
    open(path, "w").write(text.replace(old, new))
EOF
if python3 scripts/check_recipes.py "$work/socket" "$binary" "${KUBERNETES_VERSIONS[0]}" >"$work/out" 2>&1; then
    echo "FAIL check_recipes.py accepted gates off the gate socket"
    exit 1
fi
for expected in 'eck: Beat/metricbeat container file-gate: `file-gate` is on TCP (http://127.0.0.1:4040), which the sidecar refuses beside --gate-socket' \
    "opentelemetry-operator: OpenTelemetryCollector/otel-agent container cluster-collector: does not mount the gate socket's volume gate-socket" \
    "opentelemetry-collector-chart: values.yaml as the chart renders it: DaemonSet/opentelemetry-collector container leader-gate: --gate-socket /tmp/gate.sock is not in an emptyDir"; do
    if ! grep -qF "$expected" "$work/out"; then
        echo "FAIL check_recipes.py did not report: $expected"
        cat "$work/out"
        exit 1
    fi
done
if [ "$(grep -c '^FAIL' "$work/out")" -ne 3 ]; then
    echo "FAIL check_recipes.py refused the broken gate sockets for other reasons too:"
    cat "$work/out"
    exit 1
fi
# And a fault of the wiring alone, which no schema and no policy here sees:
# the ECK sidecar's --gate-lag above its margin (30s - 15s), on which
# `leader-gate serve` would exit 64 in every pod.
cp -r examples "$work/wiring"
python3 - "$work/wiring/eck/metricbeat.yaml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = "              - --lease-duration=30s\n              - --renew-deadline=15s\n              - --retry-period=3s\n              - --gate-lag=12s\n"
assert text.count(old) == 1, "the ECK recipe's timings changed: update this test"
open(path, "w").write(text.replace(old, old.replace("--gate-lag=12s", "--gate-lag=16s")))
PY
expected='eck: Beat/metricbeat container leader-gate: `leader-gate serve` refuses its flags and would exit 64: invalid --gate-lag: must be less than the margin --lease-duration - --renew-deadline (16s >= 15s)'
if python3 scripts/check_recipes.py "$work/wiring" "$binary" "${KUBERNETES_VERSIONS[0]}" >"$work/out" 2>&1 \
    || ! grep -qF "FAIL $expected" "$work/out" || [ "$(grep -c '^FAIL' "$work/out")" -ne 1 ]; then
    echo "FAIL check_recipes.py did not refuse the --gate-lag above the margin (alone): $expected"
    cat "$work/out"
    exit 1
fi
echo "check-recipes: broken copies are refused (misspelt Beat field, unknown chart key, strict.perms, a gate on TCP, a gate without the socket's volume, a socket outside an emptyDir, a --gate-lag above the margin)"
