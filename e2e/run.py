#!/usr/bin/env python3
"""leader-gate's end-to-end suite: deploys the shipped manifests with a real
collector into a namespace of its own on the cluster KUBECONFIG names, runs a
seeded schedule of faults until the gated groups have handed over at least
--handovers times, and judges duplicated and missed collection intervals and
failed routed requests from the recorder's record alone (e2e/verdict.py).
Prints a table, writes JSON, removes what it deployed. docs/e2e.md says how
to run it and what each number means.

    python3 e2e/run.py --handovers 100 --seed 1 [--kill-command ...] [--out DIR]

Exit 0: every bound held; 1: a bound broke (the table and JSON say which);
2: the run itself failed (a fault that never settled, a cluster error).
"""

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import yaml  # noqa: E402

import deploy  # noqa: E402
from cluster import Cluster, Failed, Workload  # noqa: E402
from cost import cost  # noqa: E402
from logs import PodLogs  # noqa: E402
from record import Record  # noqa: E402
import faults  # noqa: E402
import verdict  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", os.path.expanduser("~/.kube/config")))
    ap.add_argument("--namespace", default="leader-gate-e2e")
    ap.add_argument("--handovers", type=int, default=100, help="run faults until this many hand-overs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=int, default=10, help="Prometheus' scrape interval, seconds")
    ap.add_argument("--leader-gate-image", default="ghcr.io/leader-gate/leader-gate:0.1.0")
    ap.add_argument("--prometheus-image", default="prom/prometheus:v2.53.0")
    ap.add_argument("--statsd-exporter-image", default="prom/statsd-exporter:v0.26.1")
    ap.add_argument("--busybox-image", default="busybox:1.36", help="the recorder and the client")
    ap.add_argument("--statsd-stand-in", action="store_true",
                    help="run the routed Deployment's app as busybox httpd (a cluster that cannot pull statsd-exporter)")
    ap.add_argument("--kill-command", default=None,
                    help="SIGKILL a container through the runtime: a shell command with {node}, {node_number}, "
                         "{container}; without it the kill-* faults are left out, and the report says so")
    ap.add_argument("--kinds", default=",".join(faults.KINDS), help="fault kinds, comma-separated")
    ap.add_argument("--leader-gate", default=os.path.join(ROOT, "target", "debug", "leader-gate"),
                    help="the leader-gate binary `handover` runs from here")
    ap.add_argument("--workloads", default="exec,route,file_sd",
                    help="which gated groups: exec (Prometheus), route (statsd-exporter), file_sd (Prometheus)")
    ap.add_argument("--out", default="e2e-results")
    ap.add_argument("--keep", action="store_true", help="leave the namespace in place")
    args = ap.parse_args()

    kinds = [k for k in args.kinds.split(",") if k]
    left_out = {}
    if not args.kill_command:
        for k in faults.RUNTIME_KINDS:
            if k in kinds:
                kinds.remove(k)
                left_out[k] = "no --kill-command: this cluster's runtime is not reachable from here"
    os.makedirs(args.out, exist_ok=True)
    cluster = Cluster(args.kubeconfig, args.namespace, args.leader_gate)
    ns = args.namespace
    started = time.time()
    work = tempfile.mkdtemp(prefix="leader-gate-e2e-")
    rendered = os.path.join(work, "rendered.yaml")
    log = open(os.path.join(args.out, "faults.log"), "w")

    def say(text):
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    # The shipped lease timings of the two workloads (manifests/): the
    # defaults, which neither overrides.
    nodes = len(json.loads(cluster.kubectl("get", "nodes", "-o", "json", namespaced=False))["items"])
    pod_kinds = [k for k in kinds if k not in ("drain", "scale-down-up")]  # a DaemonSet's
    exec_w = Workload("prometheus (exec)", "Deployment", "e2e-otel-cluster-collector", "otel-cluster-collector",
                      "collector", 2, routed=False, kinds=kinds)
    route_w = Workload("statsd-exporter (route)", "Deployment", "e2e-statsd-exporter", "statsd-exporter",
                       "statsd-exporter", 3, routed=True, kinds=kinds)
    file_w = Workload("prometheus (file_sd)", "DaemonSet", "e2e-metricbeat", "metricbeat",
                      "metricbeat", nodes, routed=False, kinds=pod_kinds)
    chosen = set(args.workloads.split(","))
    workloads = [w for w in (exec_w, route_w, file_w) if w.name.split("(")[1].rstrip(")") in chosen]
    record = Record(cluster, route_w.label)
    pod_logs = PodLogs(cluster, args.out)
    code = 0
    try:
        cluster.kubectl("create", "namespace", ns, namespaced=False, check=False)
        cluster.kubectl("apply", "-f", "-", stdin=yaml_stream(deploy.recorder_objects(ns, args.busybox_image)))
        cluster.kubectl("rollout", "status", "deployment/e2e-recorder", "--timeout=180s")
        recorder_ip = cluster.json("get", "service", "e2e-recorder")["spec"]["clusterIP"]
        images = {"leader-gate": args.leader_gate_image, "prometheus": args.prometheus_image,
                  "statsd-exporter": args.busybox_image if args.statsd_stand_in else args.statsd_exporter_image}
        deploy.overlay(os.path.join(work, "overlay"), os.path.join(ROOT, "manifests"), ns, images,
                       recorder_ip, args.interval, args.statsd_stand_in)
        docs = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", os.path.join(work, "overlay"),
                                                                namespaced=False)) if d]
        deploy.file_sd(docs, f"{recorder_ip}:8080", args.interval)
        wanted = {w.deployment for w in workloads}
        docs = [d for d in docs if d["kind"] not in ("Deployment", "DaemonSet") or d["metadata"]["name"] in wanted]
        with open(rendered, "w") as f:
            yaml.safe_dump_all(docs, f)
        cluster.kubectl("apply", "-f", rendered, namespaced=False)
        # The Lease names and timings as the overlay left them (a prefix
        # moves some names).
        for w in workloads:
            w.lease, w.lease_duration, w.retry_period = deploy.sidecar_flags(docs, w.kind, w.deployment)
            say(f"{w.name}: {w.kind} {w.deployment}, Lease {w.lease} "
                f"({w.lease_duration}s/{w.retry_period}s)")
        service_ip = cluster.json("get", "service", "e2e-statsd-exporter")["spec"]["clusterIP"]
        # The client asks the routed Service even when the routed workload
        # is not in this run (it then fails every request, judged nowhere).
        cluster.kubectl("apply", "-f", "-", stdin=yaml_stream(deploy.client_objects(ns, args.busybox_image, service_ip)))
        for w in workloads:
            cluster.kubectl("rollout", "status", w.ref, "--timeout=300s")
        cluster.wait(lambda: cluster.pod("e2e-client")["status"]["phase"] == "Running", 120, "client running")
        recorder = exec_w_pod(cluster, "e2e-recorder")
        rtt = record.clock(recorder)
        say(f"clock: recorder uptime + {record.offset:.3f} (round trip {rtt * 1000:.0f} ms)")
        threading.Thread(target=record.watch, args=("e2e-client", pod_logs.poll), daemon=True).start()

        def evidence(w, holder, since):
            if w.routed:
                return any(ok and who == holder for _, ok, who in record.requests("e2e-client", since, tail=40))
            return any(record.pod_of_ip(ip, t) == holder for t, ip in record.scrapes(recorder, since, tail=10))

        say("waiting for both groups to work")
        for w in workloads:
            cluster.wait(lambda w=w: w.settled(cluster, time.time() - 3 * args.interval, evidence), 300,
                         f"{w.name} settled")
        costs = [r for w in workloads for r in cost(cluster, w)]
        say(f"cost at idle: {json.dumps(costs)}")

        # One thread per workload, each with its own seeded stream of
        # faults, until the groups have handed over --handovers times in
        # all; drains one at a time (two would cordon both nodes).
        schedule, moved, broken = [], [0], []
        lock, drain_lock = threading.Lock(), threading.Lock()

        def faults_on(w, stream):
            while not broken:
                with lock:
                    if moved[0] >= args.handovers:
                        return
                kind = stream.choice(w.kinds)
                leader = w.holder(cluster)
                start = time.time()
                try:
                    if kind == "drain":
                        with drain_lock:
                            what = faults.act(kind, cluster, w, leader, args.kill_command)
                    else:
                        what = faults.act(kind, cluster, w, leader, args.kill_command)
                    cluster.wait(lambda: w.settled(cluster, start, evidence), 300,
                                 f"{w.name} settled after {kind}")
                except (Failed, StopIteration, KeyError) as e:
                    say(f"FAILED: {w.name} {kind}: {e}")
                    with lock:
                        schedule.append({"workload": w.name, "kind": kind, "graceful": faults.KINDS[kind],
                                         "start": start, "end": time.time(), "what": str(e), "settled": False})
                        broken.append(e)
                    return
                time.sleep(args.interval + 1)   # the next scrape after the fault, in its window
                end = time.time()
                now = w.holder(cluster)
                with lock:
                    moved[0] += now != leader
                    schedule.append({"workload": w.name, "kind": kind, "graceful": faults.KINDS[kind],
                                     "start": start, "end": end, "what": what, "settled": True,
                                     "holder_before": leader, "holder_after": now})
                    say(f"{len(schedule):3d} {w.name:24s} {kind:20s} {end - start:5.1f}s {what} -> {now} "
                        f"({moved[0]} moved)")

        threads = [threading.Thread(target=faults_on, args=(w, random.Random(f"{args.seed}/{w.name}")))
                   for w in workloads]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if broken:
            code = 2
        schedule.sort(key=lambda f: f["start"])
        costs += [dict(r, when="after the schedule") for w in workloads for r in cost(cluster, w)]

        scrapes = [(t, record.pod_of_ip(ip, t)) for t, ip in record.scrapes(recorder)]
        # A scrape nobody can be named for could hide a duplicate: it fails the run.
        unnamed = [s for s in scrapes if s[1].startswith("ip:")]
        requests = record.requests("e2e-client")
        first = schedule[0]["start"] if schedule else time.time()
        verdicts = {}
        for w in workloads:
            mine = [f for f in schedule if f["workload"] == w.name]
            if w.routed:
                answered = [(t, who) for t, ok, who in requests if ok and t >= first - 60]
                v = verdict.judge(answered, 1.0, mine, w.lease_duration, w.retry_period,
                                  [r for r in requests if r[0] >= first - 60])
            else:
                pods = w.label
                v = verdict.judge([s for s in scrapes if s[0] >= first - 60 and pods in s[1]], args.interval,
                                  mine, w.lease_duration, w.retry_period)
            verdicts[w.name] = v
        failures = [f"{w}: {f}" for w, v in verdicts.items() for f in v["failures"]]
        failures += [f"a scrape at {t:.2f} from {who}, no pod of the namespace" for t, who in unnamed]
        if failures and code == 0:
            code = 1
        report = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "minutes": round((time.time() - started) / 60, 1),
            "seed": args.seed, "interval": args.interval,
            "leases": {w.name: [w.lease, w.lease_duration, w.retry_period] for w in workloads},
            "kinds": kinds, "left_out": left_out,
            "schedule": schedule, "verdicts": verdicts, "cost": costs, "failures": failures,
        }
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(verdict.table(verdicts, args.interval))
        print("routed Service: the 'interval' is 1 s (the client asks every ~0.3 s)")
        for k, why in left_out.items():
            print(f"left out: {k}: {why}")
        print("cost (leader-gate sidecar):")
        for r in costs:
            print(f"  {r['workload']:24s} {r['role']:8s} {r['cpu_millicores']:6.2f} m  {r['working_set_mib']:6.2f} MiB  {r.get('when', 'idle, before')}")
        for line in failures:
            print("FAIL", line)
        print(f"{'PASS' if code == 0 else 'FAIL'}: {sum(v['totals']['handovers'] for v in verdicts.values())} hand-overs, "
              f"{len(schedule)} faults, {report['minutes']} min; {os.path.join(args.out, 'report.json')}")
    except Failed as e:
        say(f"run failed: {e}")
        code = 2
    finally:
        record.stop.set()
        pod_logs.stop()
        if not args.keep:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", namespaced=False, check=False)
            if os.path.exists(rendered):
                cluster.kubectl("delete", "-f", rendered, "--ignore-not-found", "--wait=false",
                                namespaced=False, check=False)
    return code


def exec_w_pod(cluster, label):
    items = cluster.json("get", "pods", "-l", f"app.kubernetes.io/name={label}")["items"]
    running = [p for p in items if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    if not running:
        raise Failed(f"no running {label} pod")
    return running[0]["metadata"]["name"]


def yaml_stream(docs):
    return "".join("---\n" + json.dumps(d) + "\n" for d in docs)


if __name__ == "__main__":
    sys.exit(main())
