#!/bin/sh
# Builds the failover benchmark's peer elector (bench-peer/: kube-lease-manager
# behind leader-gate's command line and /leader contract) in release, with
# its own Cargo.lock (--locked), and prints the binary's path. The bench runs
# it by default once it exists:
#
#     sh scripts/build-peer.sh
#     cargo bench --bench failover -- --quick --only acquire,graceful,crash,startup,load10,wrk
#
# bench-peer/ is its own workspace: `cargo test` at the repository root never
# compiles it. A first build takes about 9 minutes on 2 cores (kube-rs, rustls).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --locked --manifest-path "$root/bench-peer/Cargo.toml" >&2
echo "$root/bench-peer/target/release/klm-gate"
