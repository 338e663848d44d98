"""The cluster the suite runs against, through kubectl (KUBECONFIG), and the
gated workloads in it: their pods, their Lease's holder, and when a group
has settled after a fault."""

import json
import os
import subprocess
import time


class Failed(Exception):
    pass


class Cluster:
    def __init__(self, kubeconfig, namespace, leader_gate):
        self.kubeconfig, self.namespace, self.leader_gate = kubeconfig, namespace, leader_gate
        self.env = dict(os.environ, KUBECONFIG=kubeconfig)

    def run(self, argv, stdin=None, check=True):
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=self.env, timeout=600)
        if check and p.returncode != 0:
            raise Failed(f"{' '.join(argv)[:200]}: exit {p.returncode}: {p.stderr.strip()[:500]}")
        return p.stdout

    def kubectl(self, *args, stdin=None, check=True, namespaced=True):
        ns = ["-n", self.namespace] if namespaced else []
        return self.run(["kubectl", *ns, *args], stdin=stdin, check=check)

    def json(self, *args):
        return json.loads(self.kubectl(*args, "-o", "json"))

    def pod(self, name):
        return self.json("get", "pod", name)

    def wait(self, ok, seconds, what):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if ok():
                    return
            except Failed:
                pass
            time.sleep(1)
        raise Failed(f"timed out after {seconds}s waiting for: {what}")


class Workload:
    """A gated Deployment of the shipped manifests and how its record is read."""

    def __init__(self, name, kind, deployment, label, collector, replicas, routed, kinds):
        self.name, self.kind, self.deployment, self.label = name, kind, deployment, label
        self.collector, self.replicas, self.routed = collector, replicas, routed
        self.kinds = kinds  # the fault kinds that apply to it
        self.lease, self.lease_duration, self.retry_period = None, 15, 2

    @property
    def ref(self):
        return f"{self.kind.lower()}/{self.deployment}"

    def pods(self, cluster, include_terminating=False):
        items = cluster.json("get", "pods", "-l", f"app.kubernetes.io/name={self.label}")["items"]
        return [p for p in items if include_terminating or not p["metadata"].get("deletionTimestamp")]

    def holder(self, cluster):
        try:
            return cluster.json("get", "lease", self.lease)["spec"].get("holderIdentity")
        except Failed:
            return None

    def wait_replacement(self, cluster, gone):
        cluster.wait(lambda: all(p["metadata"]["name"] != gone for p in self.pods(cluster, True)), 240,
                     f"{gone} gone")

    def settled(self, cluster, since, evidence):
        """All replicas Ready and up to date, the holder one of them, and the
        record showing the holder at work since `since`."""
        d = cluster.json("get", self.kind, self.deployment)
        st = d["status"]
        if self.kind == "Deployment":
            if not (st.get("updatedReplicas") == st.get("readyReplicas") == st.get("availableReplicas")
                    == d["spec"]["replicas"] == self.replicas and st.get("replicas") == self.replicas):
                return False
        elif not (st.get("desiredNumberScheduled") == st.get("numberReady") == st.get("updatedNumberScheduled")
                  == st.get("numberAvailable") == self.replicas):
            return False
        pods = self.pods(cluster, include_terminating=True)
        if any(p["metadata"].get("deletionTimestamp") for p in pods):
            return False
        holder = self.holder(cluster)
        if holder not in {p["metadata"]["name"] for p in pods}:
            return False
        return evidence(self, holder, since)
