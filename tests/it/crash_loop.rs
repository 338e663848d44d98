//! A crash-looping collector under `exec`, end to end: real `leader-gate`
//! processes against the fake Lease API server, each pod's `exec` restarted
//! by a stand-in for the kubelet whenever it exits (after a delay that
//! doubles per restart, as CrashLoopBackOff's, scaled down). The child
//! either runs ([`COLLECTOR`]) or exits with status 2 at once ([`CRASHER`]).
//!
//! Judged by the children's own log (when each ran, never two at once), the
//! leader's event stream (why and when its term ended) and the overlap
//! monitor's samples of `/leader`.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, lease_holder};
use support::gate_clients::{COLLECTOR, ChildLog, GateClient};
use support::kubelet::Kubelet;
use support::monitor::Monitor;
use support::sidecar::{Sidecar, Timing, get, test_dir};

const LEASE: &str = "cluster-metrics";
/// The margin (lease − renew deadline = 3 s) covers exec's `--grace 2s`.
const TIMING: Timing = Timing {
    lease: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(3),
    retry: Duration::from_secs(1),
};
/// `--collector-not-running-after` in these tests.
const BOUND: Duration = Duration::from_secs(2);
const BOUND_FLAG: &str = "2s";
/// The kubelet's restart delay: the first, doubling up to the cap.
const RESTART_FIRST: Duration = Duration::from_millis(500);
const RESTART_CAP: Duration = Duration::from_secs(4);
/// From the child's exit to `exec`'s acknowledgement, and from the
/// verdict to the published step-down, on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

/// A collector that cannot start: it logs a run of 0.1 s, then exits 2.
const CRASHER: &str = r#"
note() { echo "$1 $NAME $LEADER_GATE_TERM $(date +%s.%N) $$" >> "$LOG"; }
note start
sleep 0.1
note stop
exit 2
"#;

/// A pod's `exec`, restarted whenever it exits (see [`Kubelet`]).
fn exec_restarted(
    dir: &Path,
    name: &'static str,
    sidecar: &Sidecar,
    log: &Path,
    command: &[&str],
) -> Kubelet {
    let dir = dir.to_path_buf();
    let url = format!("http://{}", sidecar.gate);
    let log = log.to_str().expect("a UTF-8 path").to_owned();
    let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    Kubelet::start(RESTART_FIRST, RESTART_CAP, move |restart| {
        let mut args = vec!["exec".to_owned(), "--url".into(), url.clone()];
        args.extend(["--grace".into(), "2s".into(), "--".into()]);
        args.extend(command.iter().cloned());
        let (dir, log) = (dir.clone(), log.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut exec = GateClient::spawn(
                &dir,
                &format!("exec-{name}-{restart}"),
                &args,
                &[("NAME", name), ("LOG", &log)],
            );
            let (status, _) = exec.wait_exit(Duration::from_secs(3600)).await?;
            Some(status.code().unwrap_or(-1))
        }
    })
}

/// A pod's `exec -- sh -c SCRIPT`, restarted whenever it exits.
fn exec_script_restarted(
    dir: &Path,
    name: &'static str,
    sidecar: &Sidecar,
    log: &Path,
    script: &'static str,
) -> Kubelet {
    exec_restarted(dir, name, sidecar, log, &["sh", "-c", script])
}

fn sidecar(api: &FakeApiServer, dir: &Path, name: &str) -> Sidecar {
    Sidecar::spawn_with(
        api,
        dir,
        name,
        TIMING,
        &["--collector-not-running-after", BOUND_FLAG],
    )
}

async fn metrics(sidecar: &Sidecar) -> String {
    let probe = get(sidecar.admin, "/metrics")
        .await
        .expect("/metrics answers");
    probe.body.as_str().expect("text").to_owned()
}

const WITHOUT_COLLECTOR: &str =
    "\nleader_gate_leading_without_collector{lease=\"collectors/cluster-metrics\"} ";

fn logs(sidecars: &[&Sidecar], dir: &Path) -> String {
    let mut out = String::new();
    for sidecar in sidecars {
        let log = sidecar.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        out += &format!("--- {} ---\n{tail}\n", sidecar.name);
    }
    out + &format!("(exec logs in {})", dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_collector_crash_loops_hands_the_lease_to_a_peer_whose_collector_runs() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir: PathBuf = test_dir("crash-loop-handover");
    let log = ChildLog(dir.join("children.log"));
    // a leads first, then its collector crash-loops.
    let a = sidecar(&api, &dir, "a");
    a.wait_serving().await;
    let led = a.wait_leading(TIMING.lease * 2).await;
    let term = led.term().unwrap().to_owned();
    let mut stream = EventClient::connect(a.gate, None).await;
    let _a_exec = exec_script_restarted(&dir, "a", &a, &log.0, CRASHER);
    let b = sidecar(&api, &dir, "b");
    b.wait_serving().await;
    let monitor = Monitor::start(&[&a, &b]);
    let _b_exec = exec_script_restarted(&dir, "b", &b, &log.0, COLLECTOR);

    // While it leads between two restarts, the metric says so.
    let deadline = Instant::now() + TIMING.lease * 3;
    loop {
        if metrics(&a)
            .await
            .contains(&format!("{WITHOUT_COLLECTOR}1\n"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never exported as leading without a collector\n{}",
            logs(&[&a, &b], &dir)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stopped = stream
        .next_of("stopped-leading", Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("a kept the lease\n{}", logs(&[&a, &b], &dir)));
    assert_eq!(stopped.data["reason"], "collector-not-running");
    assert_eq!(stopped.term(), Some(term.as_str()));
    let stopped_at = stopped.data["published_at_us"].as_i64().unwrap() as f64 / 1e6;
    // Within the bound of its collector's last run, never sooner.
    let last_run = log
        .entries()
        .into_iter()
        .filter(|e| e.name == "a" && e.what == "stop" && e.wall < stopped_at)
        .map(|e| e.wall)
        .fold(f64::MIN, f64::max);
    let after = stopped_at - last_run;
    println!(
        "MEASURE crash loop: stepped down {after:.3} s after the collector last ran (bound {BOUND:?})"
    );
    assert!(
        after >= BOUND.as_secs_f64() && after <= (BOUND + SLACK).as_secs_f64(),
        "stepped down {after:.3} s after the last run\n{}",
        log.text()
    );

    // The peer's collector runs, and keeps running under its term.
    let started = log
        .wait_for(TIMING.lease * 2, |e| e.name == "b" && e.what == "start")
        .await;
    assert!(started.wall > stopped_at);
    let holder = lease_holder(&api.lease(LEASE).unwrap());
    assert_eq!(holder.as_deref(), Some("b"));
    let new_term = b.leader().await.unwrap().term().unwrap().to_owned();
    tokio::time::sleep(BOUND * 3).await;
    let probe = b.leader().await.unwrap();
    assert!(probe.leading(), "b keeps it\n{}", logs(&[&a, &b], &dir));
    assert_eq!(probe.term(), Some(new_term.as_str()));
    assert!(
        metrics(&b)
            .await
            .contains(&format!("{WITHOUT_COLLECTOR}0\n"))
    );
    let old = a.leader().await.unwrap();
    assert_eq!(old.body["last_stop_reason"], "collector-not-running");
    assert!(
        metrics(&a)
            .await
            .lines()
            .any(|l| l.starts_with("leader_gate_transitions_total")
                && l.contains(r#"reason="collector-not-running""#)
                && l.ends_with(" 1")),
    );
    assert!(a.log().contains("--collector-not-running-after"));
    log.assert_never_two_at_once();
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_collector_crash_looping_the_group_keeps_a_leader_and_terms_grow_from_the_bound()
{
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("crash-loop-all");
    let log = ChildLog(dir.join("children.log"));
    let names = ["a", "b", "c"];
    let sidecars: Vec<Sidecar> = names.iter().map(|n| sidecar(&api, &dir, n)).collect();
    for sidecar in &sidecars {
        sidecar.wait_serving().await;
    }
    let refs: Vec<&Sidecar> = sidecars.iter().collect();
    let monitor = Monitor::start(&refs);
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .zip(&sidecars)
        .map(|(name, sidecar)| exec_script_restarted(&dir, name, sidecar, &log.0, CRASHER))
        .collect();
    let from = Instant::now();
    let watch = Duration::from_secs(40);
    tokio::time::sleep(watch).await;

    let samples: Vec<_> = monitor
        .samples()
        .into_iter()
        .filter(|s| s.sent >= from + TIMING.lease)
        .collect();
    // Someone leads, again and again: never leaderless for longer than the
    // longest stand-back wait (the lease duration, jittered) and an attempt.
    let mut leaderless_from = samples[0].sent;
    let mut longest = Duration::ZERO;
    // Each term: its first and last sample as leader.
    let mut terms: Vec<(String, Instant, Instant)> = Vec::new();
    for sample in &samples {
        if sample.leading() {
            leaderless_from = sample.sent;
            let term = sample.term.clone().unwrap_or_default();
            match terms.last_mut() {
                Some((t, _, last)) if *t == term => *last = sample.sent,
                _ => terms.push((term, sample.sent, sample.sent)),
            }
        }
        longest = longest.max(sample.sent.saturating_duration_since(leaderless_from));
    }
    let limit = TIMING.lease + TIMING.lease / 10 + TIMING.retry * 2 + SLACK;
    println!(
        "MEASURE every collector crash-looping: {} terms in {watch:?}, longest leaderless {longest:?} (limit {limit:?})",
        terms.len()
    );
    assert!(
        longest < limit,
        "leaderless for {longest:?}\n{}",
        logs(&refs, &dir)
    );
    assert!(
        terms.len() >= 2,
        "still handed over: {terms:?}\n{}",
        logs(&refs, &dir)
    );
    // No flapping: every whole term (not the first or last seen) lasted
    // the bound at least, and hand-overs are that rare.
    for (term, first, last) in &terms[1..terms.len() - 1] {
        assert!(
            last.saturating_duration_since(*first) >= BOUND - Duration::from_millis(300),
            "term {term} lasted {:?}\n{}",
            last.saturating_duration_since(*first),
            logs(&refs, &dir)
        );
    }
    // A pod whose collector failed before keeps it longer (the bound
    // doubled per such release): the Lease goes round ever more slowly.
    let longest_term = terms[1..terms.len() - 1]
        .iter()
        .map(|(_, first, last)| last.saturating_duration_since(*first))
        .max()
        .unwrap_or_default();
    assert!(
        longest_term >= 2 * BOUND - Duration::from_millis(300),
        "no longer term: {terms:?}\n{}",
        logs(&refs, &dir)
    );
    let most = (watch.as_secs_f64() / BOUND.as_secs_f64()).ceil() as usize + 1;
    assert!(terms.len() <= most, "{} terms: flapping", terms.len());
    // Each stop was for the collector that did not run.
    let not_running: usize = sidecars
        .iter()
        .map(|s| s.log().matches("nothing of this pod's term runs").count())
        .sum();
    assert!(not_running >= terms.len() - 1, "{}", logs(&refs, &dir));
    log.assert_never_two_at_once();
    monitor.assert_no_overlap();
}

/// Exits 2 on its first run (when `$LOG.once` is missing), then runs as
/// [`COLLECTOR`] does.
const CRASHES_ONCE: &str = r#"
note() { echo "$1 $NAME $LEADER_GATE_TERM $(date +%s.%N) $$" >> "$LOG"; }
if [ ! -e "$LOG.once" ]; then
    : > "$LOG.once"
    note start
    note stop
    exit 2
fi
trap 'note stop; exit 0' TERM
note start
while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_exits_once_and_is_restarted_within_the_bound_keeps_the_lease() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("crash-once");
    let log = ChildLog(dir.join("children.log"));
    let a = sidecar(&api, &dir, "a");
    a.wait_serving().await;
    let term = a
        .wait_leading(TIMING.lease * 2)
        .await
        .term()
        .unwrap()
        .to_owned();
    let mut stream = EventClient::connect(a.gate, None).await;
    let _exec = exec_script_restarted(&dir, "a", &a, &log.0, CRASHES_ONCE);
    // The crash, then the run after the restart (within RESTART_FIRST).
    let runs = |log: &ChildLog| log.entries().iter().filter(|e| e.what == "start").count();
    let deadline = Instant::now() + TIMING.lease * 2;
    while runs(&log) < 2 {
        assert!(Instant::now() < deadline, "not restarted\n{}", log.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = stream.next_of("stopped-leading", BOUND * 3).await;
    assert!(stopped.is_none(), "stepped down: {stopped:?}\n{}", a.log());
    let probe = a.leader().await.unwrap();
    assert!(probe.leading());
    assert_eq!(probe.term(), Some(term.as_str()), "the same term");
    assert!(
        metrics(&a)
            .await
            .contains(&format!("{WITHOUT_COLLECTOR}0\n"))
    );
}

// ===== a command that cannot start =====

/// `leader_gate_leading_without_collector` of `sidecar`, as exported.
async fn without_collector(sidecar: &Sidecar) -> String {
    metrics(sidecar)
        .await
        .lines()
        .find(|l| l.starts_with("leader_gate_leading_without_collector{"))
        .unwrap_or("(no such series)")
        .to_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// An `exec` whose command cannot be run exits 127 on every restart (a
/// crash loop to the kubelet) — and, before each exit, tells the sidecar
/// that nothing of the term runs here, as a child that exited does: the
/// leader hands the Lease over within the bound, to a peer whose collector
/// runs. Without that word the gate stays registered as running and the
/// leader keeps the Lease for good while no collector runs anywhere.
///
/// At least three exits: the kubelet stand-in waits 0.5, 1, then 2 s, and
/// the third wait already reaches the 2 s bound — the loop of a child that
/// exits 2 ([`CRASHER`]) hands over after the same three exits.
async fn a_command_that_cannot_start_hands_the_lease_over(
    name: &str,
    command: impl FnOnce(&Path) -> String,
    says: &str,
) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(name);
    let log = ChildLog(dir.join("children.log"));
    let a = sidecar(&api, &dir, "a");
    a.wait_serving().await;
    let term = a.wait_term(TIMING.lease * 2).await;
    let mut stream = EventClient::connect(a.gate, None).await;

    let command = command(&dir);
    let a_kubelet = exec_restarted(&dir, "a", &a, &log.0, &[&command]);
    // b: a healthy peer whose collector would run.
    let b = sidecar(&api, &dir, "b");
    b.wait_serving().await;
    let _b_kubelet = exec_script_restarted(&dir, "b", &b, &log.0, COLLECTOR);

    // The bound is 2 s; the crashing child of the control test is handed
    // over about 2-3.5 s after its last run. Give it ten times that.
    let stopped = stream
        .next_of("stopped-leading", Duration::from_secs(25))
        .await;
    let exits = a_kubelet.exits();
    let metric = without_collector(&a).await;
    let holder = lease_holder(&api.lease(LEASE).unwrap());
    let first_exec = std::fs::read_to_string(dir.join("exec-a-0.err")).unwrap_or_default();
    println!(
        "a led term {term}; its exec exited {exits:?}; then stopped-leading {:?}, holder \
         {holder:?}, {metric}\nexec-a-0 said:\n{}",
        stopped.as_ref().map(|s| s.data["reason"].clone()),
        first_exec.trim()
    );
    assert!(
        exits.len() >= 3 && exits.iter().all(|&code| code == 127),
        "a crash loop of exit 127: {exits:?}"
    );
    assert!(first_exec.contains(says), "{first_exec}");
    assert!(
        first_exec.contains(&format!(
            "told the sidecar that nothing of term {term} runs here"
        )),
        "{first_exec}"
    );
    assert!(
        log.entries().iter().all(|e| e.name != "a"),
        "a's collector never ran"
    );
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "a kept the lease for 25 s while its exec crash-looped (exit 127, {} times) and no \
             collector ran; holder {holder:?}; {metric}\n--- a ---\n{}",
            exits.len(),
            tail(&a.log(), 15)
        )
    });
    assert_eq!(stopped.data["reason"], "collector-not-running");
    // The group's work goes on: b leads and its collector runs.
    let deadline = Instant::now() + TIMING.lease * 3;
    while Instant::now() < deadline && !log.entries().iter().any(|e| e.name == "b") {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.entries().iter().any(|e| e.name == "b"),
        "b's collector never ran; holder {:?}",
        lease_holder(&api.lease(LEASE).unwrap())
    );
}

/// A script whose interpreter is missing (`#!/bin/bash` in an image
/// without bash): found, executable, and `execve` fails with ENOENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_whose_script_has_no_interpreter_crash_loops_and_the_leader_hands_over() {
    a_command_that_cannot_start_hands_the_lease_over(
        "crash-loop-no-interpreter",
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            let broken = dir.join("collector");
            std::fs::write(&broken, "#!/nonexistent/interpreter\necho never\n").unwrap();
            std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
            broken.to_str().unwrap().to_owned()
        },
        "its interpreter /nonexistent/interpreter (the script's #! line) does not exist",
    )
    .await;
}

/// A command not found at all (a typo, an image without the collector):
/// said at once, and the leader's sidecar told all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_whose_command_is_not_found_crash_loops_and_the_leader_hands_over() {
    a_command_that_cannot_start_hands_the_lease_over(
        "crash-loop-not-found",
        |_| "no-such-collector-xyz".to_owned(),
        "no-such-collector-xyz: command not found",
    )
    .await;
}

/// An `exec` killed without a word each time its collector starts — its
/// whole container OOM-killed (cgroup v2 kills the group), or SIGKILLed —
/// never tells the sidecar anything; once gone for good (the renew
/// deadline plus the gate lag: its validity ran out and its collector was
/// stopped) it counts as running nothing, so a leader whose collector is
/// killed in a loop hands the Lease over, as for one that exits. Before,
/// each dead `exec` stayed registered as running and the leader kept the
/// Lease for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_killed_in_a_loop_without_a_word_hands_the_lease_over() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("crash-loop-sigkill");
    let log = ChildLog(dir.join("children.log"));
    let a = sidecar(&api, &dir, "a");
    a.wait_serving().await;
    let term = a.wait_term(TIMING.lease * 2).await;
    let mut stream = EventClient::connect(a.gate, None).await;
    // The kubelet: restarts a's exec after 0.5 s, doubling up to 12 s (the
    // bound, 2 s, must fit after gone-for-good, about 5.4 s here); a's
    // collector is killed, exec and all, as soon as it runs.
    let kubelet = {
        let (dir, url, log) = (dir.clone(), format!("http://{}", a.gate), log.0.clone());
        Kubelet::start(RESTART_FIRST, Duration::from_secs(12), move |restart| {
            let (dir, url, log) = (dir.clone(), url.clone(), ChildLog(log.clone()));
            async move {
                let starts = || {
                    log.entries()
                        .iter()
                        .filter(|e| e.name == "a" && e.what == "start")
                        .count()
                };
                let runs = starts();
                let mut exec = GateClient::spawn(
                    &dir,
                    &format!("exec-a-{restart}"),
                    &[
                        "exec", "--url", &url, "--grace", "2s", "--", "sh", "-c", COLLECTOR,
                    ],
                    &[("NAME", "a"), ("LOG", log.0.to_str().unwrap())],
                );
                // Killed once its collector runs (a follower's never does).
                let deadline = Instant::now() + Duration::from_secs(10);
                while starts() == runs && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                exec.signal(libc::SIGKILL);
                let (status, _) = exec.wait_exit(Duration::from_secs(10)).await?;
                Some(status.code().unwrap_or(-1))
            }
        })
    };
    let b = sidecar(&api, &dir, "b");
    b.wait_serving().await;
    let _b_kubelet = exec_script_restarted(&dir, "b", &b, &log.0, COLLECTOR);

    let stopped = stream
        .next_of("stopped-leading", Duration::from_secs(60))
        .await;
    let killed = kubelet.exits().len();
    drop(kubelet);
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "a kept the Lease while its exec was killed {killed} times\n{}",
            tail(&a.log(), 15)
        )
    });
    println!("a led term {term}; its exec was killed {killed} times, then it stopped leading");
    assert_eq!(stopped.data["reason"], "collector-not-running");
    assert!(killed >= 2, "a loop, not a single kill: {killed}");
    let deadline = Instant::now() + TIMING.lease * 3;
    while Instant::now() < deadline && !log.entries().iter().any(|e| e.name == "b") {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.entries().iter().any(|e| e.name == "b"),
        "b's collector runs"
    );
    // (Not judged from the children's log: a SIGKILLed child writes no
    // `stop`. That a killed exec's tree dies with it: exec_tree.rs.)
}

/// A program built for another architecture (an amd64 image on an arm64
/// node): told before it is started, since glibc would hand the file to
/// `/bin/sh` and the kernel's "exec format error" would never be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_whose_program_is_for_another_architecture_crash_loops_and_the_leader_hands_over() {
    a_command_that_cannot_start_hands_the_lease_over(
        "crash-loop-foreign-elf",
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            let foreign = dir.join("collector");
            let machine: u16 = if cfg!(target_arch = "aarch64") {
                62
            } else {
                183
            };
            let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
            elf.resize(18, 0);
            elf.extend_from_slice(&machine.to_le_bytes());
            elf.resize(64, 0);
            std::fs::write(&foreign, &elf).unwrap();
            std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
            foreign.to_str().unwrap().to_owned()
        },
        "exec format error: a program for",
    )
    .await;
}
