//! Safe defaults (issue 14, item 3): with no `--gate-lag` and no
//! `--shutdown-timeout`, a graceful hand-over of the real binary waits the
//! gate lag derived from the timing rule (80% of the margin) before it
//! releases the Lease, and still finishes within the derived shutdown
//! timeout (gate lag + 5 s): the release happens and the peer takes it at
//! once, long before any expiry.
//!
//! Judged by causality from the fake API server's request log: the old
//! leader's release write comes no earlier than the gate lag after the
//! SIGTERM (before which it cannot have stepped down).

use crate::support;

use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Verb, lease_holder};
use support::monitor::Monitor;
use support::sidecar::{Sidecar, Timing, first_leader, test_dir};

const NAMESPACE: &str = "collectors";
const LEASE: &str = "cluster-metrics";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_flags_a_graceful_hand_over_waits_most_of_the_margin_then_releases() {
    // Margin 2 s: the derived gate lag is 1.6 s, the shutdown timeout 6.6 s.
    // A long lease duration next to it would make a takeover by expiry slow
    // enough to tell apart; 6 s is plenty at this scale.
    let timing = Timing {
        lease: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry: Duration::from_secs(1),
    };
    let gate_lag = Duration::from_millis(1600);
    let shutdown_timeout = gate_lag + Duration::from_secs(5);
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("safe-defaults");
    // No --gate-lag, no --shutdown-timeout: the defaults under test.
    let mut a = Sidecar::spawn(&api, &dir, "a", timing);
    let mut b = Sidecar::spawn(&api, &dir, "b", timing);
    a.wait_serving().await;
    b.wait_serving().await;
    let monitor = Monitor::start(&[&a, &b]);
    for s in [&a, &b] {
        let log = s.log();
        let starting = log
            .lines()
            .find(|l| l.contains("leader-gate starting"))
            .unwrap_or_else(|| panic!("no start line:\n{log}"));
        assert!(starting.contains("gate_lag=1.6s"), "{starting}");
        assert!(starting.contains("shutdown_timeout=6.6s"), "{starting}");
    }

    let (old, new) = first_leader(&mut a, &mut b, timing.lease * 3).await;
    let signalled = Instant::now();
    old.signal(libc::SIGTERM);
    let status = old
        .wait_exit(shutdown_timeout + Duration::from_secs(3))
        .await;
    let exited = signalled.elapsed();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "clean exit within the derived shutdown timeout\n{}",
        old.log()
    );
    new.wait_leading(timing.lease * 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // let the monitor sample

    // The release: the old leader's last write, after the gate lag.
    let release = api
        .requests_of(&old.name, Verb::Update)
        .into_iter()
        .rfind(|r| r.at > signalled && r.status == Some(200))
        .unwrap_or_else(|| panic!("the old leader never released\n{}", old.log()));
    let waited = release.at - signalled;
    assert!(
        waited >= gate_lag,
        "released {waited:?} after SIGTERM: the gates had less than the default gate lag {gate_lag:?}"
    );
    assert!(
        waited < shutdown_timeout,
        "released {waited:?} after SIGTERM"
    );
    assert!(
        exited < shutdown_timeout + Duration::from_secs(2),
        "{exited:?}"
    );
    assert!(old.log().contains("released the lease"), "{}", old.log());
    // Taken at once on the release, not by expiry.
    let acquire = api
        .requests_of(&new.name, Verb::Update)
        .into_iter()
        .chain(api.requests_of(&new.name, Verb::Create))
        .filter(|r| r.at > release.at && r.status.is_some_and(|s| s < 300))
        .map(|r| r.at)
        .min()
        .expect("the peer acquired");
    assert!(
        acquire - release.at < timing.lease / 2,
        "taken {:?} after the release",
        acquire - release.at
    );
    assert_eq!(
        lease_holder(&api.lease(LEASE).unwrap()).as_deref(),
        Some(new.name.as_str())
    );
    eprintln!(
        "MEASURE default hand-over: released {waited:?} after SIGTERM (gate lag {gate_lag:?}), exited after {exited:?}"
    );
    monitor.assert_no_overlap();
}
