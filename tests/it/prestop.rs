//! Handing over before the containers are stopped, with real processes
//! against the fake API server: `leader-gate prestop` (a collector's
//! `preStop` hook) asks its own sidecar to step down over the gate channel
//! and returns once a peer holds the Lease, plus its drain; a dead or
//! stopped sidecar never holds it past its bound; `exec` receiving SIGTERM
//! asks for the hand-over itself once its tree is gone, so the peer takes
//! over without the sidecar's own SIGTERM; and the step-down is refused
//! from outside the gate channel.
//!
//! What only real pods show — the kubelet running the collector's
//! `preStop` before any SIGTERM, and kube-proxy's propagation during the
//! drain — is not here. `MEASURE` lines report the times.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Verb};
use support::gate_clients::{GateClient, wall_now};
use support::gate_pods::Pods;
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const NAMES: [&str; 2] = ["a", "b"];
const TIMING: Timing = Timing::GATES;
/// Short, so that a hand-over with no gate registered completes well
/// within the hook's default timeout; far below a lease duration.
const GATE_LAG: &str = "500ms";

/// Two pods with the short gate lag.
async fn pods(test: &str) -> Pods {
    Pods::start(test, &NAMES, TIMING, &["--gate-lag", GATE_LAG]).await
}

/// When `name`'s acquisition (a write naming it holder, answered 200) was
/// received, if one was after `after`.
fn acquisition_of(api: &FakeApiServer, name: &str, after: Instant) -> Option<Instant> {
    [Verb::Update, Verb::Create]
        .into_iter()
        .flat_map(|verb| api.requests_of(name, verb))
        .filter(|r| r.at > after && r.status == Some(200) && r.holder.as_deref() == Some(name))
        .map(|r| r.at)
        .min()
}

fn holder(api: &FakeApiServer) -> Option<String> {
    api.lease(LEASE)?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

fn prestop(dir: &Path, name: &str, url: &str, timeout: &str, drain: &str) -> GateClient {
    GateClient::spawn(
        dir,
        &format!("prestop-{name}"),
        &[
            "prestop",
            "--url",
            url,
            "--timeout",
            timeout,
            "--drain",
            drain,
        ],
        &[],
    )
}

/// `curl [--unix-socket SOCKET] -X POST URL`: the status.
fn post(socket: Option<&Path>, url: &str) -> u16 {
    let mut curl = Command::new("curl");
    curl.args(["-s", "-o", "/dev/null", "-m", "5", "-w", "%{http_code}"]);
    curl.args(["-X", "POST"]);
    if let Some(socket) = socket {
        curl.arg("--unix-socket").arg(socket);
    }
    let out = curl.arg(url).output().expect("curl runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_returns_once_the_peer_holds_the_lease_and_the_drain_passed() {
    let mut pods = pods("prestop-hands-over").await;
    let l = pods.leader().await;
    let p = 1 - l;
    // The peer watches (and may claim the successor slot) meanwhile.
    tokio::time::sleep(TIMING.retry * 2).await;
    let asked = Instant::now();
    let url = format!("http://{}", pods.sidecars[l].gate);
    let mut hook = prestop(&pods.dir, NAMES[l], &url, "5s", "1s");
    let (status, exited) = hook
        .wait_exit(SECOND * 10)
        .await
        .expect("prestop returns within its bound");
    assert_eq!(status.code(), Some(0), "{}", hook.stderr());
    let took = exited - asked;
    let acquired = acquisition_of(&pods.api, NAMES[p], asked)
        .unwrap_or_else(|| panic!("the peer never took the Lease\n{}", hook.stderr()));
    assert!(acquired < exited, "the Lease moved before prestop returned");
    assert!(
        exited - acquired >= Duration::from_millis(950),
        "the drain (1s) followed the hand-over: {:?}",
        exited - acquired
    );
    assert!(
        took < Duration::from_secs(6) + SECOND,
        "within timeout + drain: {took:?}"
    );
    assert_eq!(holder(&pods.api).as_deref(), Some(NAMES[p]));
    assert!(
        pods.sidecars[l].exited().is_none(),
        "the old sidecar still runs: nobody sent it SIGTERM"
    );
    let old = pods.sidecars[l].leader().await.expect("still answers");
    assert!(!old.leading());
    assert_eq!(old.holder(), Some(NAMES[p]));
    assert!(
        hook.stderr()
            .contains(&format!("{} holds the Lease", NAMES[p])),
        "{}",
        hook.stderr()
    );
    // It stands aside: still not leading a lease duration on… then a
    // candidate again (G1) — judged here only as "it did not take it back".
    tokio::time::sleep(SECOND).await;
    assert_eq!(holder(&pods.api).as_deref(), Some(NAMES[p]));
    println!(
        "MEASURE prestop: the peer acquired {:.3}s after the request; the hook returned {:.3}s after it (drain 1s)",
        (acquired - asked).as_secs_f64(),
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_of_a_follower_returns_at_once() {
    let pods = pods("prestop-follower").await;
    let l = pods.leader().await;
    let p = 1 - l;
    let url = format!("http://{}", pods.sidecars[p].gate);
    let asked = Instant::now();
    let mut hook = prestop(&pods.dir, NAMES[p], &url, "5s", "1s");
    assert_eq!(hook.exit_code(SECOND * 3).await, 0);
    assert!(asked.elapsed() < SECOND, "no drain: {:?}", asked.elapsed());
    assert!(
        hook.stderr().contains("nothing to hand over"),
        "{}",
        hook.stderr()
    );
    assert_eq!(
        holder(&pods.api).as_deref(),
        Some(NAMES[l]),
        "the leader stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_against_a_dead_or_stopped_sidecar_returns_within_its_bound_with_exit_0() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("prestop-dead-or-stopped");
    let dead = Sidecar::spawn(&api, &dir, "dead", TIMING);
    let stopped = Sidecar::spawn(&api, &dir, "stopped", TIMING);
    dead.wait_serving().await;
    stopped.wait_serving().await;

    // Killed: nothing listens any more, the hook ends at once.
    let dead_url = format!("http://{}", dead.gate);
    dead.signal(libc::SIGKILL);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let mut hook = prestop(&dir, "dead", &dead_url, "3s", "1s");
    assert_eq!(hook.exit_code(SECOND * 5).await, 0, "{}", hook.stderr());
    let dead_took = asked.elapsed();
    assert!(dead_took < SECOND, "at once: {dead_took:?}");
    assert!(hook.stderr().contains("cannot ask"), "{}", hook.stderr());

    // Stopped (SIGSTOP): the kernel accepts the connection, nobody answers;
    // the whole wait is bounded by --timeout, and no drain follows.
    stopped.signal(libc::SIGSTOP);
    let asked = Instant::now();
    let url = format!("http://{}", stopped.gate);
    let mut hook = prestop(&dir, "stopped", &url, "2s", "1s");
    let code = hook.exit_code(SECOND * 5).await;
    let stopped_took = asked.elapsed();
    stopped.signal(libc::SIGCONT);
    assert_eq!(code, 0, "{}", hook.stderr());
    assert!(
        stopped_took >= Duration::from_millis(1900) && stopped_took < Duration::from_millis(2900),
        "within --timeout 2s, without the drain: {stopped_took:?}"
    );
    assert!(
        hook.stderr().contains("did not answer"),
        "{}",
        hook.stderr()
    );
    println!(
        "MEASURE prestop against a dead sidecar: {:.3}s; a SIGSTOPped one with --timeout 2s: {:.3}s",
        dead_took.as_secs_f64(),
        stopped_took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_receiving_sigterm_hands_over_without_the_sidecars_sigterm() {
    let pods = pods("prestop-exec-sigterm").await;
    let (mut execs, log, l, _) = pods.execs(&[]).await;
    let p = 1 - l;
    tokio::time::sleep(TIMING.retry * 2).await;
    // The collector's container alone is stopped; its sidecar gets nothing.
    execs[l].terminate_cleanly(SECOND * 10).await;
    let tree_gone = wall_now();
    let started = log
        .wait_for(TIMING.renew_deadline, |e| {
            e.what == "start" && e.name == NAMES[p] && e.wall > tree_gone
        })
        .await
        .wall;
    log.assert_never_two_at_once();
    assert!(
        execs[l]
            .stderr()
            .contains("asked the sidecar to hand the Lease over"),
        "{}",
        execs[l].stderr()
    );
    let mut old = pods
        .sidecars
        .into_iter()
        .nth(l)
        .expect("the old leader's sidecar");
    assert!(old.exited().is_none(), "no SIGTERM was sent to the sidecar");
    let probe = old.leader().await.expect("still answers");
    assert!(!probe.leading());
    println!(
        "MEASURE exec SIGTERM hand-over: the peer's child started {:.3}s after the old tree was gone",
        started - tree_gone
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_down_is_refused_from_outside_the_gate_channel() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("prestop-gate-channel");
    let (a, socket) =
        Sidecar::spawn_with_socket(&api, &dir, "a", TIMING, &["--gate-lag", GATE_LAG]);
    a.wait_term(TIMING.lease * 3).await;
    // TCP, even loopback, is not the gate channel once a socket is given.
    let tcp = format!("http://{}/handover", a.gate);
    assert_eq!(post(None, &tcp), 403);
    // A hook on TCP is refused too, and returns at once.
    let mut hook = prestop(&dir, "a-tcp", &format!("http://{}", a.gate), "3s", "1s");
    assert_eq!(hook.exit_code(SECOND * 2).await, 0);
    assert!(hook.stderr().contains("HTTP 403"), "{}", hook.stderr());
    tokio::time::sleep(SECOND).await;
    assert!(a.leader().await.expect("answers").leading(), "still leads");
    assert!(
        !api.requests_of("a", Verb::Update)
            .iter()
            .any(|r| r.holder.is_none() && r.status == Some(200)),
        "nothing released"
    );
    // Over the socket: taken.
    assert_eq!(post(Some(&socket), "http://localhost/handover"), 202);
    api.release_of("a", TIMING.lease).await;
    assert!(!a.leader().await.expect("answers").leading());
}
