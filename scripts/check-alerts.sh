#!/usr/bin/env bash
# Owns the checks of leader-gate's alert rules (run by .ci/run):
#
# 1. `promtool check rules` and `promtool test rules` on
#    monitoring/leader-gate.rules.yml and its tests;
# 2. the tests can fail: each alert broken in a known way (the mistakes the
#    rules once shipped with among them) must make `promtool test rules`
#    fail;
# 3. examples/prometheus-operator/prometheusrule.yaml is exactly what this
#    script generates from the rules file (`--write` regenerates it);
# 4. monitoring/leader-gate-dashboard.json parses as JSON.
# That every metric and label the rules, their tests and the dashboard name
# is one the binary exposes is checked by tests/it/monitoring_files.rs
# against a running sidecar's /metrics (part of `cargo test`).
# Needs promtool (Debian's prometheus package) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

RULES=monitoring/leader-gate.rules.yml
TESTS=monitoring/leader-gate.rules.test.yml
OPERATOR=examples/prometheus-operator/prometheusrule.yaml
DASHBOARD=monitoring/leader-gate-dashboard.json

command -v promtool >/dev/null || { echo "promtool not found: install Debian's prometheus package" >&2; exit 1; }

# The PrometheusRule: a header, then the rules file below its leading
# comment block, under `spec:`.
prometheusrule() {
    cat <<'HEAD'
# Generated from monitoring/leader-gate.rules.yml by
# `scripts/check-alerts.sh --write`: edit that file, not this one (CI checks
# the two agree). Add the labels your Prometheus's ruleSelector wants
# (kube-prometheus-stack: `release: <its release name>`).
#   kubectl apply -f examples/prometheus-operator/
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: leader-gate
  namespace: monitoring
  labels:
    app.kubernetes.io/name: leader-gate
spec:
HEAD
    awk 'body || /^groups:/ { body = 1; print ($0 == "" ? "" : "  " $0) }' "$RULES"
}

if [ "${1:-}" = "--write" ]; then
    prometheusrule >"$OPERATOR"
    echo "wrote $OPERATOR"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

promtool check rules "$RULES"
promtool test rules "$TESTS"

# Each mutation replaces text of one alert (which must be there) and must
# make the tests fail.
mutations=$(cat <<'EOF_M'
LeaderGateNobodyLeads: one healthy Lease masks a leaderless one (no `by (lease)`)
          max by (namespace, lease) (leader_gate_leader_observed) == 0
=>
          max(leader_gate_leader_observed) == 0
%%
LeaderGateNobodyLeads: fires at once, during a hand-over too (no `for`)
        for: 2m
=>
        for: 0s
%%
LeaderGateLeadingButNotRenewing: a follower's old renew age counts too
          (
            leader_gate_last_renew_age_seconds
            and on (job, instance, lease) leader_gate_leading == 1
          ) > 6
=>
          leader_gate_last_renew_age_seconds > 6
%%
LeaderGateRenewsFailed: `increase` alone misses a process's first step-down
              (
                leader_gate_transitions_total{direction="stopped", reason=~"renew-deadline|api-unreachable"}
                unless
                leader_gate_transitions_total{direction="stopped", reason=~"renew-deadline|api-unreachable"} offset 15m
              )
            or
=>
%%
LeaderGateFlapping: counted per pod, not per Lease
          sum by (namespace, lease) (
            increase(leader_gate_transitions_total{direction="started"}[15m])
          ) > 4
=>
          increase(leader_gate_transitions_total{direction="started"}[15m]) > 4
%%
LeaderGateForbidden: counts every outcome, not only refusals
            increase(leader_gate_api_requests_total{outcome=~"forbidden|unauthorized"}[5m])
=>
            increase(leader_gate_api_requests_total[5m])
%%
LeaderGateDuplicateIdentity: fires on a counter that stays at 0
          max by (namespace, lease) (leader_gate_identity_conflicts_total) > 0
=>
          max by (namespace, lease) (leader_gate_identity_conflicts_total) >= 0
%%
LeaderGateTargetsAbsent: another job's targets hide the missing ones (no job matcher)
          absent_over_time(leader_gate_build_info{job="monitoring/leader-gate"}[5m])
=>
          absent_over_time(leader_gate_build_info[5m])
%%
LeaderGateTargetsAbsent: fires during a rollout that replaces every pod (absent, no window)
          absent_over_time(leader_gate_build_info{job="monitoring/leader-gate"}[5m])
=>
          absent(leader_gate_build_info{job="monitoring/leader-gate"})
%%
LeaderGateCollectorNotRunning: the seconds between two failing leaders reset `for` (no max_over_time)
          max by (namespace, lease) (
            max_over_time(leader_gate_leading_without_collector[1m])
          ) == 1
=>
          max by (namespace, lease) (leader_gate_leading_without_collector) == 1
%%
LeaderGateCollectorNotRunning: fires for a collector restarted at once (no `for`)
          ) == 1
        for: 5m
=>
          ) == 1
        for: 0s
EOF_M
)
cp "$TESTS" "$work/"
caught=0
total=0
while IFS= read -r -d '' mutation; do
    title=${mutation%%$'\n'*}
    total=$((total + 1))
    MUTATION="$mutation" python3 - "$RULES" "$work/leader-gate.rules.yml" <<'PY'
import os, sys
text = os.environ["MUTATION"].split("\n", 1)[1]
old, new = text.split("\n=>", 1)
old = old.strip("\n") + "\n"
new = new.strip("\n") + "\n" if new.strip("\n") else ""
rules = open(sys.argv[1]).read()
if rules.count(old) != 1:
    sys.exit(f"mutation text not found once in {sys.argv[1]}:\n{old}")
open(sys.argv[2], "w").write(rules.replace(old, new))
PY
    # Caught means failed expectations of alerts, not a file promtool
    # cannot load.
    if promtool test rules "$work/$(basename "$TESTS")" >"$work/out" 2>&1; then
        echo "NOT CAUGHT: the tests pass with a broken rule: $title" >&2
    elif failed=$(grep -c '^ *alertname: ' "$work/out"); then
        caught=$((caught + 1))
        echo "caught: $title ($failed failed checks)"
    else
        echo "NOT CAUGHT: promtool failed without a failed alert check: $title" >&2
        cat "$work/out" >&2
    fi
done < <(printf '%s' "$mutations" | awk 'BEGIN { RS = "\n%%\n"; ORS = "\0" } { print }')
echo "broken rules caught by the tests: $caught of $total"
[ "$caught" -eq "$total" ] && [ "$total" -gt 0 ]

prometheusrule >"$work/prometheusrule.yaml"
if ! diff -u "$OPERATOR" "$work/prometheusrule.yaml"; then
    echo "$OPERATOR differs from what $RULES gives: run scripts/check-alerts.sh --write" >&2
    exit 1
fi
echo "$OPERATOR matches $RULES"

python3 - "$DASHBOARD" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        dashboard = json.load(f)
except json.JSONDecodeError as e:
    sys.exit(f"{sys.argv[1]}: not JSON: {e}")
panels = dashboard.get("panels") if isinstance(dashboard, dict) else None
if not panels:
    sys.exit(f"{sys.argv[1]}: no panels")
print(f"{sys.argv[1]}: parses, {len(panels)} panels")
PY
