# Sourced (not run) by the scripts that run a leader-gate binary against the
# project's fake API server (examples/fake_apiserver.rs, built for this
# machine): scripts/check-arm64.sh and scripts/check-image-run.sh. They
# provide `say` and `fail`, the directory `work`, and the array `pids` that
# their cleanup kills.

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# A TCP port of 127.0.0.1 free right now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_fake_apiserver DIR IDENTITY: builds and starts the fake API server,
# its state and kubeconfig under DIR, and sets `kubeconfig`.
start_fake_apiserver() {
    local fake=${CARGO_TARGET_DIR:-target}/debug/examples/fake_apiserver ready
    cargo build --quiet --example fake_apiserver || fail "cannot build examples/fake_apiserver.rs"
    "$fake" "$1" "$2" >"$work/fake.out" 2>&1 &
    pids+=($!)
    wait_for 30 grep -q '^ready url=' "$work/fake.out" ||
        fail "the fake API server did not start: $(cat "$work/fake.out")"
    ready=$(head -n1 "$work/fake.out")
    kubeconfig=${ready##*kubeconfig=}
    say "fake API server: $ready"
}

# leading PORT: GET /leader on 127.0.0.1:PORT answers 200, leading; the
# answer (body and status) is left in `body`.
leading() {
    body=$(curl -s -m 2 -w ' %{http_code}' "http://127.0.0.1:$1/leader") || return 1
    [[ $body == *'"leading":true'*' 200' ]]
}
