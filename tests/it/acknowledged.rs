//! The acknowledged step-down, with real processes against the fake API
//! server: a graceful release goes out as soon as every gate registered for
//! the term (`exec`, `file-gate`, a subscriber of `/events?gate=ID`) said
//! the term is over for it, and never later than the gate lag; a registered
//! gate that dies without a word holds the release for the whole gate lag.
//!
//! Judged by order (the release after the last acknowledgement, the old
//! tree gone before the peer's child starts) and by the gate lag, which is
//! seconds longer than an acknowledged hand-over takes: without
//! acknowledgements every release here would come at the gate lag.
//! `MEASURE` lines report the hand-over times.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::events::EventClient;
use support::fake_apiserver::Verb;
use support::file_gate::{FileGate, Reloads};
use support::gate_clients::{ChildLog, Entry, GateClient, wall_now};
use support::gate_pods::Pods;
use support::sidecar::Timing;

const SECOND: Duration = Duration::from_secs(1);
const NAMES: [&str; 2] = ["a", "b"];
const TIMING: Timing = Timing::GATES;
const GATE_LAG: Duration = Duration::from_millis(2500);

/// Two pods with the gate lag.
async fn pods(test: &str) -> Pods {
    let lag = format!("{}ms", GATE_LAG.as_millis());
    Pods::start(test, &NAMES, TIMING, &["--gate-lag", &lag]).await
}

/// When `name`'s release (a write that clears the holder) was received.
async fn release_of(pods: &Pods, name: &str) -> Instant {
    pods.api.release_of(name, TIMING.lease * 2).await
}

/// Two pods, each a sidecar and an `exec` of the test collector; also the
/// leader's index and its child's start.
async fn exec_pods(test: &str) -> (Pods, Vec<GateClient>, ChildLog, usize, Entry) {
    let pods = pods(test).await;
    let (execs, log, l, first) = pods.execs(&[]).await;
    assert_eq!(pods.leader().await, l);
    // Both execs subscribed (the follower's too) and the leader renewed.
    tokio::time::sleep(TIMING.retry * 2).await;
    (pods, execs, log, l, first)
}

/// The peer's first child after `after` (wall clock, seconds).
async fn peer_start(log: &ChildLog, peer: usize, after: f64) -> f64 {
    log.wait_for(TIMING.lease * 3, |e| {
        e.what == "start" && e.name == NAMES[peer] && e.wall > after
    })
    .await
    .wall
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_exec_pod_hands_over_once_its_tree_is_gone_without_waiting_out_the_gate_lag() {
    // A pod's deletion with native sidecars: the collector's container
    // (exec) gets SIGTERM first and exits; only then does the sidecar.
    let (mut pods, mut execs, log, l, _) = exec_pods("ack-exec-pod-deleted").await;
    let p = 1 - l;
    execs[l].terminate_cleanly(SECOND * 10).await;
    let tree_gone = wall_now();
    let signalled = Instant::now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let released = release_of(&pods, NAMES[l]).await;
    let started = peer_start(&log, p, tree_gone).await;
    log.assert_never_two_at_once();
    assert!(
        released - signalled < GATE_LAG,
        "released {:?} after SIGTERM: exec had acknowledged, nothing was left to wait for\n{}",
        released - signalled,
        pods.sidecars[l].log()
    );
    let sidecar_log = pods.sidecars[l].log();
    assert!(
        sidecar_log.contains("acknowledged its end"),
        "{sidecar_log}"
    );
    assert!(pods.sidecars[l].wait_exit(SECOND * 10).await.is_some());
    println!(
        "MEASURE acknowledged exec pod deletion: released {:.3}s after the sidecar's SIGTERM; peer's child started {:.3}s after the old tree was gone",
        (released - signalled).as_secs_f64(),
        started - tree_gone
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_to_the_sidecar_releases_once_exec_reaped_the_tree() {
    let (pods, _execs, log, l, old) = exec_pods("ack-exec-sidecar-sigterm").await;
    let p = 1 - l;
    let signalled = Instant::now();
    let signalled_wall = wall_now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let released = release_of(&pods, NAMES[l]).await;
    let stopped = log
        .wait_for(SECOND * 5, |e| e.what == "stop" && e.pid == old.pid)
        .await;
    let started = peer_start(&log, p, signalled_wall).await;
    log.assert_never_two_at_once();
    assert!(stopped.wall < started, "the old child stopped first");
    assert!(
        released - signalled < GATE_LAG,
        "released {:?} after SIGTERM\n{}",
        released - signalled,
        pods.sidecars[l].log()
    );
    println!(
        "MEASURE acknowledged exec SIGTERM: released {:.3}s after SIGTERM; old child stopped {:.3}s, peer's started {:.3}s after it",
        (released - signalled).as_secs_f64(),
        stopped.wall - signalled_wall,
        started - signalled_wall
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_that_cannot_list_its_children_never_acknowledges_and_the_release_waits_the_gate_lag()
 {
    // exec as PID 1 of a PID namespace whose /proc is the host's: it cannot
    // list the orphans of its tree, so a reaped child and an empty group
    // prove nothing (something that left the group may still run).
    if std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .map_or(true, |s| !s.success())
    {
        println!("SKIPPED: unshare --pid needs CAP_SYS_ADMIN");
        return;
    }
    let pods = pods("ack-exec-blind").await;
    let unshared = ["unshare", "--pid", "--fork", "--kill-child"];
    let (execs, log, l, old) = pods.execs(&unshared).await;
    assert_eq!(pods.leader().await, l);
    tokio::time::sleep(TIMING.retry * 2).await;

    let signalled = Instant::now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let released = release_of(&pods, NAMES[l]).await;
    let stopped = log
        .wait_for(SECOND * 5, |e| e.what == "stop" && e.pid == old.pid)
        .await;
    let stderr = execs[l].stderr();
    println!(
        "MEASURE exec that cannot list its children: released {:.3}s after SIGTERM (gate lag {GATE_LAG:?}); its child stopped at {:.3} (wall)",
        (released - signalled).as_secs_f64(),
        stopped.wall
    );
    assert!(
        released - signalled >= GATE_LAG,
        "released {:?} after SIGTERM, before the gate lag, on the word of an exec that cannot \
         see its whole tree\n{stderr}\n{}",
        released - signalled,
        pods.sidecars[l].log()
    );
    assert!(
        stderr.contains("cannot prove that a term's whole process tree is gone"),
        "{stderr}"
    );
    assert!(!stderr.contains("told the sidecar"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_killed_without_acknowledging_holds_the_release_for_the_whole_gate_lag() {
    let (pods, mut execs, log, l, old) = exec_pods("ack-exec-dies").await;
    let p = 1 - l;
    // SIGKILL: its tree dies with it (the death guard, without a TERM trap
    // to log a stop), and it says nothing.
    execs[l].signal(libc::SIGKILL);
    assert!(execs[l].wait_exit(SECOND * 5).await.is_some());
    let deadline = Instant::now() + SECOND * 5;
    // SAFETY: kill(2) with signal 0 only checks whether the pid exists.
    while unsafe { libc::kill(old.pid, 0) } == 0 {
        assert!(
            Instant::now() < deadline,
            "the old child dies with its exec"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let signalled = Instant::now();
    let signalled_wall = wall_now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let released = release_of(&pods, NAMES[l]).await;
    peer_start(&log, p, signalled_wall).await;
    assert!(
        released - signalled >= GATE_LAG,
        "released {:?} after SIGTERM, before the gate lag, though a registered gate never acknowledged",
        released - signalled
    );
    let sidecar_log = pods.sidecars[l].log();
    assert!(
        sidecar_log.contains("the gate lag ran out before these registered gates acknowledged"),
        "{sidecar_log}"
    );
}

/// A pod with a `file-gate` and a subscriber (registered as gate `sub`
/// when `registered`), both subscribed while the first term runs. Returns
/// the pods, the leader, its file gate and DST, the subscriber and the
/// reload server (with `reload_delay`).
async fn file_gate_pods(
    test: &str,
    registered: bool,
    reload_delay: Option<Duration>,
) -> (Pods, usize, FileGate, PathBuf, EventClient, Option<Reloads>) {
    let pods = pods(test).await;
    let l = pods.leader().await;
    let gate = pods.sidecars[l].gate;
    let mut sub = if registered {
        EventClient::connect_as_gate(gate, "sub").await
    } else {
        EventClient::connect(gate, None).await
    };
    let state = sub.next(SECOND).await.expect("a state event");
    assert_eq!(state.kind(), "state");
    let src = pods.dir.join("targets.yml");
    std::fs::write(&src, "- targets: ['ksm:8080']\n").unwrap();
    let out = pods.dir.join("conf.d");
    std::fs::create_dir_all(&out).unwrap();
    let dst = out.join("targets.yml");
    let reloads = match reload_delay {
        Some(delay) => Some(Reloads::start_slow(&[&dst], delay).await),
        None => None,
    };
    let url = reloads
        .as_ref()
        .map(|r| format!("http://{}/-/reload", r.addr));
    let extra: Vec<&str> = url
        .iter()
        .flat_map(|u| ["--reload-url", u.as_str()])
        .collect();
    let gate = FileGate::spawn(&pods.dir, "file-gate", gate, &extra, &[(&src, &dst)]);
    let deadline = Instant::now() + SECOND * 5;
    while !dst.exists() {
        assert!(
            Instant::now() < deadline,
            "the copy appears: {}",
            gate.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (pods, l, gate, dst, sub, reloads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_waits_for_the_last_registered_gate_a_subscriber_that_acknowledges_late() {
    // The file gate reloads at once: only the subscriber is late.
    let (pods, l, _gate, dst, mut sub, _) =
        file_gate_pods("ack-subscriber-late", true, Some(Duration::ZERO)).await;
    let signalled = Instant::now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let term = sub.stopped_term(SECOND * 5).await;
    // The subscriber's own collector takes a second to stop.
    tokio::time::sleep(SECOND).await;
    assert!(!dst.exists(), "the file gate removed its copy at once");
    assert_eq!(
        pods.sidecars[l].acknowledge("sub", "another/term").await,
        409
    );
    assert_eq!(pods.sidecars[l].acknowledge("stranger", &term).await, 404);
    let acknowledged = Instant::now();
    let early = pods
        .api
        .requests_of(NAMES[l], Verb::Update)
        .into_iter()
        .any(|r| r.holder.is_none());
    assert!(!early, "no release before the subscriber's acknowledgement");
    assert_eq!(pods.sidecars[l].acknowledge("sub", &term).await, 204);
    let released = release_of(&pods, NAMES[l]).await;
    assert!(
        released >= acknowledged,
        "the release follows the last acknowledgement"
    );
    assert!(
        released - signalled < GATE_LAG,
        "released {:?} after SIGTERM: every gate had acknowledged",
        released - signalled
    );
    println!(
        "MEASURE acknowledged subscriber: released {:.1} ms after the last acknowledgement",
        (released - acknowledged).as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_gate_acknowledges_once_its_copy_is_gone_and_the_reload_answered() {
    let reload = Duration::from_millis(800);
    // The subscriber is not registered: only the file gate acknowledges.
    let (pods, l, gate, _dst, _sub, reloads) =
        file_gate_pods("ack-file-gate-reload", false, Some(reload)).await;
    let signalled = Instant::now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let released = release_of(&pods, NAMES[l]).await;
    let after = released - signalled;
    assert!(
        after >= reload,
        "released {after:?} after SIGTERM, before the file gate's reload ({reload:?}) was answered\n{}",
        gate.log()
    );
    assert!(
        after < GATE_LAG,
        "released {after:?} after SIGTERM\n{}",
        gate.log()
    );
    let posts = reloads.unwrap().posts();
    assert!(
        posts.last().is_some_and(|p| p.existed == [false]),
        "the last reload told the collector of the removal: {posts:?}"
    );
    println!(
        "MEASURE acknowledged file-gate: released {:.3}s after SIGTERM (reload answered after {:.1}s)",
        after.as_secs_f64(),
        reload.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gate_without_a_reload_url_holds_the_release_to_the_gate_lag() {
    // Without --reload-url the collector finds the removal at its own reload
    // period: the file gate cannot tell when it stopped, so the release
    // waits the whole gate lag, although the other gate (a subscriber)
    // acknowledges at once.
    let (pods, l, gate, dst, mut sub, _) =
        file_gate_pods("ack-file-gate-no-reload", true, None).await;
    let signalled = Instant::now();
    pods.sidecars[l].signal(libc::SIGTERM);
    let term = sub.stopped_term(SECOND * 5).await;
    assert_eq!(pods.sidecars[l].acknowledge("sub", &term).await, 204);
    let released = release_of(&pods, NAMES[l]).await;
    assert!(!dst.exists(), "the copy was removed: {}", gate.log());
    assert!(
        released - signalled >= GATE_LAG,
        "released {:?} after SIGTERM, before the gate lag ({GATE_LAG:?})\n{}",
        released - signalled,
        gate.log()
    );
}
