#!/bin/bash
# User-space instructions per `GET /leader` request, counted by callgrind:
# repeatable whatever else the machine does (wall-clock figures on shared
# cores move by a third from run to run), to compare builds of the request
# path. A `leader-gate serve` under valgrind contends for a Lease of its
# own on the cluster KUBECONFIG names (the development kit, kind), leads,
# and answers N requests (default 20,000) over 16 keep-alive connections
# from a fixed-count client; the counters are zeroed after a warm-up and
# dumped after the N.
#
#   KUBECONFIG=~/.kube/config bash scripts/leader-instructions.sh target/release/leader-gate [N]
#
# Needs valgrind (Debian's) and python3; writes callgrind.leader.out.* in
# a temporary directory, whose path it prints (callgrind_annotate reads it).
# The Lease (`leader-instructions`) stays behind, released.
set -euo pipefail
BIN=$(realpath "${1:?usage: leader-instructions.sh BINARY [N]}")
N=${2:-20000}
NS=${LEASE_NAMESPACE:-default}
PORT=${PORT:-14041}
WORK=$(mktemp -d)
CLIENT=$WORK/client.py
cat > "$CLIENT" <<'PY'
import selectors, socket, sys
host, port, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
req = f"GET /leader HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
sel, bufs, sent, done = selectors.DefaultSelector(), {}, 0, 0
def complete(b):
    head, sep, body = b.partition(b"\r\n\r\n")
    if not sep:
        return None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
            return len(head) + 4 + length if len(body) >= length else None
    raise SystemExit("an answer without Content-Length")
for _ in range(c):
    s = socket.create_connection((host, port)); s.setblocking(False)
    sel.register(s, selectors.EVENT_READ); bufs[s] = b""; s.sendall(req); sent += 1
while done < n:
    for key, _ in sel.select():
        s = key.fileobj
        data = s.recv(65536)
        if not data:
            raise SystemExit("the server closed a connection")
        bufs[s] += data
        while (end := complete(bufs[s])) is not None:
            bufs[s] = bufs[s][end:]; done += 1
            if sent < n:
                s.sendall(req); sent += 1
PY
OUT=$WORK/callgrind.leader.out
POD_NAMESPACE=$NS valgrind --tool=callgrind --callgrind-out-file="$OUT" "$BIN" serve \
  --lease-name leader-instructions --lease-namespace "$NS" --identity "leader-instructions-$$" \
  --listen 127.0.0.1:$((PORT - 1)) --admin-listen 127.0.0.1:$PORT > "$WORK/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -s "http://127.0.0.1:$PORT/leader" 2>/dev/null | grep -q '"leading":true' && break
  sleep 1
done
curl -s "http://127.0.0.1:$PORT/leader" | grep -q '"leading":true' || { echo "never led: $WORK/serve.log" >&2; exit 1; }
python3 "$CLIENT" 127.0.0.1 "$PORT" 2000 16        # warm-up
callgrind_control -z "$SERVE" > /dev/null 2>&1
python3 "$CLIENT" 127.0.0.1 "$PORT" "$N" 16
callgrind_control -d "$SERVE" > /dev/null 2>&1
kill -TERM "$SERVE"; wait "$SERVE" 2>/dev/null || true
DUMP=$(ls -t "$OUT".* | head -1)
TOTAL=$(callgrind_annotate "$DUMP" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$(basename "$BIN"): $TOTAL instructions for $N requests, $((TOTAL / N)) per request ($DUMP)"
