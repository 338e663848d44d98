"""The sidecars' cost in real pods: CPU and working-set memory from the
kubelet's resource metrics, which `kubectl top` reads too."""

import time


def cost(cluster, workload, seconds=30):
    """Each pod's sidecar: CPU (millicores over `seconds`) and working-set
    memory, from the kubelet's resource metrics (what `kubectl top` reads)."""
    def sample():
        out = {}
        pods = workload.pods(cluster)
        names = {p["metadata"]["name"] for p in pods}
        for node in {p["spec"]["nodeName"] for p in pods}:
            text = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics/resource",
                                   namespaced=False)
            for line in text.splitlines():
                if not line.startswith(("container_cpu_usage_seconds_total{", "container_memory_working_set_bytes{")):
                    continue
                name, _, rest = line.partition("{")
                labels = dict(kv.split("=", 1) for kv in rest.split("}")[0].split(","))
                labels = {k: v.strip('"') for k, v in labels.items()}
                if labels.get("pod") in names and labels.get("container") == "leader-gate":
                    out[(labels["pod"], name)] = float(rest.split("}")[1].split()[0])
        return time.time(), out

    t0, a = sample()
    time.sleep(seconds)
    t1, b = sample()
    holder = workload.holder(cluster)
    rows = []
    for (pod, metric), value in sorted(b.items()):
        if metric != "container_cpu_usage_seconds_total" or (pod, metric) not in a:
            continue
        rows.append({
            "workload": workload.name, "pod": pod, "role": "leader" if pod == holder else "follower",
            "cpu_millicores": round((value - a[(pod, metric)]) / (t1 - t0) * 1000, 2),
            "working_set_mib": round(b.get((pod, "container_memory_working_set_bytes"), 0) / 2**20, 2),
        })
    return rows
