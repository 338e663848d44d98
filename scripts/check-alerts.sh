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
# 4. monitoring/leader-gate-dashboard.json parses as JSON;
# 5. the scrape config in the rules file's header (plain
#    kubernetes_sd_configs and the relabelling the rules need) passes
#    `promtool check config`. Debian's promtool is built without Kubernetes
#    discovery: it then checks the config with the pod's discovery labels
#    given as a static target instead (tests/it/monitoring_files.rs scrapes
#    a sidecar through it and checks the labels it gives).
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
LeaderGateFollowerCollectorUnhealthy: fires on a leader too (no leading term)
          (leader_gate_collector_healthy + leader_gate_leading) == 0
=>
          leader_gate_collector_healthy == 0
%%
LeaderGateFollowerCollectorUnhealthy: fires on a collector restarted within minutes (no `for`)
          (leader_gate_collector_healthy + leader_gate_leading) == 0
        for: 10m
=>
          (leader_gate_collector_healthy + leader_gate_leading) == 0
        for: 0s
%%
LeaderGateGateRestarting: fires on one restart (an upgrade)
          ) >= 2
=>
          ) >= 1
%%
LeaderGateGateRestarting: counted per pod, not per Lease (a broken collector passed around)
          sum by (namespace, lease) (
            increase(leader_gate_gate_disconnects_while_leading_total[15m])
          ) >= 2
=>
          increase(leader_gate_gate_disconnects_while_leading_total[15m]) >= 2
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

# The header's scrape config, uncommented.
sed -n '/^# scrape-config-begin$/,/^# scrape-config-end$/p' "$RULES" | sed '1d;$d' | sed -E 's/^# ?//' >"$work/scrape.yml"
grep -q kubernetes_sd_configs "$work/scrape.yml" || { echo "$RULES: no scrape config between scrape-config-begin and -end" >&2; exit 1; }
if promtool check config "$work/scrape.yml" >"$work/out" 2>&1; then
    echo "the scrape config in $RULES passes promtool check config"
elif grep -q 'field kubernetes_sd_configs not found' "$work/out"; then
    # This promtool cannot discover Kubernetes pods: the same config with
    # a static target carrying a pod's discovery labels.
    python3 - "$work/scrape.yml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = "    kubernetes_sd_configs:\n      - role: pod\n"
if text.count(old) != 1:
    sys.exit(f"expected once in the scrape config:\n{old}")
new = ("    static_configs:\n      - targets: [\"10.0.0.1:4041\"]\n        labels:\n"
       "          __meta_kubernetes_pod_container_port_name: admin\n"
       "          __meta_kubernetes_namespace: monitoring\n"
       "          __meta_kubernetes_pod_name: metricbeat-a\n")
open(path, "w").write(text.replace(old, new))
PY
    promtool check config "$work/scrape.yml"
    echo "the scrape config in $RULES passes promtool check config (discovery as a static target: this promtool has no Kubernetes discovery)"
else
    cat "$work/out" >&2
    exit 1
fi
