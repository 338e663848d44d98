#!/usr/bin/env bash
# `leader-gate inject` on the upstream fixtures (tests/fixtures/upstream/),
# as a user's cluster would take it: each gated stream passes the Kubernetes
# schemas (and ECK's CRD), `inject --check`, and `inject --patch` renders
# the same through `kubectl kustomize` (scripts/check_inject.py says how
# they compare). About 20 s after the build. Needs kubectl (this project's
# machines have one; else Debian's kubernetes-client) and PyPI's
# kubernetes-validate and jsonschema, installed if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The pins and KUBERNETES_VERSIONS.
source scripts/lib/python-checks.sh
pip_pin "kubernetes-validate==$KUBERNETES_VALIDATE" "jsonschema==$JSONSCHEMA"
if ! command -v kubectl >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi
cargo build --quiet --bin leader-gate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 scripts/check_inject.py "${CARGO_TARGET_DIR:-target}/debug/leader-gate" "$work" "${KUBERNETES_VERSIONS[@]}"
