#!/usr/bin/env bash
# What a shorter --scrape.discovery-reload-interval costs Prometheus itself:
# Debian's prometheus with one file_sd job (one target, itself), idle, for
# SECONDS (default 120) with each interval; prints its own CPU seconds and
# resident memory at the end (process_cpu_seconds_total,
# process_resident_memory_bytes). Median of RUNS (default 3) per interval.
#   bash scripts/prometheus-reload-cost.sh            # 5s and 1s
#   SECONDS_EACH=60 RUNS=1 bash scripts/prometheus-reload-cost.sh
set -euo pipefail
each=${SECONDS_EACH:-120}
runs=${RUNS:-3}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
echo "| --scrape.discovery-reload-interval | CPU s over ${each} s (median of ${runs}) | resident MiB |"
echo "|---|---|---|"
for interval in 5s 1s; do
  cpus=(); rss=()
  for run in $(seq "$runs"); do
    port=$((19090 + run))
    dir="$work/$interval-$run"; mkdir -p "$dir/sd"
    printf '[{"targets": ["127.0.0.1:%s"]}]\n' "$port" > "$dir/sd/cluster.json"
    printf 'global: {scrape_interval: 10s}\nscrape_configs:\n  - job_name: cluster\n    file_sd_configs: [{files: ["%s/sd/*.json"]}]\n' "$dir" > "$dir/prometheus.yml"
    prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
      --web.listen-address="127.0.0.1:$port" --scrape.discovery-reload-interval="$interval" \
      --log.level=warn 2>/dev/null &
    pid=$!
    until curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null; do sleep 0.2; done
    start=$(metric "$port" process_cpu_seconds_total)
    sleep "$each"
    end=$(metric "$port" process_cpu_seconds_total)
    cpus+=("$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')")
    rss+=("$(awk -v r="$(metric "$port" process_resident_memory_bytes)" 'BEGIN {print r / 1048576}')")
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
  median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  printf '| %s | %.2f | %.1f |\n' "$interval" "$(median "${cpus[@]}")" "$(median "${rss[@]}")"
done
