#!/usr/bin/env bash
# Smoke test of the linux/arm64 binary (scripts/build-arm64.sh builds it),
# run under qemu-aarch64-static against the tests' fake Kubernetes API
# server (examples/fake_apiserver.rs, built for this machine):
#
# 1. `leader-gate exec --url unix:SOCKET -- sh -c '...'` (arm64) starts
#    first: with no sidecar, its command (a #! script run by this machine's
#    /bin/sh) must not start;
# 2. `leader-gate serve --gate-socket SOCKET` (arm64) leads the Lease:
#    GET /leader on its gate listener answers 200 with "leading":true and
#    its identity (curl);
# 3. the gated command then starts (it writes a marker with its PID and
#    LEADER_GATE_TERM, the term /leader names, then sleeps): it started
#    because the sidecar leads;
# 4. SIGTERM to the sidecar: it exits 0, and the gate stops the command
#    (its PID is gone); SIGTERM to exec: it exits 0;
# 5. as root: in an empty root (no libc, no NSS module; qemu-aarch64-static
#    copied in), `status --url http://localhost:PORT` resolves localhost
#    through /etc/hosts and gets "connection refused" (as
#    scripts/check-image-build.sh checks for amd64).
#
# Every check prints what it expected and what it got, and exits 1. Needs
# qemu-user-static and curl (it installs nothing; it names the apt command).
# About 10 seconds once the binary and the fake API server are built (the
# fake API server's debug build the first time: a minute or two).
#
#   scripts/check-arm64.sh [--binary PATH]
#
# PATH defaults to ${CARGO_TARGET_DIR:-target/image-check}/
# aarch64-unknown-linux-gnu/release/leader-gate; give the amd64 binary to
# watch it fail.
set -euo pipefail
started=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

say() { echo "check-arm64: $*"; }
fail() {
    echo "check-arm64: FAILED: $*" >&2
    exit 1
}

binary=${CARGO_TARGET_DIR:-target/image-check}/aarch64-unknown-linux-gnu/release/leader-gate
case "${1-}" in
"") ;;
--binary)
    (($# == 2)) || fail "usage: $0 [--binary PATH]"
    binary=$2
    ;;
*) fail "usage: $0 [--binary PATH]" ;;
esac

missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v curl >/dev/null || missing+=(curl)
command -v file >/dev/null || missing+=(file)
command -v python3 >/dev/null || missing+=(python3)
((${#missing[@]} == 0)) ||
    fail "missing ${missing[*]}; as root: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
[[ -x $binary ]] || fail "no binary at $binary: scripts/build-arm64.sh builds it"
description=$(file -L "$binary")
[[ $description == *"ARM aarch64"* ]] || fail "want an ARM aarch64 executable, got: $description"
# Under qemu-aarch64-static, by hand: no binfmt_misc is needed, and an
# amd64 binary is refused here rather than run natively.
gate=(qemu-aarch64-static "$binary")
version=$("${gate[@]}" --version) || fail "$binary does not run under qemu-aarch64-static"
say "$version under $(qemu-aarch64-static --version | head -n1)"

work=$(mktemp -d "${TMPDIR:-/tmp}/check-arm64.XXXXXX")
pids=()
cleanup() {
    set +e
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill "${pids[i]}" 2>/dev/null
        for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
        kill -9 "${pids[i]}" 2>/dev/null
        wait "${pids[i]}" 2>/dev/null
    done
    [[ -s $work/marker ]] && kill -9 "$(cut -d' ' -f1 "$work/marker")" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
# wait_for, free_port, start_fake_apiserver, leading.
source "$(dirname "$0")/lib/fake-apiserver.sh"

alive() { kill -0 "$1" 2>/dev/null; }

# --- the fake API server (this machine's build) -----------------------------
start_fake_apiserver "$work/kube" arm64-check

# --- 1. the gate, before any sidecar -----------------------------------------
socket=$work/run/gate.sock
mkdir -m 0700 "$work/run"
# The command: a script that writes its PID (exec replaces the shell) and
# term to the marker, then sleeps. A script, not `sh -c`: exec refuses to
# start an amd64 ELF file such as this machine's sh (another architecture),
# and qemu-user, without binfmt_misc, cannot start an arm64 one; the
# kernel runs a #! script with this machine's /bin/sh.
cat >"$work/collector" <<EOF
#!/bin/sh
echo "\$\$ \$LEADER_GATE_TERM" >"$work/marker.tmp" && mv "$work/marker.tmp" "$work/marker"
exec sleep 600
EOF
chmod 0755 "$work/collector"
"${gate[@]}" exec --url "unix:$socket" --grace 1s -- "$work/collector" >"$work/exec.log" 2>&1 &
exec_pid=$!
pids+=("$exec_pid")
sleep 2
[[ ! -e $work/marker ]] || fail "with no sidecar, the gated command started (want: not started): $(cat "$work/marker")"
alive "$exec_pid" || fail "with no sidecar, exec exited (want: waiting for it): $(tail -n 5 "$work/exec.log")"
say "no sidecar: exec waits, its command has not started"

# --- 2. the sidecar leads ------------------------------------------------------
gate_port=$(free_port)
admin_port=$(free_port)
KUBECONFIG=$kubeconfig "${gate[@]}" serve \
    --lease-name demo-leader --identity arm64-check \
    --listen "127.0.0.1:$gate_port" --admin-listen "127.0.0.1:$admin_port" \
    --gate-socket "$socket" \
    --lease-duration 4s --renew-deadline 3s --retry-period 1s \
    >"$work/serve.log" 2>&1 &
serve=$!
pids+=("$serve")
body=""
for _ in $(seq 150); do
    leading "$gate_port" && break
    alive "$serve" || break
    sleep 0.2
done
[[ $body == *'"leading":true'*' 200' ]] ||
    fail "GET /leader: want 200 with \"leading\":true, got '${body:-no answer}'; serve's log: $(tail -n 5 "$work/serve.log")"
[[ $body == *'"identity":"arm64-check"'* ]] || fail "GET /leader: want identity arm64-check, got $body"
say "serve (arm64) leads: GET /leader -> $body"

# --- 3. the gated command starts -------------------------------------------------
wait_for 15 test -s "$work/marker" ||
    fail "the sidecar leads, but the gated command did not start within 15 s (want a marker); exec's log: $(tail -n 5 "$work/exec.log")"
read -r child term <"$work/marker"
[[ $child =~ ^[0-9]+$ ]] && alive "$child" || fail "the gated command's PID '$child' is not running"
want_term=$(sed -n 's/.*"term":"\([^"]*\)".*/\1/p' <<<"$body")
[[ -n $term && $term == "$want_term" ]] ||
    fail "the command's LEADER_GATE_TERM: want /leader's term '$want_term', got '$term'"
say "exec (arm64) started its command: pid $child, term $term"

# --- 4. SIGTERM ------------------------------------------------------------------
kill -TERM "$serve"
code=0
timeout 20 tail --pid="$serve" -f /dev/null || fail "serve did not exit within 20 s of SIGTERM"
wait "$serve" || code=$?
((code == 0)) || fail "serve after SIGTERM: want exit 0, got $code; its log: $(tail -n 5 "$work/serve.log")"
wait_for 10 bash -c "! kill -0 $child" ||
    fail "the sidecar stopped, but the gated command (pid $child) still runs after 10 s (want it stopped)"
say "SIGTERM: serve exited 0, the gate stopped its command (pid $child gone)"
alive "$exec_pid" || fail "exec exited when the sidecar stopped (want: waiting for the next term): $(tail -n 5 "$work/exec.log")"
kill -TERM "$exec_pid"
code=0
timeout 20 tail --pid="$exec_pid" -f /dev/null || fail "exec did not exit within 20 s of SIGTERM"
wait "$exec_pid" || code=$?
((code == 0)) || fail "exec after SIGTERM: want exit 0, got $code; its log: $(tail -n 5 "$work/exec.log")"
say "SIGTERM: exec exited 0"

# --- 5. an empty root ------------------------------------------------------------
if [[ $(id -u) == 0 ]] && command -v chroot >/dev/null && chroot / true 2>/dev/null; then
    jail=$work/jail
    mkdir -p "$jail/etc" "$jail/bin"
    cp "$binary" "$jail/bin/leader-gate"
    cp "$(command -v qemu-aarch64-static)" "$jail/bin/qemu-aarch64-static"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n' >"$jail/etc/hosts"
    printf 'hosts: files dns\n' >"$jail/etc/nsswitch.conf"
    port=$(free_port)
    set +e
    out=$(chroot "$jail" /bin/qemu-aarch64-static /bin/leader-gate status --url "http://localhost:$port" 2>&1)
    rc=$?
    set -e
    [[ $rc == 2 && $out == *"refused"* ]] ||
        fail "in an empty root, status against http://localhost:$port: want exit 2 and 'connection refused', got exit $rc, '$out'"
    say "empty root: resolves localhost through /etc/hosts ($out)"
else
    say "not root (or no chroot): skipped the empty-root run"
fi

say "ok in $((SECONDS - started)) s"
