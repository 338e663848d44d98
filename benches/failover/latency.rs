//! Latency rows: first acquisition, start, graceful and crash failover,
//! step-down on an edit, a 403 and hung renews (event fan-out: fanout.rs).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::group::Group;
use crate::program::Program;
use crate::program::{DEFAULTS, FAST, LEASE, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, Fault, FaultKind, Verb};
use crate::support::sidecar::{Sidecar, test_dir};

/// Fresh API server without a Lease, three fresh candidates: from the first
/// spawn to the first `/leader` 200.
pub async fn first_acquisition(program: &Program) -> Duration {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    program.prepare(&api);
    let dir = test_dir(&format!("bench-acquire{}", program.suffix()));
    let started = Instant::now();
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|i| program.spawn(&api, &dir, &format!("p{i}"), DEFAULTS, &[]))
        .collect();
    let deadline = started + Duration::from_secs(10);
    loop {
        for s in &sidecars {
            if s.leader().await.is_some_and(|p| p.leading()) {
                return started.elapsed();
            }
        }
        assert!(Instant::now() < deadline, "no first leader");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One process, fresh API server: spawn → first `/leader` answer (any status).
pub async fn startup(program: &Program) -> Duration {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    program.prepare(&api);
    let dir = test_dir(&format!("bench-startup{}", program.suffix()));
    let started = Instant::now();
    let s = program.spawn(&api, &dir, "p0", DEFAULTS, &[]);
    loop {
        if s.leader().await.is_some() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never answered"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// SIGTERM of the leader → another answers 200; one group, the stopped
/// instance replaced after each round.
pub async fn graceful(program: &Program, rounds: usize) -> Vec<Duration> {
    // The raw hand-over: leader-gate's default --gate-lag (80% of the
    // margin, 4 s) would be most of it; the peer has no such wait.
    let extra: &[&str] = match program {
        Program::LeaderGate => &["--gate-lag", "0s"],
        Program::Peer(_) => &[],
    };
    let mut group = Group::start_program(program, "graceful", DEFAULTS, 3, extra).await;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
        group.wait_renew(leader).await;
        let name = group.sidecars[leader].name.clone();
        let signalled = Instant::now();
        group.sidecars[leader].signal(libc::SIGTERM);
        let (_, took) = group
            .leader_other_than(Some(&name), DEFAULTS.lease * 2)
            .await;
        out.push(took - signalled);
        group.replace(leader).await;
    }
    out
}

/// SIGKILL of the leader → another answers 200, as the overshoot beyond
/// `last successful renew received + lease duration`.
pub async fn crash(program: &Program, rounds: usize) -> Vec<Duration> {
    let mut group = Group::start_program(program, "crash", FAST, 3, &[]).await;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let (leader, _) = group.leader_other_than(None, FAST.lease * 3).await;
        let renew = group.wait_renew(leader).await;
        let name = group.sidecars[leader].name.clone();
        group.sidecars[leader].signal(libc::SIGKILL);
        let (_, took) = group.leader_other_than(Some(&name), FAST.lease * 3).await;
        out.push(took.saturating_duration_since(renew.at + FAST.lease));
        group.replace(leader).await;
    }
    out
}

/// External holder edit → the old leader answers 503 (defaults).
pub async fn edit(rounds: usize) -> Vec<Duration> {
    let group = Group::start("edit", DEFAULTS, 2).await;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
        group.wait_renew(leader).await;
        let edited = Instant::now();
        group
            .api
            .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
        let stopped = group.wait_503(leader, Duration::from_secs(5)).await;
        out.push(stopped - edited);
        group.operator_release();
    }
    out
}

/// Renews answered 403 → 503, from the fake's receipt of the first 403'd
/// renew; and the same as lateness relative to `last successful renew +
/// renew_deadline` (negative: stepped down before the deadline, as G2 asks
/// for a 403). Returns (from the 403, lateness in signed ms).
pub async fn forbidden(rounds: usize) -> (Vec<Duration>, Vec<f64>) {
    let group = Group::start("forbidden", DEFAULTS, 2).await;
    let mut from_403 = Vec::new();
    let mut lateness = Vec::new();
    for _ in 0..rounds {
        let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
        let renew = group.wait_renew(leader).await;
        let name = group.sidecars[leader].name.clone();
        group
            .api
            .set_fault(&name, Fault::on(&[Verb::Update], FaultKind::Status(403)));
        let stopped = group.wait_503(leader, DEFAULTS.renew_deadline * 2).await;
        let first_403 = group
            .api
            .requests_of(&name, Verb::Update)
            .into_iter()
            .find(|r| r.status == Some(403))
            .expect("a 403'd renew");
        from_403.push(stopped.saturating_duration_since(first_403.at));
        lateness.push(signed_ms(stopped, renew.at + DEFAULTS.renew_deadline));
        group.api.clear_faults(&name);
        group.operator_release();
        group.api.clear_requests();
    }
    (from_403, lateness)
}

/// Renews that hang → 503, as lateness relative to `last successful renew
/// (received by the fake) + renew_deadline`, signed ms (FAST timings).
pub async fn hang(rounds: usize) -> Vec<f64> {
    let group = Group::start("hang", FAST, 2).await;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let (leader, _) = group.leader_other_than(None, FAST.lease * 3).await;
        let renew = group.wait_renew(leader).await;
        let name = group.sidecars[leader].name.clone();
        group
            .api
            .set_fault(&name, Fault::on(&[Verb::Update], FaultKind::Hang));
        let stopped = group.wait_503(leader, FAST.renew_deadline * 2).await;
        // The renew just before the fault may have landed after `renew`.
        let last_ok = group
            .successful_updates(&name)
            .last()
            .map_or(renew.at, |r| r.at);
        out.push(signed_ms(stopped, last_ok + FAST.renew_deadline));
        group.api.clear_faults(&name);
        group.operator_release();
        group.api.clear_requests();
    }
    out
}

pub fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1000.0
    } else {
        -((b - a).as_secs_f64() * 1000.0)
    }
}
