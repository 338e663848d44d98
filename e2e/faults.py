"""The fault schedule's kinds: what each does to a gated workload, and
whether it is graceful (the pod is told, and hands over) or forced (it is
not). e2e/verdict.py holds each kind to its bound: a graceful one misses at
most one collection interval per hand-over, a forced one at most
ceil((lease duration + retry period) / interval) + 1.

Every kind acts on the pod holding the workload's Lease at the time, but
scale-down-up, which leaves the choice of pod to the ReplicaSet.
"""

import time

# kind: graceful
KINDS = {
    "rollout-restart": True,      # kubectl rollout restart: every pod replaced
    "delete-leader": True,        # kubectl delete pod: preStop hand-over, SIGTERM
    "handover": True,             # leader-gate handover: the holder steps aside
    "drain": True,                # kubectl drain the leader's node (this workload's pods), uncordon
    "scale-down-up": True,        # scale to 1 and back
    "force-delete-leader": False,  # --grace-period=0 --force: the API object goes at once
    "kill-sidecar": False,        # SIGKILL the leader's leader-gate container (the runtime)
    "kill-collector": False,      # SIGKILL the leader's collector container (the runtime)
    "lease-edit": False,          # the Lease's holder rewritten by hand
}

RUNTIME_KINDS = ("kill-sidecar", "kill-collector")


def act(kind, cluster, workload, leader, kill_command):
    """Does `kind` to `workload` whose Lease `leader` holds; returns what it
    did, in words."""
    ns, deploy = cluster.namespace, workload.deployment
    if kind == "rollout-restart":
        cluster.kubectl("rollout", "restart", workload.ref)
        cluster.kubectl("rollout", "status", workload.ref, "--timeout=300s")
        return f"rollout restart of {deploy}"
    if kind == "delete-leader":
        cluster.kubectl("delete", "pod", leader, "--wait=false")
        return f"deleted {leader}"
    if kind == "force-delete-leader":
        cluster.kubectl("delete", "pod", leader, "--grace-period=0", "--force", "--wait=false")
        return f"force-deleted {leader}"
    if kind == "handover":
        # To a Ready peer: a Lease names its successor only once one has
        # said so, which a group just rolled may not have yet.
        peer = next(p["metadata"]["name"] for p in workload.pods(cluster)
                    if p["metadata"]["name"] != leader
                    and all(c.get("ready") for c in p["status"].get("containerStatuses", [])))
        cluster.run([cluster.leader_gate, "handover", "--lease-name", workload.lease,
                     "--lease-namespace", ns, "--to", peer, "--timeout=60s"])
        return f"leader-gate handover from {leader} to {peer}"
    if kind == "drain":
        node = cluster.pod(leader)["spec"]["nodeName"]
        try:
            cluster.kubectl("drain", node, f"--pod-selector=app.kubernetes.io/name={workload.label}",
                            "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s")
            workload.wait_replacement(cluster, leader)
        finally:
            cluster.kubectl("uncordon", node)
        return f"drained {node} of {leader}"
    if kind == "scale-down-up":
        cluster.kubectl("scale", f"deployment/{deploy}", "--replicas=1")
        cluster.wait(lambda: len(workload.pods(cluster, include_terminating=True)) == 1, 240,
                     "scaled to 1")
        cluster.kubectl("scale", f"deployment/{deploy}", f"--replicas={workload.replicas}")
        return f"scaled {deploy} to 1 and back to {workload.replicas}"
    if kind in RUNTIME_KINDS:
        container = "leader-gate" if kind == "kill-sidecar" else workload.collector
        pod = cluster.pod(leader)
        node = pod["spec"]["nodeName"]
        statuses = pod["status"].get("containerStatuses", []) + pod["status"].get("initContainerStatuses", [])
        cid = next(s["containerID"] for s in statuses if s["name"] == container)
        cid = cid.split("://", 1)[1]
        digits = "".join(c for c in node if c.isdigit()) or "0"
        command = kill_command.format(node=node, node_number=digits[-1], container=cid)
        cluster.run(["sh", "-c", command])
        return f"SIGKILLed {leader}/{container} on {node}"
    if kind == "lease-edit":
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        cluster.kubectl("patch", "lease", workload.lease, "--type=merge", "-p",
                        '{"spec":{"holderIdentity":"e2e-intruder","renewTime":"%s","acquireTime":"%s"}}' % (now, now))
        return f"Lease {workload.lease} rewritten to holder e2e-intruder"
    raise ValueError(kind)
