#!/usr/bin/env python3
"""Resident memory of `leader-gate serve`: idle, and per `/events` subscriber.

    cargo build --example fake_apiserver
    python3 scripts/memory_figures.py BINARY [--rounds N] [--subscribers N,...]
        [--wrk SECONDS] [-- SERVE_FLAGS...]

Starts the tests' fake API server (examples/fake_apiserver.rs, the debug
build in target/), then for each round two sidecars (`pod-a`, `pod-b`,
defaults 15s/10s/2s, RUST_LOG as the tests set it, SERVE_FLAGS added, with
`{pod}` and `{work}` replaced by the pod's name and a scratch directory)
on the Lease `demo-leader`. Every page of BINARY is read into the page
cache first (see below). Once one leads and both have run 8 s, it reads
/proc/PID/smaps_rollup of each: Rss, split into anonymous pages (heap,
stacks, relocated data) and file-backed ones (code and read-only data of
the binary and of libc & co.), and the binary's own file-backed pages by
segment. Then it opens each count of `/events` subscribers on the leader
(raw sockets, each read up to its `state` event), waits a second, and
reads the leader's again: (connected - before) / N is the memory per
subscriber. The subscribers are closed before the next count. With
`--wrk`, a `wrk -t2 -c64` run on the leader's `/leader` follows.

Code pages are faulted in 64 KiB windows of pages already cached, so a
binary's resident code depends on which of its pages the machine keeps
cached (a file just written has all of them): reading it whole first makes
runs comparable. Even then the figure moves by ±150 KiB from run to run
(which windows a run touches), so compare medians of several rounds.

Prints one line per measurement and the medians over the rounds. Another
binary (an older commit's) under the same command gives the before figure.
"""

import argparse
import os
import re
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = os.path.join(ROOT, "target", "debug", "examples", "fake_apiserver")


def rollup(pid):
    """KiB figures of /proc/PID/smaps_rollup (Rss, Anonymous, ...), and
    Binary: the resident pages of the executable's own file mappings
    (its code and read-only data; relocated data is anonymous)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2))
    out["File"] = out["Rss"] - out["Anonymous"]
    exe = os.readlink(f"/proc/{pid}/exe")
    binary, mapping, perms = 0, None, None
    out["segments"] = {}
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                mapping = line.split()[5] if len(line.split()) > 5 else None
                perms = line.split()[1]
            elif mapping == exe:
                m = re.match(r"(Rss|Anonymous):\s+(\d+) kB", line)
                if m:
                    kib = int(m.group(2)) if m.group(1) == "Rss" else -int(m.group(2))
                    binary += kib
                    out["segments"][perms] = out["segments"].get(perms, 0) + kib
    out["Binary"] = binary
    return out


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def wait_line(path, pattern, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                m = re.search(pattern, f.read())
                if m:
                    return m
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"no {pattern!r} in {path}")


def get(addr, path):
    """The status and body of one GET."""
    with socket.create_connection(addr, timeout=2) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def subscribe(addr, n):
    """n sockets on /events, each read up to the end of its state event."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(addr, timeout=10)
        s.sendall(b"GET /events HTTP/1.1\r\nHost: m\r\nAccept: text/event-stream\r\n\r\n")
        socks.append(s)
    pending = {s.fileno(): (s, b"") for s in socks}
    poll = select.poll()
    for fd in pending:
        poll.register(fd, select.POLLIN)
    deadline = time.time() + 60
    while pending:
        if time.time() > deadline:
            raise SystemExit(f"{len(pending)} subscribers got no state event")
        for fd, _ in poll.poll(1000):
            s, text = pending[fd]
            text += s.recv(65536)
            if text.startswith(b"HTTP/1.1 503"):
                raise SystemExit("subscriber refused: " + text.decode(errors="replace"))
            if b"event: state\n" in text and text.split(b"event: state\n", 1)[1].find(b"\n\n") >= 0:
                poll.unregister(fd)
                del pending[fd]
            else:
                pending[fd] = (s, text)
    return socks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--subscribers", default="1000")
    p.add_argument("--wrk", type=int, default=0,
                   help="then this many seconds of `wrk -t2 -c64` on the leader's /leader")
    p.add_argument("serve_args", nargs="*", help="more flags for serve (after --)")
    args = p.parse_args()
    counts = [int(c) for c in args.subscribers.split(",") if c]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 2 * max(counts + [0]) + 1000)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    work = tempfile.mkdtemp(prefix="memory-figures-")
    fake = subprocess.Popen(
        [FAKE, work, "pod-a", "pod-b"],
        stdout=open(os.path.join(work, "fake.out"), "w"),
        stderr=subprocess.STDOUT,
    )
    results = {"idle follower": [], "idle leader": []}
    wrks = []
    per = {n: [] for n in counts}
    try:
        wait_line(os.path.join(work, "fake.out"), r"^ready url=")
        for round_ in range(args.rounds):
            # Every page of the binary in the page cache first: fault-around
            # maps the cached pages of a 64 KiB window around each fault, so
            # without this the figure depends on which pages the machine's
            # other work left cached (a binary just written has all of them).
            with open(args.binary, "rb") as f:
                while f.read(1 << 20):
                    pass
            pods = {}
            for name in ("pod-a", "pod-b"):
                log = os.path.join(work, f"{name}-{round_}.log")
                env = dict(os.environ, KUBECONFIG=os.path.join(work, f"{name}.kubeconfig"),
                           RUST_LOG="info,leader_gate=debug")
                env.pop("POD_NAMESPACE", None)
                env.pop("POD_NAME", None)
                proc = subprocess.Popen(
                    [args.binary, "serve", "--lease-name", "demo-leader", "--identity", name,
                     "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                     "--max-subscribers", str(max(counts + [0]) + 100), *[
                         a.replace("{pod}", name).replace("{work}", work) for a in args.serve_args]],
                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=open(log, "w"),
                )
                pods[name] = (proc, log)
            try:
                gates = {}
                for name, (proc, log) in pods.items():
                    m = wait_line(log, r" listening .*?gate=127\.0\.0\.1:(\d+)")
                    gates[name] = ("127.0.0.1", int(m.group(1)))
                leader = None
                deadline = time.time() + 60
                while leader is None and time.time() < deadline:
                    for name, addr in gates.items():
                        try:
                            status, _ = get(addr, "/leader")
                        except OSError:
                            continue
                        if status == 200:
                            leader = name
                    time.sleep(0.1)
                if leader is None:
                    raise SystemExit("nobody led")
                follower = next(n for n in pods if n != leader)
                time.sleep(8)
                for role, name in (("idle leader", leader), ("idle follower", follower)):
                    pid = pods[name][0].pid
                    r = rollup(pid)
                    r["threads"] = threads(pid)
                    results[role].append(r)
                    print(f"round {round_}: {role}: Rss {r['Rss']} KiB = anon {r['Anonymous']}"
                          f" + file {r['File']} (of which the binary {r['Binary']});"
                          f" threads {r['threads']}; binary by segment {r['segments']}", flush=True)
                lpid = pods[leader][0].pid
                for n in counts:
                    before = rollup(lpid)
                    socks = subscribe(gates[leader], n)
                    time.sleep(1)
                    after = rollup(lpid)
                    each = (after["Rss"] - before["Rss"]) / n
                    anon = (after["Anonymous"] - before["Anonymous"]) / n
                    per[n].append((each, anon))
                    print(f"round {round_}: {n} subscribers: Rss {before['Rss']} -> {after['Rss']} KiB,"
                          f" {each:.2} KiB each (anon {anon:.2})", flush=True)
                    for s in socks:
                        s.close()
                    time.sleep(1)
                if args.wrk:
                    host, port = gates[leader]
                    out = subprocess.run(
                        ["wrk", "-t2", "-c64", f"-d{args.wrk}s", "--latency",
                         f"http://{host}:{port}/leader"],
                        capture_output=True, text=True, check=True).stdout
                    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
                    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)
                    wrks.append(rps)
                    print(f"round {round_}: wrk: {rps:.0f} requests/s, p99 {p99}", flush=True)
            finally:
                for proc, _ in pods.values():
                    proc.terminate()
                for proc, _ in pods.values():
                    proc.wait(timeout=20)
    finally:
        fake.terminate()
        fake.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds, {args.binary} ({os.path.getsize(args.binary)} bytes):")
    for role, rs in results.items():
        if rs:
            med = {k: statistics.median(r[k] for r in rs)
                   for k in ("Rss", "Anonymous", "File", "Binary", "threads")}
            rng = (min(r["Rss"] for r in rs), max(r["Rss"] for r in rs))
            print(f"  {role}: Rss {med['Rss']:.0f} KiB (range {rng[0]}-{rng[1]}) ="
                  f" anon {med['Anonymous']:.0f} + file {med['File']:.0f}"
                  f" (of which the binary {med['Binary']:.0f}); threads {med['threads']:.0f}")
    if wrks:
        print(f"  wrk /leader: {statistics.median(wrks):.0f} requests/s"
              f" (range {min(wrks):.0f}-{max(wrks):.0f})")
    for n, v in per.items():
        if v:
            print(f"  {n} subscribers: {statistics.median(e for e, _ in v):.2f} KiB each"
                  f" (anon {statistics.median(a for _, a in v):.2f}; range"
                  f" {min(e for e, _ in v):.2f}-{max(e for e, _ in v):.2f})")


if __name__ == "__main__":
    sys.exit(main())
