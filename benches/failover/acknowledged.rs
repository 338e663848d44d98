//! The hand-over of an `exec` pod deleted as the kubelet deletes a pod with
//! a native sidecar: the collector's container (`exec`) gets SIGTERM first
//! and exits once its tree is gone, then the sidecar gets SIGTERM. From the
//! old tree gone to the peer's collector started, with the acknowledged
//! release (the default) and with `--gate-acks=false` (the release waits the
//! whole gate lag, as before acknowledgements).

use std::path::Path;
use std::time::Duration;

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::gate_clients::{COLLECTOR, ChildLog, GateClient, spawn_exec, wall_now};
use crate::support::sidecar::{Sidecar, test_dir};

const NAMES: [&str; 2] = ["a", "b"];
/// A successor is named within a few seconds of a new leader (the default
/// window is a minute: a group at rest has long named one).
const CLAIM_WINDOW: &str = "3s";
/// Long enough after a (re)start for the follower to have claimed the slot.
const SETTLE: Duration = Duration::from_secs(5);

/// `rounds` pod deletions of the leader with acknowledgements, then as many
/// without: the old tree gone → the peer's child started, each.
pub async fn run(rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    (
        deletions(rounds, &[]).await,
        deletions(rounds, &["--gate-acks=false"]).await,
    )
}

struct Pod {
    sidecar: Sidecar,
    exec: GateClient,
}

async fn deletions(rounds: usize, extra: &[&str]) -> Vec<Duration> {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(if extra.is_empty() {
        "bench-acknowledged"
    } else {
        "bench-unacknowledged"
    });
    let log = ChildLog(dir.join("children.log"));
    let mut args = vec!["--successor-claim-window", CLAIM_WINDOW];
    args.extend_from_slice(extra);
    let start = |name: &'static str, run: usize| start_pod(&api, &dir, &log, name, run, &args);
    let mut pods = [start("a", 0).await, start("b", 0).await];
    let first = log
        .wait_for(DEFAULTS.lease * 3, |e| e.what == "start")
        .await;
    let mut leader = NAMES.iter().position(|n| *n == first.name).unwrap();
    tokio::time::sleep(SETTLE).await;
    let mut out = Vec::new();
    for round in 0..rounds {
        let peer = 1 - leader;
        let pod = &mut pods[leader];
        pod.exec.signal(libc::SIGTERM);
        pod.exec.wait_exit(Duration::from_secs(10)).await;
        let tree_gone = wall_now();
        pod.sidecar.signal(libc::SIGTERM);
        let started = log
            .wait_for(DEFAULTS.lease * 2, |e| {
                e.what == "start" && e.name == NAMES[peer] && e.wall > tree_gone
            })
            .await;
        out.push(Duration::from_secs_f64(started.wall - tree_gone));
        pod.sidecar.wait_exit(Duration::from_secs(15)).await;
        pods[leader] = start(NAMES[leader], round + 1).await;
        log.assert_never_two_at_once();
        leader = peer;
        tokio::time::sleep(SETTLE).await;
    }
    out
}

/// Pod `name`'s sidecar and `exec`, in their `run`-th incarnation.
async fn start_pod(
    api: &FakeApiServer,
    dir: &Path,
    log: &ChildLog,
    name: &str,
    run: usize,
    args: &[&str],
) -> Pod {
    let sidecar =
        Sidecar::spawn_logged(api, dir, name, &format!("{name}-{run}.log"), DEFAULTS, args);
    sidecar.wait_serving().await;
    let exec = spawn_exec(
        dir,
        name,
        &format!("http://{}", sidecar.gate),
        &log.0,
        COLLECTOR,
    );
    Pod { sidecar, exec }
}
