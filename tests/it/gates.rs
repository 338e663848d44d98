//! The gates for an unmodified collector, as real `leader-gate` processes
//! against the fake Lease API server: the validity rule on the event stream
//! (a subscriber and `leader-gate watch`), `leader-gate exec`, `status` and
//! `wait`. Judged by timestamps and causality, never by speed: every gate
//! closes before any peer can start, also when its sidecar is SIGKILLed.
//!
//! `MEASURE` lines report how long each gate took to close and how long
//! before the peer's start that was.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, free_local_addr};
use support::gate_clients::{
    COLLECTOR, ChildLog, Entry, GateClient, Recording, spawn_exec, wall_now,
};
use support::monitor::Monitor;
use support::proxy::Proxy;
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const NAMES: [&str; 2] = ["a", "b"];

/// For `exec`: the margin (lease − renew deadline = 3 s) covers the
/// wrapper's `--grace 2s`, as the README asks, and so does the gate lag a
/// graceful hand-over waits.
const EXEC_TIMING: Timing = Timing {
    lease: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(3),
    retry: Duration::from_secs(1),
};
const GATE_LAG: &str = "2500ms";

/// The index of the sidecar that leads first.
async fn first_leader(sidecars: &[Sidecar], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, sidecar) in sidecars.iter().enumerate() {
            if sidecar.leader().await.is_some_and(|p| p.leading()) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "nobody led within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start_pair(
    test: &str,
    timing: Timing,
    extra: &[&str],
) -> (FakeApiServer, PathBuf, Vec<Sidecar>) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(test);
    let sidecars = Sidecar::spawn_serving(&api, &dir, &NAMES, timing, extra).await;
    (api, dir, sidecars)
}

fn json_line(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("one JSON object per line: {text:?}"))
}

// ===== validity on the stream =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_and_watch_stop_leading_before_the_peer_starts_when_the_leader_is_sigkilled() {
    // The tightest margin the suite uses: 1 s.
    let timing = Timing::FAST;
    let (_api, dir, sidecars) = start_pair("gates-validity-sigkill", timing, &[]).await;
    let l = first_leader(&sidecars, timing.lease * 3).await;
    let (leader, peer) = (&sidecars[l], &sidecars[1 - l]);
    let term = leader.wait_leading(SECOND).await.term().unwrap().to_owned();

    let subscriber = Recording::start(EventClient::connect(leader.gate, None).await);
    let peer_stream = Recording::start(EventClient::connect(peer.gate, None).await);
    let url = format!("http://{}", leader.gate);
    let watch = GateClient::spawn(&dir, "watch", &["watch", "--json", "--url", &url], &[]);
    let first = json_line(&watch.wait_line(SECOND * 5, |_| true).await.text);
    assert_eq!(first["event"], "state");
    assert_eq!(first["data"]["leading"], true, "{first}");
    // Renewals flow to both, each carrying the validity.
    for _ in 0..2 {
        subscriber
            .wait_for(timing.retry * 4, |e| e.kind() == "renewed")
            .await;
    }
    watch
        .wait_line(timing.retry * 4, |l| json_line(l)["event"] == "renewed")
        .await;

    let killed = Instant::now();
    leader.signal(libc::SIGKILL);
    let local_stop = watch
        .wait_line(timing.lease * 2, |l| {
            json_line(l)["event"] == "stopped-leading"
        })
        .await;
    let peer_start = peer_stream
        .wait_for(timing.lease * 3, |e| e.kind() == "started-leading")
        .await;

    // The subscriber, by the rule: the last confirmation it received plus
    // its validity. Nothing more arrived after the kill (the stream ended).
    let validity_end = subscriber
        .validity_end()
        .expect("the subscriber was told it leads");
    assert!(
        subscriber.ended().is_some(),
        "the stream ends with the process"
    );
    assert!(validity_end > killed, "it was leading when killed");
    assert!(
        validity_end < peer_start.at,
        "the subscriber's leadership ends {:?} after the peer's started-leading",
        validity_end - peer_start.at
    );
    // `watch` says so itself, marked as its own conclusion.
    let line = json_line(&local_stop.text);
    assert_eq!(line["local"], true, "{line}");
    assert_eq!(line["data"]["local"], true, "{line}");
    assert_eq!(line["data"]["term"], term.as_str(), "{line}");
    let reason = line["data"]["reason"].as_str().unwrap();
    assert!(
        ["stream-lost", "validity-expired"].contains(&reason),
        "{line}"
    );
    assert!(local_stop.at > killed, "no stop before the kill: {line}");
    assert!(
        local_stop.at < peer_start.at,
        "watch printed its stop {:?} after the peer's started-leading",
        local_stop.at - peer_start.at
    );
    println!(
        "MEASURE validity SIGKILL: subscriber closes {:?} after the kill, {:?} before the peer's start",
        validity_end - killed,
        peer_start.at - validity_end
    );
    println!(
        "MEASURE watch SIGKILL: local stop ({reason}) read {:?} after the kill, {:?} before the peer's start",
        local_stop.at - killed,
        peer_start.at - local_stop.at
    );
}

// ===== exec =====

/// Two pods, each a `serve` and an `exec` running [`COLLECTOR`]; each exec
/// reaches its sidecar through a proxy the test can break or point at a
/// restarted sidecar.
struct ExecPods {
    api: FakeApiServer,
    dir: PathBuf,
    sidecars: Vec<Sidecar>,
    proxies: Vec<Proxy>,
    execs: Vec<GateClient>,
    log: ChildLog,
}

impl ExecPods {
    async fn start(test: &str) -> ExecPods {
        let (api, dir, sidecars) = start_pair(test, EXEC_TIMING, &["--gate-lag", GATE_LAG]).await;
        let log = ChildLog(dir.join("children.log"));
        let mut proxies = Vec::new();
        let mut execs = Vec::new();
        for (name, sidecar) in NAMES.iter().zip(&sidecars) {
            let proxy = Proxy::start(sidecar.gate).await;
            execs.push(spawn_exec(&dir, name, &proxy.url(), &log.0, COLLECTOR));
            proxies.push(proxy);
        }
        ExecPods {
            api,
            dir,
            sidecars,
            proxies,
            execs,
            log,
        }
    }

    /// The first child to start, and the index of its pod.
    async fn first_child(&self) -> (usize, Entry) {
        let start = self
            .log
            .wait_for(EXEC_TIMING.lease * 3, |e| e.what == "start")
            .await;
        let i = NAMES.iter().position(|n| *n == start.name).unwrap();
        assert_eq!(
            Some(start.term.clone()),
            self.term_of(i).await,
            "the child runs in its sidecar's term"
        );
        (i, start)
    }

    /// The next child of pod `i` to start after `after` (wall clock).
    async fn next_child(&self, i: usize, after: f64) -> Entry {
        let start = self
            .log
            .wait_for(EXEC_TIMING.lease * 3, |e| {
                e.what == "start" && e.name == NAMES[i] && e.wall > after
            })
            .await;
        assert_eq!(
            Some(start.term.clone()),
            self.term_of(i).await,
            "the child runs in its sidecar's term"
        );
        start
    }

    /// The stop of the child that started as `start`.
    async fn stop_of(&self, start: &Entry) -> Entry {
        self.log
            .wait_for(EXEC_TIMING.lease * 2, |e| {
                e.what == "stop" && e.pid == start.pid
            })
            .await
    }

    /// Lets the leader renew a few times, so the validity in force at its
    /// exec is one a `renewed` event gave.
    async fn settle(&self) {
        tokio::time::sleep(EXEC_TIMING.retry * 5 / 2).await;
    }

    async fn term_of(&self, i: usize) -> Option<String> {
        let probe = self.sidecars[i].leader().await?;
        probe.term().map(str::to_owned)
    }

    /// Pod `i`'s sidecar restarted (after it exited or was killed): a new
    /// process on a new port, which its exec reaches through the same proxy.
    async fn restart_sidecar(&mut self, i: usize) {
        let status = self.sidecars[i].wait_exit(SECOND * 10).await;
        assert!(status.is_some(), "{} exits", NAMES[i]);
        let sidecar = Sidecar::spawn_with(
            &self.api,
            &self.dir,
            NAMES[i],
            EXEC_TIMING,
            &["--gate-lag", GATE_LAG],
        );
        sidecar.wait_serving().await;
        self.proxies[i].retarget(sidecar.gate);
        self.sidecars[i] = sidecar;
    }
}

/// A failover by `signal` of the leading sidecar, then back again to the
/// restarted first pod: the children never overlap, and each start is in a
/// new term.
async fn exec_across_failovers(test: &str, signal: i32, what: &str) {
    let mut pods = ExecPods::start(test).await;
    let (l, first) = pods.first_child().await;
    let p = 1 - l;
    pods.settle().await;

    let signalled = wall_now();
    pods.sidecars[l].signal(signal);
    let stopped = pods.stop_of(&first).await;
    let taken_over = pods.next_child(p, first.wall).await;
    assert_ne!(taken_over.term, first.term, "a new term");
    println!(
        "MEASURE exec {what}: child stopped {:.3}s after the signal, {:.3}s before the peer's child started",
        stopped.wall - signalled,
        taken_over.wall - stopped.wall
    );

    // Leadership returns to the first pod: its exec starts a child again,
    // in a new term.
    pods.restart_sidecar(l).await;
    pods.sidecars[p].signal(signal);
    let back = pods.next_child(l, taken_over.wall).await;
    pods.stop_of(&taken_over).await;
    assert!(
        back.term != first.term && back.term != taken_over.term,
        "a new LEADER_GATE_TERM: {back:?} after {first:?} and {taken_over:?}"
    );
    pods.log.assert_never_two_at_once();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_never_runs_two_children_across_a_sigterm_failover() {
    exec_across_failovers("gates-exec-sigterm", libc::SIGTERM, "SIGTERM step-down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_never_runs_two_children_across_a_sigkill_of_the_leading_sidecar() {
    exec_across_failovers("gates-exec-sigkill", libc::SIGKILL, "SIGKILL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_never_runs_two_children_when_the_leading_sidecar_restarts_at_once() {
    // An OOM kill and a container restart: the same identity, at the same
    // address for its exec, while the Lease still names it.
    let mut pods = ExecPods::start("gates-exec-restart").await;
    let (l, first) = pods.first_child().await;
    pods.settle().await;
    pods.sidecars[l].signal(libc::SIGKILL);
    pods.restart_sidecar(l).await;
    pods.stop_of(&first).await;
    let next = pods
        .log
        .wait_for(EXEC_TIMING.lease * 3, |e| {
            e.what == "start" && e.wall > first.wall
        })
        .await;
    let i = NAMES.iter().position(|n| *n == next.name).unwrap();
    assert_eq!(Some(next.term.clone()), pods.term_of(i).await);
    assert_ne!(next.term, first.term, "a new term, whoever won");
    pods.log.assert_never_two_at_once();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_never_runs_two_children_across_an_external_holder_edit() {
    let pods = ExecPods::start("gates-exec-edit").await;
    let (l, first) = pods.first_child().await;
    pods.settle().await;

    let edited = wall_now();
    pods.api.update_lease(LEASE, |lease| {
        lease["spec"]["holderIdentity"] = json!("ghost")
    });
    let stopped = pods.stop_of(&first).await;
    // The ghost never renews: after its expiry one of the pods takes over.
    let next = pods
        .log
        .wait_for(EXEC_TIMING.lease * 3, |e| {
            e.what == "start" && e.wall > first.wall
        })
        .await;
    let i = NAMES.iter().position(|n| *n == next.name).unwrap();
    assert_eq!(Some(next.term.clone()), pods.term_of(i).await);
    assert_ne!(next.term, first.term, "a new term");
    println!(
        "MEASURE exec holder edit: {} stopped {:.3}s after the edit; {} started {:.3}s later",
        NAMES[l],
        stopped.wall - edited,
        next.name,
        next.wall - stopped.wall
    );
    pods.log.assert_never_two_at_once();
}

/// The leader's exec loses its stream (`break_stream`), then its sidecar
/// can no longer renew and the peer takes over: the exec never hears the
/// stop, and must close by the validity it was last given. After healing,
/// leadership returns to it in a new term.
async fn exec_with_a_broken_stream(
    test: &str,
    break_stream: fn(&Proxy),
    heal_stream: fn(&Proxy),
    reason: &str,
) {
    let pods = ExecPods::start(test).await;
    let (l, first) = pods.first_child().await;
    let p = 1 - l;
    pods.settle().await;

    let broken = wall_now();
    break_stream(&pods.proxies[l]);
    pods.api
        .set_fault(NAMES[l], Fault::all(FaultKind::Partition));
    let stopped = pods.stop_of(&first).await;
    let taken_over = pods.next_child(p, first.wall).await;
    assert_ne!(taken_over.term, first.term);
    let stderr = pods.execs[l].stderr();
    assert!(
        stderr.contains(&format!("could not be confirmed ({reason})")),
        "{} stopped its child by the validity rule: {stderr}",
        NAMES[l]
    );
    println!(
        "MEASURE exec {reason}: child stopped {:.3}s after the break, {:.3}s before the peer's child started",
        stopped.wall - broken,
        taken_over.wall - stopped.wall
    );

    pods.api.clear_faults(NAMES[l]);
    heal_stream(&pods.proxies[l]);
    pods.sidecars[l]
        .wait_for(EXEC_TIMING.lease, |probe| probe.holder() == Some(NAMES[p]))
        .await;
    pods.sidecars[p].signal(libc::SIGTERM);
    let back = pods.next_child(l, taken_over.wall).await;
    assert!(back.term != first.term && back.term != taken_over.term);
    pods.log.assert_never_two_at_once();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stops_its_child_before_the_peer_starts_when_its_stream_is_cut() {
    exec_with_a_broken_stream("gates-exec-cut", Proxy::cut, Proxy::up, "stream-lost").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stops_its_child_before_the_peer_starts_when_its_stream_stalls() {
    exec_with_a_broken_stream(
        "gates-exec-stall",
        Proxy::stall,
        Proxy::resume,
        "validity-expired",
    )
    .await;
}

/// Issue 14.4: a resumed stream must not close a gate. `exec` reaches its
/// sidecar through a proxy; the term starts while its stream is held up, so
/// the replay after the reconnect holds the term's `started-leading` (older
/// than its validity) and no renew lands meanwhile: the child starts from
/// the replay alone. Then the stream is cut mid-term, again and again: the
/// child runs on. And a SIGKILL of the sidecar still stops it on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_keeps_its_child_through_resumed_streams_and_stops_it_on_time_after_a_sigkill() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gates-exec-resume");
    // Cut off from the API server: it follows for now.
    api.set_fault("a", Fault::all(FaultKind::Partition));
    let sidecar = Sidecar::spawn(&api, &dir, "a", EXEC_TIMING);
    sidecar.wait_serving().await;
    let proxy = Proxy::start(sidecar.gate).await;
    let log = ChildLog(dir.join("children.log"));
    let mut exec = spawn_exec(&dir, "a", &proxy.url(), &log.0, COLLECTOR);
    while proxy.accepted() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // its `state`: following

    // The term starts while the stream is held up, and runs for longer than
    // any validity (so its start is older than its `valid_for_ms`).
    proxy.stall();
    api.clear_faults("a");
    let term = sidecar
        .wait_leading(EXEC_TIMING.lease * 2)
        .await
        .term()
        .unwrap()
        .to_owned();
    tokio::time::sleep(EXEC_TIMING.renew_deadline + SECOND / 2).await;
    assert_eq!(log.text(), "", "nothing started while the stream was held");
    // No renew lands for a while (well within what is left of the validity):
    // only the replay itself can open the gate.
    api.set_fault("a", Fault::all(FaultKind::Partition));
    let reconnected = Instant::now();
    proxy.cut(); // what it held back is lost
    proxy.resume();
    proxy.up();
    let window = Duration::from_millis(1_200);
    let child = tokio::time::timeout(window, log.wait_for(window * 2, |e| e.what == "start"))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no child within {window:?} of the resume, with no renew meanwhile:\n{}",
                exec.stderr()
            )
        });
    let opened = reconnected.elapsed();
    api.clear_faults("a");
    assert_eq!(child.term, term);
    println!("MEASURE exec resume: child started {opened:?} after a resume replaying the start");

    // Cut mid-term, three times: the child runs through every reconnect.
    for _ in 0..3 {
        tokio::time::sleep(EXEC_TIMING.retry * 2).await;
        let before = proxy.accepted();
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.up();
        let deadline = Instant::now() + SECOND * 5;
        while proxy.accepted() == before {
            assert!(Instant::now() < deadline, "exec reconnects");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(EXEC_TIMING.retry * 2).await;
    assert!(exec.running(), "{}", exec.stderr());
    assert_eq!(
        log.entries().len(),
        1,
        "one child, never stopped:\n{}\n{}",
        log.text(),
        exec.stderr()
    );
    assert!(
        !exec.stderr().contains("could not be confirmed"),
        "{}",
        exec.stderr()
    );

    // SIGKILL: the child stops once the last validity runs out, which is at
    // most the renew deadline after the kill (the child stops at SIGTERM).
    let killed = wall_now();
    sidecar.signal(libc::SIGKILL);
    let stop = log
        .wait_for(EXEC_TIMING.lease * 2, |e| {
            e.what == "stop" && e.pid == child.pid
        })
        .await;
    let took = stop.wall - killed;
    let bound = (EXEC_TIMING.renew_deadline + SECOND).as_secs_f64();
    assert!(
        took <= bound,
        "the child stopped {took:.3}s after the kill (bound {bound}s):\n{}",
        exec.stderr()
    );
    println!("MEASURE exec resume: child stopped {took:.3}s after the SIGKILL (validity <= 3 s)");
}

/// One sidecar that leads alone, and an `exec` of `script` on it.
async fn one_pod(test: &str, script: &str) -> (FakeApiServer, Sidecar, GateClient, ChildLog) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(test);
    let sidecar = Sidecar::spawn(&api, &dir, "a", EXEC_TIMING);
    sidecar.wait_serving().await;
    let log = ChildLog(dir.join("children.log"));
    let url = format!("http://{}", sidecar.gate);
    let exec = spawn_exec(&dir, "a", &url, &log.0, script);
    (api, sidecar, exec, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_forwards_hup_and_usr1_to_the_child() {
    let (_api, _sidecar, mut exec, log) = one_pod("gates-exec-signals", COLLECTOR).await;
    let start = log
        .wait_for(EXEC_TIMING.lease * 2, |e| e.what == "start")
        .await;
    exec.signal(libc::SIGHUP);
    log.wait_for(SECOND * 5, |e| e.what == "hup" && e.pid == start.pid)
        .await;
    exec.signal(libc::SIGUSR1);
    log.wait_for(SECOND * 5, |e| e.what == "usr1" && e.pid == start.pid)
        .await;
    assert!(exec.running(), "exec goes on: {}", exec.stderr());
    assert!(
        log.entries().iter().all(|e| e.what != "stop"),
        "the child goes on:\n{}",
        log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_exec_stops_the_child_and_exits_0() {
    let (_api, _sidecar, mut exec, log) = one_pod("gates-exec-sigterm-self", COLLECTOR).await;
    let start = log
        .wait_for(EXEC_TIMING.lease * 2, |e| e.what == "start")
        .await;
    exec.signal(libc::SIGTERM);
    assert_eq!(exec.exit_code(SECOND * 10).await, 0, "{}", exec.stderr());
    // The child was stopped and reaped before exec exited.
    assert!(
        log.entries()
            .iter()
            .any(|e| e.what == "stop" && e.pid == start.pid),
        "the child got SIGTERM:\n{}",
        log.text()
    );
    // SAFETY: kill(2) with signal 0 only checks whether the pid exists.
    let alive = unsafe { libc::kill(start.pid, 0) } == 0;
    assert!(!alive, "the child (pid {}) is gone", start.pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_kills_a_child_that_ignores_sigterm_once_the_grace_is_over() {
    let script = r#"trap '' TERM
echo "start $NAME $LEADER_GATE_TERM $(date +%s.%N) $$" >> "$LOG"
while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done"#;
    let (_api, _sidecar, mut exec, log) = one_pod("gates-exec-grace", script).await;
    let start = log
        .wait_for(EXEC_TIMING.lease * 2, |e| e.what == "start")
        .await;
    let signalled = Instant::now();
    exec.signal(libc::SIGTERM);
    assert_eq!(exec.exit_code(SECOND * 10).await, 0, "{}", exec.stderr());
    assert!(
        signalled.elapsed() >= SECOND * 2,
        "the child had its --grace 2s"
    );
    // SAFETY: kill(2) with signal 0 only checks whether the pid exists.
    let alive = unsafe { libc::kill(start.pid, 0) } == 0;
    assert!(!alive, "the child (pid {}) is gone", start.pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_exits_with_the_status_of_a_child_that_exits_on_its_own() {
    let script = r#"echo "start $NAME $LEADER_GATE_TERM $(date +%s.%N) $$" >> "$LOG"; exit 7"#;
    let (_api, _sidecar, mut exec, log) = one_pod("gates-exec-status", script).await;
    log.wait_for(EXEC_TIMING.lease * 2, |e| e.what == "start")
        .await;
    assert_eq!(exec.exit_code(SECOND * 10).await, 7, "{}", exec.stderr());
    assert_eq!(log.entries().len(), 1, "not restarted:\n{}", log.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_starts_nothing_while_its_sidecar_is_unreachable() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gates-exec-unreachable");
    let sidecar = Sidecar::spawn(&api, &dir, "a", EXEC_TIMING);
    sidecar.wait_serving().await;
    let term = sidecar
        .wait_leading(EXEC_TIMING.lease * 2)
        .await
        .term()
        .unwrap()
        .to_owned();
    let log = ChildLog(dir.join("children.log"));

    // Nothing listens at all.
    let nowhere = format!("http://{}", free_local_addr());
    let mut lost = spawn_exec(&dir, "nowhere", &nowhere, &log.0, COLLECTOR);
    // A sidecar that leads, behind a connection that is cut.
    let proxy = Proxy::start(sidecar.gate).await;
    proxy.cut();
    let mut cut = spawn_exec(&dir, "a", &proxy.url(), &log.0, COLLECTOR);
    tokio::time::sleep(SECOND * 3).await;
    assert!(lost.running() && cut.running(), "they keep trying");
    assert!(lost.stderr().contains("retrying"), "{}", lost.stderr());
    assert!(cut.stderr().contains("retrying"), "{}", cut.stderr());
    assert_eq!(log.text(), "", "no child started");

    // Stopped while nothing runs, it just exits.
    lost.signal(libc::SIGTERM);
    assert_eq!(lost.exit_code(SECOND * 5).await, 0, "{}", lost.stderr());

    proxy.up();
    let start = log.wait_for(SECOND * 10, |e| e.what == "start").await;
    assert_eq!(
        (start.name.as_str(), start.term.as_str()),
        ("a", term.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_exits_127_at_once_for_an_unknown_command() {
    let dir = test_dir("gates-exec-127");
    let url = format!("http://{}", free_local_addr());
    let mut exec = GateClient::spawn(
        &dir,
        "exec",
        &[
            "exec",
            "--url",
            &url,
            "--",
            "no-such-collector-xyz",
            "--flag",
        ],
        &[],
    );
    assert_eq!(exec.exit_code(SECOND * 5).await, 127);
    assert!(
        exec.stderr()
            .contains("no-such-collector-xyz: command not found"),
        "{}",
        exec.stderr()
    );
}

// ===== status and wait =====

fn status(dir: &std::path::Path, name: &str, url: &str) -> GateClient {
    GateClient::spawn(dir, name, &["status", "--url", url], &[])
}

/// Answers every request with `200 ok`: an HTTP server, not a sidecar.
async fn not_a_sidecar() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0; 4096];
                let _ = socket.read(&mut buffer).await;
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    )
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_0_leading_1_following_and_2_without_a_sidecar_answer() {
    let timing = Timing::FAST;
    let (api, dir, sidecars) = start_pair("gates-status", timing, &[]).await;
    let l = first_leader(&sidecars, timing.lease * 3).await;
    let (leader, follower) = (&sidecars[l], &sidecars[1 - l]);
    follower
        .wait_for(SECOND * 3, |p| p.holder() == Some(NAMES[l]))
        .await;

    let mut on_leader = status(&dir, "status-leader", &format!("http://{}", leader.gate));
    assert_eq!(
        on_leader.exit_code(SECOND * 5).await,
        0,
        "{}",
        on_leader.stderr()
    );
    let body = json_line(on_leader.stdout().trim());
    assert_eq!(
        (body["leading"].clone(), body["identity"].clone()),
        (json!(true), json!(NAMES[l]))
    );

    let mut on_follower = status(
        &dir,
        "status-follower",
        &format!("http://{}/leader", follower.gate),
    );
    assert_eq!(
        on_follower.exit_code(SECOND * 5).await,
        1,
        "{}",
        on_follower.stderr()
    );
    let body = json_line(on_follower.stdout().trim());
    assert_eq!(
        (body["leading"].clone(), body["holder"].clone()),
        (json!(false), json!(NAMES[l]))
    );

    // A sidecar behind a stalled connection is as good as none.
    let stalled = Proxy::start(leader.gate).await;
    stalled.stall();
    let mut silent = status(&dir, "status-stalled", &stalled.url());
    assert_eq!(silent.exit_code(SECOND * 10).await, 2);
    assert!(
        silent.stderr().contains("no answer within"),
        "{}",
        silent.stderr()
    );

    let mut unreachable = status(
        &dir,
        "status-nowhere",
        &format!("http://{}", free_local_addr()),
    );
    assert_eq!(unreachable.exit_code(SECOND * 5).await, 2);
    assert!(
        unreachable.stderr().contains("cannot ask the sidecar"),
        "{}",
        unreachable.stderr()
    );

    for (name, other) in [
        ("status-api", api.addr()),
        ("status-other", not_a_sidecar().await),
    ] {
        let mut wrong = status(&dir, name, &format!("http://{other}"));
        assert_eq!(
            wrong.exit_code(SECOND * 5).await,
            2,
            "{other}: {}",
            wrong.stdout()
        );
        assert!(
            wrong.stderr().contains("not a leader-gate answer"),
            "{}",
            wrong.stderr()
        );
        assert_eq!(wrong.stdout(), "", "nothing on stdout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_1_on_timeout_as_a_follower_and_0_once_its_sidecar_leads() {
    let timing = Timing::FAST;
    let (_api, dir, sidecars) = start_pair("gates-wait", timing, &[]).await;
    let l = first_leader(&sidecars, timing.lease * 3).await;
    let (leader, follower) = (&sidecars[l], &sidecars[1 - l]);
    let follower_url = format!("http://{}", follower.gate);

    let mut on_leader = GateClient::spawn(
        &dir,
        "wait-leader",
        &["wait", "--url", &format!("http://{}", leader.gate)],
        &[],
    );
    assert_eq!(
        on_leader.exit_code(SECOND * 5).await,
        0,
        "{}",
        on_leader.stderr()
    );

    let asked = Instant::now();
    let mut timed_out = GateClient::spawn(
        &dir,
        "wait-timeout",
        &["wait", "--timeout", "1s", "--url", &follower_url],
        &[],
    );
    assert_eq!(
        timed_out.exit_code(SECOND * 5).await,
        1,
        "{}",
        timed_out.stderr()
    );
    assert!(asked.elapsed() >= SECOND, "waited its whole timeout");
    let nowhere = format!("http://{}", free_local_addr());
    let mut unreachable = GateClient::spawn(
        &dir,
        "wait-nowhere",
        &["wait", "--timeout", "1s", "--url", &nowhere],
        &[],
    );
    assert_eq!(
        unreachable.exit_code(SECOND * 5).await,
        1,
        "{}",
        unreachable.stderr()
    );
    assert!(
        timed_out.stderr().contains("not leading after"),
        "{}",
        timed_out.stderr()
    );

    // Without a timeout it waits as long as the follower follows, and ends
    // once it leads: the leader dies, the follower takes over.
    let monitor = Monitor::start(&[follower]);
    let mut waiting = GateClient::spawn(&dir, "wait", &["wait", "--url", &follower_url], &[]);
    tokio::time::sleep(SECOND * 2).await;
    assert!(waiting.running(), "still waiting: {}", waiting.stderr());
    leader.signal(libc::SIGKILL);
    let (status, exited) = waiting
        .wait_exit(timing.lease * 3)
        .await
        .expect("wait ends once its sidecar leads");
    assert_eq!(status.code(), Some(0), "{}", waiting.stderr());
    follower.wait_leading(SECOND).await;
    // Causality: the follower never said "not leading" to a request sent
    // after `wait` had exited.
    let late_no = monitor
        .samples_of(NAMES[1 - l])
        .into_iter()
        .find(|s| s.sent > exited && !s.leading());
    assert!(
        late_no.is_none(),
        "wait exited before its sidecar led: {late_no:?}"
    );
    assert!(
        monitor
            .samples_of(NAMES[1 - l])
            .iter()
            .any(|s| !s.leading() && s.received < exited),
        "the follower was seen following while wait waited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_exec_says_once_that_it_waits_and_starts_nothing() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("exec-says-it-waits");
    // Another holder, live for a minute: this pod follows.
    api.create_lease(support::fake_apiserver::lease_object(
        LEASE,
        Some("ghost"),
        60,
    ));
    let b = Sidecar::spawn(&api, &dir, "b", Timing::FAST);
    b.wait_serving().await;
    let log = ChildLog(dir.join("children.log"));
    let exec = spawn_exec(&dir, "b", &format!("http://{}", b.gate), &log.0, COLLECTOR);
    let waiting = "not leading: the child starts when this pod leads";
    let deadline = Instant::now() + SECOND * 5;
    while !exec.stderr().contains(waiting) {
        assert!(Instant::now() < deadline, "never said: {}", exec.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewals of the other holder and keep-alives come and go: said once.
    tokio::time::sleep(SECOND * 3).await;
    assert_eq!(
        exec.stderr().matches(waiting).count(),
        1,
        "{}",
        exec.stderr()
    );
    assert!(log.entries().is_empty(), "a follower started its child");
}

/// A leader's `exec` starts its child without first saying "not leading":
/// until the sidecar said anything, it only has not heard yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_exec_never_says_it_is_not_leading_before_it_heard() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("exec-leader-not-waiting");
    let a = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    a.wait_serving().await;
    a.wait_term(Timing::FAST.lease * 2).await;
    let log = ChildLog(dir.join("children.log"));
    let exec = spawn_exec(&dir, "a", &format!("http://{}", a.gate), &log.0, COLLECTOR);
    log.wait_for(SECOND * 5, |e| e.name == "a").await;
    assert!(!exec.stderr().contains("not leading"), "{}", exec.stderr());
}

/// `exec` tells the sidecar its `--grace` when it registers; a gate lag that
/// does not cover it with a second to spare is warned of, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_warns_of_an_exec_grace_its_gate_lag_does_not_cover() {
    const TIMING: Timing = Timing {
        lease: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(3),
        retry: Duration::from_secs(1),
    };
    let warning = "does not cover with a second to spare";
    for (grace, warned) in [("2s", true), ("1s", false)] {
        let api = FakeApiServer::start("collectors", LEASE).await;
        let dir = test_dir(&format!("exec-grace-warning-{grace}"));
        let a = Sidecar::spawn_with(&api, &dir, "a", TIMING, &["--gate-lag", "2500ms"]);
        a.wait_serving().await;
        a.wait_leading(TIMING.lease * 3).await;
        let log = ChildLog(dir.join("children.log"));
        let url = format!("http://{}", a.gate);
        let _exec = GateClient::spawn(
            &dir,
            "exec-a",
            &[
                "exec", "--url", &url, "--grace", grace, "--", "sh", "-c", COLLECTOR,
            ],
            &[("NAME", "a"), ("LOG", log.0.to_str().unwrap())],
        );
        log.wait_for(SECOND * 10, |e| e.what == "start").await;
        assert_eq!(
            a.log().contains(warning),
            warned,
            "--grace {grace}:\n{}",
            a.log()
        );
        if warned {
            assert_eq!(a.log().matches(warning).count(), 1, "{}", a.log());
        }
    }
}
