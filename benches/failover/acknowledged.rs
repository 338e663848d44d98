//! The hand-over of an `exec` pod deleted as the kubelet deletes a pod with
//! a native sidecar: the collector's container (`exec`) gets SIGTERM first
//! and exits once its tree is gone, then the sidecar gets SIGTERM. From the
//! old tree gone to the peer's collector started, with the acknowledged
//! release (the default) and with `--gate-acks=false` (the release waits the
//! whole gate lag, as before acknowledgements).
//!
//! And a `file-gate --reload-url` leader's SIGTERM → its release: the gate
//! acknowledges only once a reload after its removal was answered 2xx, so
//! with a collector whose reload works the release goes out at once, and
//! with one whose reload fails (500) it waits the whole gate lag.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, Verb};
use crate::support::file_gate::FileGate;
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

/// `rounds` SIGTERMs of the leader's `exec` alone, as a pod deletion with
/// native sidecars sends it first: `exec` stops its tree, acknowledges and
/// asks its own sidecar to hand over, without the sidecar's SIGTERM. Each
/// round: the tree gone → the release reaches the API server, and → the
/// peer's collector starts.
pub async fn exec_hands_over(rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("bench-exec-hands-over");
    let log = ChildLog(dir.join("children.log"));
    let args = ["--successor-claim-window", CLAIM_WINDOW];
    let start = |name: &'static str, run: usize| start_pod(&api, &dir, &log, name, run, &args);
    let mut pods = [start("a", 0).await, start("b", 0).await];
    let first = log
        .wait_for(DEFAULTS.lease * 3, |e| e.what == "start")
        .await;
    let mut leader = NAMES.iter().position(|n| *n == first.name).unwrap();
    tokio::time::sleep(SETTLE).await;
    let (mut released, mut started) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let peer = 1 - leader;
        let pod = &mut pods[leader];
        let signalled = Instant::now();
        pod.exec.signal(libc::SIGTERM);
        // The collector's last word: its tree is gone right after.
        let stopped = log
            .wait_for(Duration::from_secs(10), |e| {
                e.what == "stop"
                    && e.name == NAMES[leader]
                    && e.wall > wall_now() - signalled.elapsed().as_secs_f64()
            })
            .await;
        let tree_gone = stopped.wall;
        let deadline = signalled + DEFAULTS.lease * 2;
        let release = loop {
            let release = api
                .requests_of(NAMES[leader], Verb::Update)
                .into_iter()
                .find(|r| r.holder.is_none() && r.status == Some(200) && r.at > signalled);
            if let Some(release) = release {
                break release.at;
            }
            assert!(Instant::now() < deadline, "never released");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // The API server's arrival instant, on the wall clock.
        let release_wall = wall_now() - release.elapsed().as_secs_f64();
        assert!(
            release_wall >= tree_gone,
            "released {:.1} ms before the collector stopped",
            (tree_gone - release_wall) * 1000.0
        );
        released.push(Duration::from_secs_f64(release_wall - tree_gone));
        pod.exec.wait_exit(Duration::from_secs(10)).await;
        let child = log
            .wait_for(DEFAULTS.lease * 2, |e| {
                e.what == "start" && e.name == NAMES[peer] && e.wall > tree_gone
            })
            .await;
        started.push(Duration::from_secs_f64(child.wall - tree_gone));
        // The kubelet would restart the collector's container: a new exec
        // beside the same sidecar (which stands aside for a while).
        pods[leader].exec = spawn_exec(
            &dir,
            NAMES[leader],
            &format!("http://{}", pods[leader].sidecar.gate),
            &log.0,
            COLLECTOR,
        );
        log.assert_never_two_at_once();
        leader = peer;
        // A sidecar asked to hand over stands aside for a lease duration:
        // past it, and a successor named again (a real deletion's pod is
        // replaced by a new one instead).
        tokio::time::sleep(DEFAULTS.lease + SETTLE).await;
    }
    (released, started)
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

/// The gate lag of the file gate rows.
pub const FILE_GATE_LAG: Duration = Duration::from_secs(4);

/// `rounds` SIGTERMs of a leader whose `file-gate` reloads a collector that
/// answers every reload after the first (the copy loaded) with `status`:
/// SIGTERM → the release, each.
pub async fn file_gate(rounds: usize, status: u16) -> Vec<Duration> {
    let mut out = Vec::new();
    for round in 0..rounds {
        let api = FakeApiServer::start(NAMESPACE, LEASE).await;
        let dir = test_dir(&format!("bench-file-gate-ack-{status}-{round}"));
        let lag = format!("{}ms", FILE_GATE_LAG.as_millis());
        let sidecar = Sidecar::spawn_with(&api, &dir, "a", DEFAULTS, &["--gate-lag", &lag]);
        sidecar.wait_serving().await;
        sidecar.wait_leading(DEFAULTS.lease * 3).await;
        let (src, dst) = (dir.join("scrape.yml"), dir.join("conf.d/scrape.yml"));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::write(&src, "scrape_configs: []\n").unwrap();
        let (url, posts) = reload_endpoint(status).await;
        let _gate = FileGate::spawn(
            &dir,
            "file-gate",
            sidecar.gate,
            &["--reload-url", &url],
            &[(&src, &dst)],
        );
        // The copy is in place and loaded, and the gate registered.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(dst.exists() && posts.load(Ordering::Relaxed) >= 2) {
            assert!(Instant::now() < deadline, "the copy was never loaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(DEFAULTS.retry).await;
        let signalled = Instant::now();
        sidecar.signal(libc::SIGTERM);
        let released = api.release_of("a", DEFAULTS.lease * 2).await;
        out.push(released.saturating_duration_since(signalled));
    }
    out
}

/// A collector's reload endpoint: the first two POSTs (the gate's start-up
/// reload, then the one after the copy appeared) answered 200, every later
/// one `status`; the count of POSTs.
async fn reload_endpoint(status: u16) -> (String, Arc<AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/-/reload", listener.local_addr().unwrap());
    let posts = Arc::new(AtomicUsize::new(0));
    let seen = posts.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                if crate::support::read_head(&mut stream).await.is_none() {
                    return;
                }
                let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
                let code = if n <= 2 { 200 } else { status };
                let answer =
                    format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, posts)
}
