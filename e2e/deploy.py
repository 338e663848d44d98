"""What the suite deploys: the shipped manifests (manifests/, through
kustomize) in a namespace of their own, with a real collector in place of
the examples' ones, plus the recorder and the routed Service's client.

- `otel-cluster-collector` (manifests/exec-gate.yaml, the `exec` gate):
  Prometheus instead of the OpenTelemetry Collector, under the same
  `leader-gate exec`, scraping the recorder every INTERVAL.
- `statsd-exporter` (manifests/deployment-routing.yaml, the route gate):
  as shipped; a client sends it a request through its Service every
  quarter second and logs which process answered.
- `metricbeat` (manifests/metricbeat-daemonset.yaml, the file gate): its
  Metricbeat replaced by Prometheus, whose `file_sd` job reads the
  directory the file gate places `cluster.json` in (docs/gates.md's
  Prometheus `file_sd` way), with the DaemonSet's own timings.
- The Metricbeat cluster-split example is left out; the RBAC, the
  FlowSchema and the NetworkPolicies come along.
- `e2e-recorder`: the cluster-wide target. busybox httpd with a CGI script
  that logs each request's time (the node's /proc/uptime) and source IP.
"""

import os

import yaml

RECORDER_CGI = """\
#!/bin/sh
# One line per request: the node's uptime (10 ms) and who asked.
a=${REMOTE_ADDR#[}; a=${a%]}; echo "$(cut -d' ' -f1 /proc/uptime) ${a#::ffff:}" >> /log/scrapes
printf 'Content-Type: text/plain\\r\\n\\r\\n# HELP e2e_target_up The suite's recorder.\\ne2e_target_up 1\\n'
"""

CLIENT = """\
# A request through the Service every quarter second: its time (uptime),
# and the answering process' start time, or FAIL.
while true; do
  t=$(cut -d' ' -f1 /proc/uptime)
  r=$( (printf 'GET /metrics HTTP/1.0\\r\\nHost: e2e\\r\\n\\r\\n'; sleep 0.2) | nc -w 2 "$SERVICE" 9102 2>/dev/null \\
       | grep -m1 '^process_start_time_seconds' | cut -d' ' -f2)
  echo "$t ${r:-FAIL}" >> /log/requests
  sleep 0.05
done
"""

# The kit's busybox stand-in for statsd-exporter: serves /metrics with a
# process start time of its own, as the real one does (its identity here).
# The uptime's 10 ms are too coarse for two pods a rollout starts on one
# node at once: random digits below them keep each apart.
STANDIN = """\
mkdir -p /tmp/w/-; echo ok > /tmp/w/-/healthy
printf 'process_start_time_seconds %s%06d\\n' "$(cut -d' ' -f1 /proc/uptime)" "$(( $(od -An -N3 -tu4 /dev/urandom) % 1000000 ))" > /tmp/w/metrics
exec httpd -f -p 9102 -h /tmp/w
"""


def prometheus_config(recorder, interval):
    return yaml.safe_dump({
        "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{max(1, interval // 2)}s"},
        "scrape_configs": [{
            "job_name": "cluster",
            "metrics_path": "/cgi-bin/metrics",
            "static_configs": [{"targets": [recorder]}],
        }],
    })


# PHASE: Prometheus scrapes a target at an offset within the interval drawn
# from a hash of the target, its own FQDN and its external labels
# (scrape.Manager's jitter seed). Pods of one group given one hostname
# (`spec.hostname`, which the pod's /etc/hosts resolves) and the same
# external labels scrape at the same offset: the new leader's first scrape
# comes where the old leader's next one would have, not anywhere within the
# interval (docs/gates.md, Prometheus).


def overlay(directory, manifests, namespace, images, recorder_ip, interval, standin):
    """Writes the kustomization into `directory` (manifests linked in)."""
    os.makedirs(directory, exist_ok=True)
    link = os.path.join(directory, "project")
    if not os.path.islink(link):
        os.symlink(os.path.abspath(manifests), link)
    # The Metricbeat cluster-split example has no place here; the
    # DaemonSet stays, its Metricbeat replaced by Prometheus (file_sd()).
    delete = [
        ("apps/v1", "Deployment", "metricbeat-cluster"),
        ("v1", "ServiceAccount", "metricbeat-cluster"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "metricbeat-cluster"),
        ("rbac.authorization.k8s.io/v1", "Role", "metricbeat-cluster-leader-gate"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "metricbeat-cluster-leader-gate"),
        ("policy/v1", "PodDisruptionBudget", "metricbeat-cluster"),
    ] + [("v1", "ConfigMap", n) for n in (
        "metricbeat-cluster-base-modules", "metricbeat-cluster-config", "metricbeat-cluster-leader-only")]
    patches = []
    for api, kind, name in delete:
        doc = {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "monitoring"},
               "$patch": "delete"}
        if kind.startswith("Cluster"):
            del doc["metadata"]["namespace"]
        patches.append({"patch": yaml.safe_dump(doc)})
    command = ["/gate/leader-gate", "exec", "--log-format=json", "--grace", "3s", "--",
               "/bin/prometheus", "--config.file=/conf/prometheus.yml",
               "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090",
               # Discovered targets reach the scrape loops within 1 s, not 5 s.
               "--scrape.discovery-reload-interval=1s"]
    patches.append({
        "target": {"kind": "Deployment", "name": "otel-cluster-collector"},
        "patch": yaml.safe_dump([
            {"op": "replace", "path": "/spec/template/spec/containers/0/command", "value": command},
            {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "tsdb", "mountPath": "/prometheus"}},
            {"op": "add", "path": "/spec/template/spec/volumes/-",
             "value": {"name": "tsdb", "emptyDir": {"sizeLimit": "256Mi"}}},
            # One phase for every replica (PHASE below).
            {"op": "add", "path": "/spec/template/spec/hostname", "value": "prometheus-exec"},
        ]),
    })
    patches.append({"patch": yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "otel-cluster-collector", "namespace": "monitoring"},
        "data": {"prometheus.yml": prometheus_config(f"{recorder_ip}:8080", interval)},
    })})
    if standin:
        patches.append({
            "target": {"kind": "Deployment", "name": "statsd-exporter"},
            "patch": yaml.safe_dump([
                {"op": "add", "path": "/spec/template/spec/containers/0/command",
                 "value": ["sh", "-c", STANDIN]},
                {"op": "remove", "path": "/spec/template/spec/containers/0/args"},
                {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
                 "value": {"name": "stand-in", "mountPath": "/tmp/w"}},
                {"op": "add", "path": "/spec/template/spec/volumes/-",
                 "value": {"name": "stand-in", "emptyDir": {"sizeLimit": "1Mi"}}},
            ]),
        })
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "namePrefix": "e2e-",
        "resources": ["project"],
        "images": [
            {"name": "ghcr.io/leader-gate/leader-gate", **split(images["leader-gate"])},
            {"name": "otel/opentelemetry-collector-contrib", **split(images["prometheus"])},
            {"name": "prom/statsd-exporter", **split(images["statsd-exporter"])},
            {"name": "docker.elastic.co/beats/metricbeat", **split(images["prometheus"])},
        ],
        "patches": patches,
    }
    with open(os.path.join(directory, "kustomization.yaml"), "w") as f:
        yaml.safe_dump(kustomization, f, sort_keys=False)


def split(image):
    """kustomize's images entry for a full reference."""
    name, _, tag = image.rpartition(":")
    if "/" in tag or not name:
        return {"newName": image}
    return {"newName": name, "newTag": tag}


def recorder_objects(namespace, image):
    labels = {"app.kubernetes.io/name": "e2e-recorder"}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "e2e-recorder", "namespace": namespace},
         "data": {"metrics": RECORDER_CGI}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "e2e-recorder", "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 8080, "targetPort": 8080}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "e2e-recorder", "namespace": namespace, "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {
                 "enableServiceLinks": False,
                 "containers": [{
                     "name": "recorder", "image": image,
                     "command": ["sh", "-c", "mkdir -p /www/cgi-bin && cp /cgi/metrics /www/cgi-bin/ && "
                                 "chmod 755 /www/cgi-bin/metrics && exec httpd -f -p 8080 -h /www"],
                     "volumeMounts": [{"name": "cgi", "mountPath": "/cgi"}, {"name": "log", "mountPath": "/log"},
                                      {"name": "www", "mountPath": "/www"}],
                 }],
                 "volumes": [{"name": "cgi", "configMap": {"name": "e2e-recorder"}},
                             {"name": "log", "emptyDir": {}}, {"name": "www", "emptyDir": {}}],
             }}}},
    ]


def client_objects(namespace, image, service_ip):
    labels = {"app.kubernetes.io/name": "e2e-client"}
    return [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "e2e-client", "namespace": namespace, "labels": labels},
         "spec": {
             "enableServiceLinks": False,
             "containers": [{
                 "name": "client", "image": image, "command": ["sh", "-c", CLIENT],
                 "env": [{"name": "SERVICE", "value": service_ip}],
                 "volumeMounts": [{"name": "log", "mountPath": "/log"}],
             }],
             "volumes": [{"name": "log", "emptyDir": {}}],
         }},
    ]


def sidecar_flags(docs, kind, name):
    """The rendered workload's sidecar: its Lease name, lease duration and
    retry period (seconds; the defaults when it sets none)."""
    for doc in docs:
        if doc and doc["kind"] == kind and doc["metadata"]["name"] == name:
            spec = doc["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                args = c.get("args", [])
                if args[:1] == ["serve"] and "--lease-name" in args:
                    flag = lambda f, default: next(
                        (int(a.split("=", 1)[1].rstrip("s")) for a in args if a.startswith(f + "=")), default)
                    return (args[args.index("--lease-name") + 1],
                            flag("--lease-duration", 15), flag("--retry-period", 2))
    raise ValueError(f"no leader-gate serve in {kind} {name}")


FILE_SD_DIR = "/usr/share/metricbeat/modules.d"


def file_sd(docs, recorder, interval):
    """The DaemonSet's Metricbeat made Prometheus with a leader-only
    `file_sd` job (in the rendered documents, in place): the file gate
    places `cluster.json` (the recorder as target) where Metricbeat's
    leader-only module went, and the sidecar checks Prometheus' health."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs if d}
    config = by[("ConfigMap", "e2e-metricbeat-config")]
    config["data"]["prometheus.yml"] = yaml.safe_dump({
        "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{max(1, interval // 2)}s"},
        "scrape_configs": [{
            "job_name": "cluster",
            "metrics_path": "/cgi-bin/metrics",
            "file_sd_configs": [{"files": [f"{FILE_SD_DIR}/*.json"]}],
        }],
    })
    by[("ConfigMap", "e2e-metricbeat-leader-only")]["data"] = {
        "cluster.json": '[{"targets": ["%s"]}]\n' % recorder}
    pod = by[("DaemonSet", "e2e-metricbeat")]["spec"]["template"]["spec"]
    for c in pod["initContainers"]:
        if c["name"] == "leader-gate":
            c["args"] = ["--collector-health-url=http://127.0.0.1:9090/-/healthy"
                         if a.startswith("--collector-health-url=") else a for a in c["args"]]
        if c["name"] == "file-gate":
            # Prometheus' own proof that the job's targets are gone, in place
            # of Metricbeat's.
            status = {"--status-url": "http://127.0.0.1:9090/metrics",
                      "--stopped-when": 'prometheus_target_scrape_pool_targets{scrape_job="cluster"} == 0'}
            c["args"] = [f"/etc/leader-only/cluster.json:{FILE_SD_DIR}/cluster.json"
                         if ":" in a and not a.startswith("-")
                         else f"{a.split('=')[0]}={status[a.split('=')[0]]}" if a.split("=")[0] in status
                         else a for a in c["args"]]
            assert all(any(a.startswith(k + "=") for a in c["args"]) for k in status), c["args"]
    # One phase for every pod (PHASE below).
    pod["hostname"] = "prometheus-file-sd"
    collector = pod["containers"][0]
    collector["args"] = ["--config.file=/etc/metricbeat/prometheus.yml",
                         "--storage.tsdb.path=/usr/share/metricbeat/data", "--web.listen-address=:9090",
                         # Discovered targets reach the scrape loops within 1 s, not 5 s.
                         "--scrape.discovery-reload-interval=1s"]
    collector.pop("command", None)
