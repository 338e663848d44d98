"""Every container's log of every pod in the namespace, kept in the output
directory (`logs/POD.CONTAINER.log`) while the pod lives: a fault replaces
pods, and with them goes the only account of why a hand-over took as long
as it did (the file gate's proof, the sidecar's release). One
`kubectl logs -f` per container instance: a restarted container is
followed again, its lines appended after a line naming the restart."""

import os
import subprocess
import threading


class PodLogs:
    def __init__(self, cluster, out):
        self.cluster, self.dir = cluster, os.path.join(out, "logs")
        os.makedirs(self.dir, exist_ok=True)
        self.followed = {}   # (pod uid, container, restart count) -> kubectl logs -f
        self.lock, self.stopped = threading.Lock(), False

    def poll(self, items):
        """One look at the namespace's pods (`kubectl get pods` items)."""
        with self.lock:
            if not self.stopped:
                self._poll(items)

    def _poll(self, items):
        for proc in self.followed.values():
            proc.poll()   # reaps those whose container ended
        for p in items:
            pod = p["metadata"]["name"]
            for c in p["status"].get("initContainerStatuses", []) + p["status"].get("containerStatuses", []):
                key = (p["metadata"]["uid"], c["name"], c.get("restartCount", 0))
                state = c.get("state", {})
                if key in self.followed or not ("running" in state or "terminated" in state):
                    continue
                path = os.path.join(self.dir, f"{pod}.{c['name']}.log")
                with open(path, "a") as log:
                    log.write(f"=== {pod} {c['name']}, restart {key[2]}\n")
                    log.flush()
                    self.followed[key] = subprocess.Popen(
                        ["kubectl", "-n", self.cluster.namespace, "logs", "-f", pod, "-c", c["name"],
                         "--timestamps"],
                        stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env)

    def stop(self):
        with self.lock:
            self.stopped = True
            for proc in self.followed.values():
                if proc.poll() is None:
                    proc.terminate()
