"""The record the verdict is judged from: the recorder's log of scrapes and
the client's log of requests to the routed Service, read through kubectl
exec, and what names the pod behind each line (the namespace's pod IPs
every 2 s; each routed process' start time, asked of the pod itself)."""

import subprocess
import threading
import time

from cluster import Failed


class Record:
    """The recorder's and the client's logs, read through kubectl exec, and
    the pod IP / process identity timeline that names who made each line."""

    def __init__(self, cluster, routed_label):
        self.cluster, self.routed_label = cluster, routed_label
        self.snapshots = []          # (time, {ip: pod})
        self.identities = {}         # process start time -> pod
        self.asked = {}              # pod -> its containers' restarts when last asked
        self.ambiguous = set()       # start times two processes answered with
        self.offset = None           # epoch - uptime
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def clock(self, pod):
        """epoch = uptime + offset, from the exec with the shortest round trip."""
        best = None
        for _ in range(5):
            before = time.time()
            up = float(self.cluster.kubectl("exec", pod, "--", "cat", "/proc/uptime").split()[0])
            after = time.time()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) / 2 - up)
        self.offset = best[1]
        return best[0]

    def watch(self, client, on_pods=None):
        """Every 2 s until stopped: the namespace's pod IPs, the routed
        processes' identities, and the pods handed to `on_pods`."""
        while not self.stop.is_set():
            try:
                items = self.cluster.json("get", "pods")["items"]
                ips = {p["status"]["podIP"]: p["metadata"]["name"] for p in items if p["status"].get("podIP")}
                with self.lock:
                    self.snapshots.append((time.time(), ips))
                if on_pods:
                    try:
                        on_pods(items)
                    except OSError:
                        pass   # a log not followed costs no verdict
                for p in items:
                    name, ip = p["metadata"]["name"], p["status"].get("podIP")
                    # A restarted container is a new process, with a start
                    # time of its own: ask again after every restart.
                    restarts = sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
                    if (p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == self.routed_label
                            and ip and self.asked.get(name) != restarts
                            and p["status"].get("phase") == "Running"):
                        out = self.cluster.kubectl(
                            "exec", client, "--", "sh", "-c",
                            f"(printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n'; sleep 0.2) | nc -w 2 {ip} 9102 "
                            "| grep -m1 '^process_start_time_seconds' | cut -d' ' -f2", check=False).strip()
                        if out:
                            with self.lock:
                                other = self.identities.get(out)
                                if other not in (None, name):
                                    # Two processes with one start time: no
                                    # answer of either can be told apart.
                                    self.ambiguous.add(out)
                                self.identities[out] = name
                                self.asked[name] = restarts
            except (Failed, subprocess.TimeoutExpired, KeyError):
                pass
            self.stop.wait(2)

    def pod_of_ip(self, ip, t):
        with self.lock:
            snaps = list(self.snapshots)
        after = [s for s in snaps if s[0] >= t and ip in s[1]]
        if after:
            return after[0][1][ip]
        before = [s for s in snaps if s[0] < t and ip in s[1]]
        return before[-1][1][ip] if before else f"ip:{ip}"

    def lines(self, pod, path, since=None, tail=None):
        """(time on the suite's clock, value) for each line of a log
        ("UPTIME VALUE") in `pod`, from `since` on; the last `tail` only."""
        cmd = ["cat", path] if tail is None else ["tail", "-n", str(tail), path]
        out = self.cluster.kubectl("exec", pod, "--", *cmd, check=False)
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                t = float(parts[0]) + self.offset
                if since is None or t >= since:
                    rows.append((t, parts[1]))
        return rows

    def scrapes(self, recorder, since=None, tail=None):
        """(time, source address) of each scrape the recorder logged."""
        return self.lines(recorder, "/log/scrapes", since, tail)

    def requests(self, client, since=None, tail=None):
        """(time, answered, pod) of each request the client logged."""
        rows = []
        for t, answer in self.lines(client, "/log/requests", since, tail):
            ok = answer != "FAIL"
            with self.lock:
                if answer in self.ambiguous:
                    raise Failed(f"two routed pods answer with process start time {answer}: "
                                 "their requests cannot be told apart")
                who = self.identities.get(answer, f"process:{answer}") if ok else None
            rows.append((t, ok, who))
        return rows
