//! A sidecar restarted in its pod (`--state-dir`, an emptyDir) resumes its
//! own term when the Lease still shows its last write, instead of waiting a
//! lease duration; and resumes nothing from another directory, a torn
//! record, a record the Lease no longer shows, another boot clock, or a
//! record written under other timing.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Resource, Verb};
use support::sidecar::{Sidecar, Timing, test_dir};

const NAMESPACE: &str = "collectors";
const LEASE: &str = "cluster-metrics";
const TIMING: Timing = Timing::FAST;

/// `a` leads with a state directory, `b` follows; then `a` is SIGKILLed.
async fn leader_killed(test: &str) -> (FakeApiServer, PathBuf, Sidecar, Sidecar, String) {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let state = dir.join("state-a");
    let mut a = Sidecar::spawn_with(&api, &dir, "a", TIMING, &state_args(&state));
    let term = a.wait_term(TIMING.lease * 3).await;
    let b = Sidecar::spawn_with(&api, &dir, "b", TIMING, &[]);
    b.wait_serving().await;
    b.wait_for(Duration::from_secs(5), |p| p.holder() == Some("a"))
        .await;
    a.signal(libc::SIGKILL);
    assert!(a.wait_exit(Duration::from_secs(5)).await.is_some());
    (api, dir, a, b, term)
}

fn state_args(state: &Path) -> Vec<&str> {
    vec!["--state-dir", state.to_str().expect("a UTF-8 path")]
}

/// `a` leading, with `--state-dir` and `--gate-lag`, and `b` following it.
struct Pair {
    api: FakeApiServer,
    dir: PathBuf,
    /// `a`'s state directory.
    state: PathBuf,
    /// `a`'s flags, to restart it with.
    args: Vec<String>,
    a: Sidecar,
    b: Sidecar,
    /// `a`'s term.
    term: String,
}

async fn a_leads_b_follows(test: &str, timing: Timing, gate_lag: Duration) -> Pair {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let state = dir.join("state-a");
    let lag = format!("{}ms", gate_lag.as_millis());
    let mut args: Vec<String> = state_args(&state).into_iter().map(str::to_owned).collect();
    args.extend(["--gate-lag".to_owned(), lag.clone()]);
    let flags: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Sidecar::spawn_with(&api, &dir, "a", timing, &flags);
    let term = a.wait_term(timing.lease * 3).await;
    let b = Sidecar::spawn_with(&api, &dir, "b", timing, &["--gate-lag", &lag]);
    b.wait_serving().await;
    b.wait_for(Duration::from_secs(5), |p| p.holder() == Some("a"))
        .await;
    Pair {
        api,
        dir,
        state,
        args,
        a,
        b,
        term,
    }
}

/// Acquisitions by `b` (successful Lease writes naming it).
fn led_by_b(api: &FakeApiServer) -> usize {
    api.requests_of("b", Verb::Update)
        .into_iter()
        .chain(api.requests_of("b", Verb::Create))
        .filter(|r| r.resource == Some(Resource::Leases))
        .filter(|r| matches!(r.status, Some(200 | 201)) && r.holder.as_deref() == Some("b"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_and_restarted_with_its_state_directory_resumes_its_own_term_at_once() {
    // `_b` lives on: the peer that must not lead meanwhile.
    let (api, dir, _old, _b, term) = leader_killed("resume").await;
    let killed = Instant::now();
    let a = Sidecar::spawn_logged(
        &api,
        &dir,
        "a",
        "a-restarted.log",
        TIMING,
        &state_args(&dir.join("state-a")),
    );
    let probe = a.wait_leading(TIMING.lease).await;
    let took = killed.elapsed();
    println!("MEASURE SIGKILL → the restarted sidecar leads again: {took:?}");
    assert_eq!(probe.term(), Some(term.as_str()), "the same term, resumed");
    // Well within the old term's renew deadline, which bounds a resumption.
    assert!(took < TIMING.renew_deadline, "took {took:?}\n{}", a.log());
    assert_eq!(led_by_b(&api), 0, "the peer never led meanwhile");
    let log = a.log();
    assert!(log.contains("its term resumes"), "{log}");
    assert!(
        log.contains("the lease still shows the previous process's last write: its term resumed"),
        "{log}"
    );
    assert!(!log.contains("ERROR"), "no twin reported: {log}");
    // It renews the resumed term as its own.
    tokio::time::sleep(TIMING.retry * 2).await;
    let probe = a.leader().await.expect("answers");
    assert!(probe.leading() && probe.term() == Some(term.as_str()));
}

/// What a restarted `a` finds, and what it must then not do: lead before
/// the record it cannot prove is its own expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    AnotherDirectory,
    TornFile,
    ChangedRecord,
    AnotherBootClock,
    /// Restarted with a shorter `--gate-lag` (800 ms by default here): the
    /// gates of the previous process would be counted gone too early.
    ShorterGateLag,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_nothing_it_cannot_prove_is_its_own() {
    for case in [
        Refusal::AnotherDirectory,
        Refusal::TornFile,
        Refusal::ChangedRecord,
        Refusal::AnotherBootClock,
        Refusal::ShorterGateLag,
    ] {
        let (api, dir, _old, _b, _term) = leader_killed(&format!("resume-refused-{case:?}")).await;
        let mut state = dir.join("state-a");
        let mut program = None;
        match case {
            Refusal::AnotherDirectory => state = dir.join("state-elsewhere"),
            Refusal::TornFile => {
                let file = std::fs::read_dir(&state)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .find(|p| p.extension().is_some_and(|e| e == "json"))
                    .expect("the record");
                let text = std::fs::read(&file).unwrap();
                std::fs::write(&file, &text[..text.len() / 2]).unwrap();
            }
            Refusal::ChangedRecord => {
                api.update_lease(LEASE, |lease| {
                    lease["spec"]["renewTime"] = "2026-01-01T00:00:00.000000Z".into();
                });
            }
            Refusal::AnotherBootClock => {
                // The same binary in a time namespace whose boot clock is
                // 100,000 s ahead: deadlines on the old clock mean nothing.
                let wrapper = dir.join("in-another-time-namespace");
                std::fs::write(
                    &wrapper,
                    format!(
                        "#!/bin/sh\nexec unshare --time --boottime 100000 -- {} \"$@\"\n",
                        env!("CARGO_BIN_EXE_leader-gate")
                    ),
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
                program = Some(wrapper);
            }
            Refusal::ShorterGateLag => {}
        }
        let mut args = state_args(&state);
        if case == Refusal::ShorterGateLag {
            args.extend(["--gate-lag", "300ms"]);
        }
        let restarted = Instant::now();
        let a = match &program {
            Some(wrapper) => Sidecar::spawn_program(wrapper, &api, &dir, "a-again", TIMING, &{
                let mut args = args.clone();
                args.extend(["--identity", "a"]);
                args
            }),
            None => Sidecar::spawn_logged(&api, &dir, "a", "a-restarted.log", TIMING, &args),
        };
        a.wait_serving().await;
        // A resumed term leads within a few hundred milliseconds; an
        // unproven record counts as someone's live lease until it expires.
        while restarted.elapsed() < Duration::from_millis(1500) {
            let probe = a.leader().await;
            assert!(
                !probe.as_ref().is_some_and(|p| p.leading()),
                "{case:?}: led at once\n{}",
                a.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = a.log();
        assert!(!log.contains("started leading"), "{case:?}: {log}");
        let why = match case {
            Refusal::AnotherDirectory => None,
            // The record names a, with a renewTime a never wrote.
            Refusal::ChangedRecord => {
                Some("not resuming the previous process's term: the lease shows another renewTime")
            }
            Refusal::TornFile => Some("unreadable"),
            Refusal::AnotherBootClock => Some("another boot clock"),
            Refusal::ShorterGateLag => Some("another --renew-deadline or --gate-lag"),
        };
        if let Some(why) = why {
            assert!(log.contains(why), "{case:?}: {log}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_cannot_share_a_state_directory() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("resume-shared");
    let state = dir.join("state");
    let a = Sidecar::spawn_with(&api, &dir, "a", TIMING, &state_args(&state));
    a.wait_serving().await;
    let mut b = Sidecar::spawn_with(&api, &dir, "b", TIMING, &state_args(&state));
    let status = b.wait_exit(Duration::from_secs(10)).await.expect("b exits");
    assert_eq!(status.code(), Some(64), "{}", b.log());
    assert!(
        b.log().contains("invalid --state-dir")
            && b.log()
                .contains("in use by another running leader-gate process"),
        "{}",
        b.log()
    );
}

/// The record is written off the election's thread: a state directory that
/// blocks (its temporary file a FIFO, whose `open` waits as a hung volume
/// would) costs at most the resumption after a restart, never a renew, a
/// probe or a gate's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_that_hangs_stalls_neither_the_renews_nor_the_listeners() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("resume-hung-volume");
    let state = dir.join("state-a");
    std::fs::create_dir_all(&state).unwrap();
    let temporary = state.join(format!("term-{NAMESPACE}.{LEASE}.json.tmp"));
    let fifo = std::ffi::CString::new(temporary.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let a = Sidecar::spawn_with(&api, &dir, "a", TIMING, &state_args(&state));
    let term = a.wait_term(TIMING.lease * 3).await;
    // Its first record now hangs for good; two renew deadlines go by.
    let since = Instant::now();
    tokio::time::sleep(TIMING.renew_deadline * 2).await;
    let healthz = support::sidecar::get(a.admin, "/healthz").await;
    let leader = a.leader().await;
    let gate = support::sidecar::get(a.gate, "/leader").await;
    let renews = api
        .requests_of("a", Verb::Update)
        .into_iter()
        .filter(|r| r.at > since && r.status == Some(200))
        .count();
    // Unblock the writer (a reader that does not wait for it), so the
    // process ends as usual.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&temporary);
    }
    let log = a.log();
    assert!(
        healthz.as_ref().is_some_and(|p| p.status == 200),
        "liveness: {healthz:?}\n{log}"
    );
    let leader = leader.expect("the admin listener answers /leader");
    assert!(
        leader.leading() && leader.term() == Some(term.as_str()),
        "{leader:?}\n{log}"
    );
    assert!(
        gate.is_some_and(|p| p.status == 200),
        "the gate listener answers"
    );
    // A renew every retry period: about six in two renew deadlines.
    assert!(
        renews >= 4,
        "{renews} renews in {:?}\n{log}",
        since.elapsed()
    );
}

/// A margin (3 s) that holds a gate lag of 2.5 s.
const RESUME_TIMING: Timing = Timing {
    lease: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(3),
    retry: Duration::from_secs(1),
};
const RESUME_GATE_LAG: Duration = Duration::from_millis(2500);

/// Gates `x` and `y` are registered for `a`'s term; `a`'s sidecar is
/// SIGKILLed and restarted in its pod, and resumes the term; only `x` comes
/// back (`y`'s stream dropped, its collector may still run). Once `ready`
/// says so of the restarted sidecar (given the instant of the kill), it is
/// sent SIGTERM and `x` acknowledges at once: how long after the SIGTERM
/// and after the kill the Lease was released, and the sidecar's log.
async fn resumed_without_y(
    test: &str,
    ready: impl AsyncFn(&Sidecar, Instant),
) -> (Duration, Duration, String) {
    let Pair {
        api,
        dir,
        args,
        mut a,
        b: _b,
        term,
        ..
    } = a_leads_b_follows(test, RESUME_TIMING, RESUME_GATE_LAG).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut x = EventClient::connect_as_gate(a.gate, "x").await;
    let mut y = EventClient::connect_as_gate(a.gate, "y").await;
    for gate in [&mut x, &mut y] {
        let state = gate.next(Duration::from_secs(1)).await.expect("a state");
        assert_eq!(state.term(), Some(term.as_str()), "registered for the term");
    }

    a.signal(libc::SIGKILL);
    let killed = Instant::now();
    assert!(a.wait_exit(Duration::from_secs(5)).await.is_some());
    drop(y);
    let a = Sidecar::spawn_on(&api, &dir, "a", RESUME_TIMING, a.gate, &args);
    a.wait_serving().await;
    let probe = a.wait_leading(RESUME_TIMING.renew_deadline).await;
    assert_eq!(probe.term(), Some(term.as_str()), "the term resumed");
    let mut x = EventClient::connect_as_gate(a.gate, "x").await;
    let state = x.next(Duration::from_secs(1)).await.expect("a state");
    assert_eq!(state.term(), Some(term.as_str()));

    ready(&a, killed).await;
    let signalled = Instant::now();
    a.signal(libc::SIGTERM);
    assert_eq!(x.stopped_term(Duration::from_secs(5)).await, term);
    assert_eq!(a.acknowledge("x", &term).await, 204);
    let released = api.release_of("a", RESUME_TIMING.lease * 2).await;
    (
        released.saturating_duration_since(signalled),
        released.saturating_duration_since(killed),
        a.log(),
    )
}

/// [`resumed_without_y`], SIGTERM at once: the resumed sidecar cannot know
/// of `y`, which never heard the term end, so however soon `x`
/// acknowledges, the release waits the whole gate lag and, if later, until
/// `y`'s validity from the old process (at least a renew deadline less a
/// retry period after the kill) and a gate lag have run out; the log says
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_term_waits_its_whole_gate_lag_for_the_gates_registered_before_the_restart() {
    let timing = RESUME_TIMING;
    let (after, after_kill, log) = resumed_without_y("resume-gate-lag", async |_, _| {}).await;
    let y_gone = timing.renew_deadline - timing.retry + RESUME_GATE_LAG;
    assert!(
        after >= RESUME_GATE_LAG,
        "released {after:?} after SIGTERM, within the gate lag {RESUME_GATE_LAG:?}\n{log}"
    );
    // y never heard the term end: it stops only when the old process's
    // validity, and a gate lag, have run out.
    assert!(
        after_kill >= y_gone,
        "released {after_kill:?} after the kill, before y could have stopped ({y_gone:?})\n{log}"
    );
    assert!(
        log.contains(
            "the release waits at least the whole gate lag: the term was resumed after a restart"
        ),
        "{log}"
    );
}

/// [`resumed_without_y`], SIGTERM once `y`'s validity from the old process
/// (its last renew + the renew deadline) and a gate lag ran out: `y`, which
/// never came back, holds nothing by then, so the gates the resumed
/// sidecar knows are all there are, and `x`'s acknowledgement ends the
/// release's wait at once (seen on a real cluster: a sidecar SIGKILLed
/// minutes before a rollout made its hand-over wait the whole 12 s gate
/// lag, and the collector missed two intervals).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_term_ends_on_its_gates_word_once_the_gates_unknown_since_the_restart_hold_nothing()
 {
    let timing = RESUME_TIMING;
    let (after, _, log) = resumed_without_y("resume-unknown-gone", async |a, killed| {
        // The old process's last renew was sent within a retry period
        // before the kill; its validity ended a renew deadline after it.
        let gone = killed + timing.renew_deadline + RESUME_GATE_LAG;
        while !a.log().contains("hold nothing of it now") {
            assert!(
                Instant::now() < gone + Duration::from_secs(2),
                "not said by {:?} after the kill\n{}",
                killed.elapsed(),
                a.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            Instant::now() >= killed + (timing.renew_deadline - timing.retry) + RESUME_GATE_LAG,
            "said {:?} after the kill: before the old validity and a gate lag could run out",
            killed.elapsed()
        );
    })
    .await;
    assert!(
        after < RESUME_GATE_LAG - Duration::from_secs(1),
        "released {after:?} after SIGTERM: x acknowledged at once\n{log}"
    );
    assert!(
        !log.contains("the release waits at least the whole gate lag"),
        "{log}"
    );
}

/// Issue 35: `prestop` asked `a` to stand aside, and `a` is SIGKILLed during
/// its gate lag, before the release. The state record is written by a
/// thread (newest wins): if it still held the last renew, the restarted
/// sidecar would resume the term that had stepped down and re-open its
/// gates for it. The step-down clears it first, so a kill during the gate
/// lag finds nothing to resume: the restarted sidecar waits out the Lease
/// like any peer, and the term that stepped down never starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_during_a_step_downs_gate_lag_resumes_nothing() {
    const TIMING: Timing = Timing::GATES;
    const GATE_LAG: Duration = Duration::from_millis(2500);
    let Pair {
        api,
        dir,
        state,
        args,
        mut a,
        b,
        term,
    } = a_leads_b_follows("resume-after-step-down", TIMING, GATE_LAG).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let record = || {
        std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
    };
    assert!(record().is_some(), "the leader keeps a record");

    let asked = Instant::now();
    let status = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-m",
            "2",
            "-w",
            "%{http_code}",
            "-X",
        ])
        .arg("POST")
        .arg(format!("http://{}/handover", a.gate))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "202");
    a.wait_for(Duration::from_secs(1), |p| !p.leading()).await;
    // Within the gate lag: stepped down, not yet released.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(asked.elapsed() < GATE_LAG);
    let lease = api.lease(LEASE).expect("the lease");
    assert_eq!(lease["spec"]["holderIdentity"], "a", "not released yet");
    assert_eq!(record(), None, "the step-down cleared the record");
    a.signal(libc::SIGKILL);
    assert!(a.wait_exit(Duration::from_secs(5)).await.is_some());

    let a = Sidecar::spawn_on(&api, &dir, "a", TIMING, a.gate, &args);
    a.wait_serving().await;
    // The killed write is held for a lease duration from when each saw it:
    // nobody leads within the old term's renew deadline, a least of all.
    tokio::time::sleep(TIMING.renew_deadline).await;
    let probe = a.leader().await.expect("answers");
    assert!(
        !probe.leading(),
        "resumed the term that stepped down: {probe:?}"
    );
    let (first, _) = tokio::select! {
        p = a.wait_leading(TIMING.lease * 3) => ("a", p),
        p = b.wait_leading(TIMING.lease * 3) => ("b", p),
    };
    let probe = if first == "a" {
        a.leader().await
    } else {
        b.leader().await
    }
    .expect("answers");
    assert_ne!(
        probe.term(),
        Some(term.as_str()),
        "the term that stepped down never starts again ({first} leads)"
    );
    let log = a.log();
    assert!(!log.contains("its term resumes"), "{log}");
}
