#!/usr/bin/env bash
# Validates the recipes under examples/ offline, as .ci/run does: every YAML
# document against the CRDs in examples/schemas/ (jsonschema, PyPI) or the
# Kubernetes schemas (kubernetes-validate, PyPI, strict, for the newest
# version it ships and 1.29, the oldest with native sidecars), Helm values
# against the chart keys listed there, and leader-gate's wiring in each
# recipe (scripts/check_recipes.py, which runs every leader-gate command line
# with the real binary). Then shows that the check can fail: a copy of
# examples/ with a misspelt Beat field and an unknown chart key must be
# refused with both named, and one whose file gate writes as another user
# than Metricbeat must be refused for strict.perms. Installs the pinned PyPI packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE=1.37.0
JSONSCHEMA=4.26.0
KUBERNETES_VERSIONS=(1.37.0 1.29.0)

for pin in "kubernetes-validate==$KUBERNETES_VALIDATE" "jsonschema==$JSONSCHEMA"; do
    name=${pin%%==*}
    installed=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    if [ "$installed" != "${pin##*==}" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$pin"
    fi
done
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
echo "check-recipes: broken copies are refused (misspelt Beat field, unknown chart key, strict.perms)"
