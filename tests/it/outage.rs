//! The API server fails, end to end: real `leader-gate` processes against
//! the fake API server answering 503 or 429, refusing connections, or
//! black-holed. Followers back off instead of adding load; a leader keeps
//! its renew deadline; a release on shutdown is retried; the log names the
//! cause and the server.

use crate::support;

use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, Verb};
use support::sidecar::{Sidecar, Timing, test_dir};

const NAMESPACE: &str = "monitoring";
const LEASE: &str = "cluster-metrics";

/// Long enough a lease, next to the retry period, for the backoff to show.
const SLOW: Timing = Timing {
    lease: Duration::from_secs(10),
    renew_deadline: Duration::from_secs(6),
    retry: Duration::from_secs(1),
};

/// `--gate-lag` these tests pass (the default would be 80 % of the margin).
const GATE_LAG: Duration = Duration::from_millis(500);

async fn leader_and_follower(test: &str, timing: Timing) -> (FakeApiServer, Sidecar, Sidecar) {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let lag = ["--gate-lag", "500ms"];
    let a = Sidecar::spawn_with(&api, &dir, "a", timing, &lag);
    a.wait_serving().await;
    a.wait_leading(timing.lease * 3).await;
    let b = Sidecar::spawn_with(&api, &dir, "b", timing, &lag);
    b.wait_serving().await;
    b.wait_for(Duration::from_secs(10), |p| p.holder() == Some("a"))
        .await;
    (api, a, b)
}

async fn metrics(sidecar: &Sidecar) -> String {
    let probe = sidecar
        .admin_get("/metrics")
        .await
        .expect("/metrics answers");
    probe.body.as_str().unwrap_or_default().to_owned()
}

/// A rolling update under API Priority and Fairness: the leader's release
/// on SIGTERM is answered 429 once. It is sent again after the Retry-After
/// from a fresh read, so the peer leads a second or so later, not a lease
/// duration later.
#[tokio::test]
async fn a_release_throttled_on_shutdown_is_retried_and_the_peer_takes_over_at_once() {
    let timing = Timing::FAST;
    let (api, mut a, b) = leader_and_follower("outage-release-429", timing).await;
    let retry_after = Duration::from_secs(1);
    api.clear_requests();
    api.set_fault(
        "a",
        Fault::on(&[Verb::Update], FaultKind::TooManyRequests { retry_after }),
    );
    let stopped = Instant::now();
    a.signal(libc::SIGTERM);
    // Only the first release is throttled.
    loop {
        let throttled = api
            .requests_of("a", Verb::Update)
            .iter()
            .any(|r| r.status == Some(429));
        if throttled {
            api.clear_faults("a");
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "no release sent"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let status = a.wait_exit(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    b.wait_leading(timing.lease * 2).await;
    let took = stopped.elapsed();
    let updates: Vec<_> = api
        .requests_of("a", Verb::Update)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(updates, [Some(429), Some(200)], "released on the retry");
    assert!(
        !api.requests_of("a", Verb::Get).is_empty(),
        "the retry is built on a fresh read"
    );
    // Gate lag + Retry-After + at most a retry period to see and take it:
    // never the lease duration a peer waits for an expiry.
    assert!(
        took < GATE_LAG + retry_after + timing.retry,
        "b led {took:?} after SIGTERM"
    );
    let log = a.log();
    assert!(
        log.contains("throttled (429), retrying after 1.0s"),
        "{log}"
    );
    assert!(!log.contains("retrying with backoff"), "{log}");
}

/// A follower against a server answering 503 to everything it asks for
/// half a minute: it backs off towards a lease duration between requests
/// and reads nothing meanwhile. (Before: a relist every second and a read
/// every retry period, about two requests a second here.) The log names
/// the server error, without the RBAC hint for a denied watch.
#[tokio::test]
async fn a_follower_against_a_failing_api_server_backs_off() {
    let (api, a, b) = leader_and_follower("outage-503", SLOW).await;
    api.set_fault("b", Fault::all(FaultKind::Status(503)));
    // The open watch ends; its restarts meet the fault.
    api.drop_watches("b");
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let sent = api
        .requests_per_client(from, Instant::now())
        .get("b")
        .copied()
        .unwrap_or(0);
    println!("a follower answered 503 sent {sent} requests in 30 s");
    assert!(sent <= 20, "{sent} requests in 30 s");
    assert!(sent >= 2, "it keeps trying: {sent}");
    assert!(
        a.leader().await.is_some_and(|p| p.leading()),
        "a still leads"
    );

    // Back: the follower watches again and sees the leader.
    api.clear_faults("b");
    b.wait_for(SLOW.lease * 2, |p| p.holder() == Some("a"))
        .await;
    let log = b.log();
    assert!(log.contains("the API server is failing"), "{log}");
    assert!(log.contains("(503)"), "{log}");
    assert!(!log.contains("grant list and watch"), "{log}");
    assert!(
        log.contains("the API server answers again"),
        "said when it ended: {log}"
    );
}

/// A relist answered 429 with Retry-After is not sent again sooner.
#[tokio::test]
async fn a_relist_throttled_with_retry_after_waits_at_least_that_long() {
    let (api, _a, b) = leader_and_follower("outage-relist-429", SLOW).await;
    let retry_after = Duration::from_secs(2);
    api.set_fault(
        "b",
        Fault::on(&[Verb::List], FaultKind::TooManyRequests { retry_after }),
    );
    // 410 on the open watch (once it is open: seeing the holder may come
    // from the list before it): the watcher lists again, and is throttled.
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.open_watches(Some("b")) == 0 {
        assert!(Instant::now() < deadline, "b never watched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.expire_watches("b");
    let throttled = || -> Vec<Instant> {
        api.requests_of("b", Verb::List)
            .iter()
            .filter(|r| r.status == Some(429))
            .map(|r| r.at)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while throttled().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lists = throttled();
    assert!(
        lists.len() >= 2,
        "{} relists: {:?}",
        lists.len(),
        api.requests()
            .iter()
            .filter(|r| r.client == "b")
            .map(|r| (r.verb, r.status))
            .collect::<Vec<_>>()
    );
    for pair in lists.windows(2) {
        assert!(
            // As the server saw them: allow for its own scheduling.
            pair[1] - pair[0] >= retry_after - Duration::from_millis(50),
            "{:?}\n{}",
            pair[1] - pair[0],
            b.log()
        );
    }
}

/// The API server refuses connections: the log says so with its URL, the
/// metrics count the failures as `transport`, and the start-up line named
/// the version and the server. The leader steps down at its renew deadline.
#[tokio::test]
async fn a_refused_connection_is_named_with_the_server_and_counted_as_transport() {
    let timing = Timing::FAST;
    let (api, a, _b) = leader_and_follower("outage-refused", timing).await;
    let down = Instant::now();
    api.shutdown().await;
    a.wait_for(timing.renew_deadline + Duration::from_secs(2), |p| {
        !p.leading()
    })
    .await;
    assert!(
        down.elapsed() <= timing.renew_deadline + Duration::from_secs(1),
        "stepped down {:?} after the server went",
        down.elapsed()
    );
    let log = a.log();
    let url = api.url();
    let refused = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("connection refused"))
        .unwrap_or_else(|| panic!("the cause is named: {log}"));
    assert!(refused.contains(&url), "{refused}");
    let started = log
        .lines()
        .find(|l| l.contains("leader-gate starting"))
        .expect("start-up line");
    assert!(
        started.contains(&format!("version={}", env!("CARGO_PKG_VERSION"))),
        "{started}"
    );
    assert!(started.contains(&format!("api_server={url}")), "{started}");
    let text = metrics(&a).await;
    assert!(text.contains(r#"outcome="transport""#), "{text}");
}

/// A black-holed API server answers nothing: the leader's renews time out,
/// and it still steps down at its renew deadline, not later.
#[tokio::test]
async fn a_black_holed_api_server_leaves_the_leader_its_renew_deadline() {
    let timing = Timing::FAST;
    let (api, a, _b) = leader_and_follower("outage-black-hole", timing).await;
    let gone = Instant::now();
    api.black_hole().await;
    a.wait_for(timing.renew_deadline + Duration::from_secs(2), |p| {
        !p.leading()
    })
    .await;
    assert!(
        gone.elapsed() <= timing.renew_deadline + Duration::from_secs(1),
        "stepped down {:?} after the server went",
        gone.elapsed()
    );
    let text = metrics(&a).await;
    assert!(text.contains(r#"outcome="timeout""#), "{text}");
    api.restart().await;
    a.wait_for(timing.lease * 3, |p| p.holder().is_some()).await;
}
