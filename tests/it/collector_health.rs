//! Collector-health coupling, end to end: real `leader-gate` processes
//! against the fake Lease API server, each checking its own collector's
//! health endpoint, which the test plays and flips between 200 and 500.
//!
//! Judged by causality: the health endpoint logs when it answered what, the
//! fake API server when it received which write, the event stream when a
//! transition was published, and the overlap monitor samples `/leader`.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant, UNIX_EPOCH};

use support::events::{EventClient, Received};
use support::fake_apiserver::{FakeApiServer, RequestRecord, Verb, lease_holder};
use support::health::HealthEndpoint;
use support::monitor::Monitor;
use support::sidecar::{Probe, Sidecar, Timing, get, test_dir};

const LEASE: &str = "cluster-metrics";
/// `--collector-health-failures` in these tests.
const FAILURES: usize = 2;

/// Candidates, each with its own collector health endpoint.
struct Pods {
    api: FakeApiServer,
    sidecars: Vec<Sidecar>,
    health: HashMap<String, HealthEndpoint>,
    monitor: Monitor,
}

impl Pods {
    /// Starts `names`, each checking an endpoint that answers `status`.
    async fn start(
        test: &str,
        names: &[&str],
        timing: Timing,
        status: u16,
        extra: &[&str],
    ) -> Pods {
        let api = FakeApiServer::start("collectors", LEASE).await;
        let dir = test_dir(test);
        let mut health = HashMap::new();
        let mut sidecars = Vec::new();
        let failures = FAILURES.to_string();
        for name in names {
            let endpoint = HealthEndpoint::start(status).await;
            let mut args = vec![
                "--collector-health-url",
                endpoint.url.as_str(),
                "--collector-health-failures",
                failures.as_str(),
            ];
            args.extend_from_slice(extra);
            sidecars.push(Sidecar::spawn_with(&api, &dir, name, timing, &args));
            health.insert(name.to_string(), endpoint);
        }
        for sidecar in &sidecars {
            sidecar.wait_serving().await;
        }
        let monitor = Monitor::start(&sidecars.iter().collect::<Vec<_>>());
        Pods {
            api,
            sidecars,
            health,
            monitor,
        }
    }

    fn sidecar(&self, name: &str) -> &Sidecar {
        self.sidecars.iter().find(|s| s.name == name).unwrap()
    }

    fn health(&self, name: &str) -> &HealthEndpoint {
        &self.health[name]
    }

    async fn wait_leader(&self, timeout: Duration) -> (String, Probe) {
        let deadline = Instant::now() + timeout;
        loop {
            for sidecar in &self.sidecars {
                if let Some(probe) = sidecar.leader().await
                    && probe.leading()
                {
                    return (sidecar.name.clone(), probe);
                }
            }
            assert!(
                Instant::now() < deadline,
                "nobody led within {timeout:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Successful writes (create, update) of `client`, or of anyone (`None`).
    fn writes(&self, client: Option<&str>) -> Vec<RequestRecord> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| client.is_none_or(|c| r.client == c))
            .filter(|r| {
                matches!(r.verb, Verb::Update | Verb::Create) && matches!(r.status, Some(200 | 201))
            })
            .collect()
    }

    fn logs(&self) -> String {
        self.sidecars
            .iter()
            .map(|s| {
                let log = s.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                format!("--- {} ---\n{tail}", s.name)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Subscribes to `sidecar`'s event stream; returns it and its `state`.
async fn subscribe(sidecar: &Sidecar) -> (EventClient, Received) {
    let mut stream = EventClient::connect(sidecar.gate, None).await;
    let state = stream
        .next(Duration::from_secs(1))
        .await
        .expect("a state first");
    assert_eq!(state.kind(), "state");
    (stream, state)
}

fn wall_us(record: &RequestRecord) -> i64 {
    record.wall.duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

async fn metrics(sidecar: &Sidecar) -> String {
    let probe = get(sidecar.admin, "/metrics")
        .await
        .expect("/metrics answers");
    probe.body.as_str().expect("text").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_leader_steps_down_releases_and_the_healthy_peer_takes_over_at_once() {
    // A long lease: a takeover long before it expires can only be the
    // marked release. A gate lag, which the release must wait for.
    let timing = Timing {
        lease: Duration::from_secs(20),
        renew_deadline: Duration::from_secs(15),
        retry: Duration::from_secs(1),
    };
    let gate_lag = Duration::from_secs(1);
    let pods = Pods::start(
        "health-handover",
        &["a", "b"],
        timing,
        200,
        &["--gate-lag", "1s"],
    )
    .await;
    let (leader, probe) = pods.wait_leader(timing.lease).await;
    let peer = if leader == "a" { "b" } else { "a" };
    let term = probe.term().unwrap().to_owned();
    assert_eq!(probe.body["collector_healthy"], true);
    let (mut leader_stream, state) = subscribe(pods.sidecar(&leader)).await;
    assert_eq!(state.data["collector_healthy"], true);
    let (mut peer_stream, _) = subscribe(pods.sidecar(peer)).await;

    let failing = pods.health(&leader).set(500);
    let stopped = leader_stream
        .next_of("stopped-leading", timing.lease)
        .await
        .unwrap_or_else(|| panic!("the leader never stopped\n{}", pods.logs()));
    assert_eq!(stopped.data["reason"], "collector-unhealthy");
    assert_eq!(stopped.term(), Some(term.as_str()));
    // Causality: it stepped down after, and only after, enough failures.
    let failed = pods.health(&leader).count(500, failing, stopped.at);
    assert!(
        failed >= FAILURES,
        "stepped down after {failed} failed checks"
    );
    let started = peer_stream
        .next_of("started-leading", timing.lease)
        .await
        .unwrap_or_else(|| panic!("the peer never took over\n{}", pods.logs()));
    tokio::time::sleep(Duration::from_millis(300)).await; // let the monitor sample

    // The old leader's last write is its release: after the gate lag counted
    // from the published step-down, and before the peer's acquisition, which
    // the watch (no read in between) brought long before any expiry.
    let release = pods
        .writes(Some(&leader))
        .into_iter()
        .rfind(|w| w.at > failing && w.verb == Verb::Update)
        .expect("the old leader released");
    let published_us = stopped.data["published_at_us"].as_i64().unwrap();
    assert!(
        wall_us(&release) >= published_us + gate_lag.as_micros() as i64,
        "released {} µs after the step-down",
        wall_us(&release) - published_us
    );
    let acquire = pods
        .writes(Some(peer))
        .into_iter()
        .find(|w| w.at > failing)
        .expect("the peer acquired");
    assert!(acquire.at > release.at, "release, then acquisition");
    assert!(
        acquire.at < release.at + timing.lease / 2,
        "taken {:?} after the release: not by expiry",
        acquire.at - release.at
    );
    let reads: Vec<_> = pods
        .api
        .requests()
        .into_iter()
        .filter(|r| r.client == peer && r.at > release.at && r.at < acquire.at)
        .filter(|r| r.verb != Verb::Watch)
        .collect();
    assert!(reads.is_empty(), "the watch told the peer: {reads:?}");
    assert!(started.at > stopped.at);
    let lease = pods.api.lease(LEASE).unwrap();
    assert_eq!(lease_holder(&lease).as_deref(), Some(peer));

    // Visible everywhere: /leader, metrics.
    let old = pods.sidecar(&leader).leader().await.unwrap();
    assert_eq!(old.status, 503);
    assert_eq!(old.body["last_stop_reason"], "collector-unhealthy");
    assert_eq!(old.body["collector_healthy"], false);
    assert_eq!(old.body["holder"], peer);
    let new = pods.sidecar(peer).leader().await.unwrap();
    assert_eq!(new.body["collector_healthy"], true);
    let text = metrics(pods.sidecar(&leader)).await;
    assert!(
        text.contains("\nleader_gate_collector_healthy 0\n"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("leader_gate_transitions_total")
                && l.contains(r#"reason="collector-unhealthy""#)
                && l.ends_with(" 1")),
        "{text}"
    );
    assert!(
        metrics(pods.sidecar(peer))
            .await
            .contains("\nleader_gate_collector_healthy 1\n")
    );

    // While unhealthy the old leader makes no further write.
    tokio::time::sleep(timing.retry * 3).await;
    let later: Vec<_> = pods
        .writes(Some(&leader))
        .into_iter()
        .filter(|w| w.at > release.at)
        .collect();
    assert!(later.is_empty(), "wrote while unhealthy: {later:?}");
    pods.monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_collector_is_unhealthy_nobody_leads_until_one_recovers() {
    let timing = Timing::FAST;
    let names = ["a", "b", "c"];
    let pods = Pods::start("health-all-down", &names, timing, 200, &[]).await;
    let (leader, probe) = pods.wait_leader(timing.lease * 2).await;
    let old_term = probe.term().unwrap().to_owned();

    let failing = Instant::now();
    for name in names {
        pods.health(name).set(500);
    }
    // Each instance counts its own collector's failures on its own schedule:
    // one still healthy may take the released Lease meanwhile (and release
    // it in turn). "All unhealthy" begins when every one says so.
    for name in names {
        pods.sidecar(name)
            .wait_for(timing.lease * 2, |p| {
                p.body["collector_healthy"] == serde_json::json!(false) && !p.leading()
            })
            .await;
    }
    // Then the last release clears the holder; from then on, watch for
    // longer than a lease.
    let deadline = Instant::now() + timing.lease * 2;
    while lease_holder(&pods.api.lease(LEASE).unwrap()).is_some() {
        assert!(Instant::now() < deadline, "never released\n{}", pods.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quiet_from = Instant::now();
    let lease_before = pods.api.lease(LEASE).unwrap();
    tokio::time::sleep(timing.lease + timing.retry * 2).await;
    let quiet_to = Instant::now();

    let late_200: Vec<_> = pods
        .monitor
        .samples()
        .into_iter()
        .filter(|s| s.leading() && s.sent >= quiet_from)
        .collect();
    assert!(late_200.is_empty(), "someone led: {:?}", late_200.first());
    let writes: Vec<_> = pods
        .writes(None)
        .into_iter()
        .filter(|w| w.at >= quiet_from)
        .collect();
    assert!(writes.is_empty(), "the Lease was written: {writes:?}");
    let lease_after = pods.api.lease(LEASE).unwrap();
    assert_eq!(
        lease_before["metadata"]["resourceVersion"], lease_after["metadata"]["resourceVersion"],
        "not renewed"
    );
    assert_eq!(lease_holder(&lease_after), None, "released with the mark");
    for name in names {
        let probe = pods.sidecar(name).leader().await.unwrap();
        assert_eq!(probe.status, 503);
        assert_eq!(probe.body["collector_healthy"], false, "{name}");
        assert_eq!(probe.body["holder"], serde_json::Value::Null, "{name}");
        let failed = pods.health(name).count(500, failing, quiet_to);
        assert!(failed >= FAILURES, "{name} was checked ({failed})");
    }

    // One collector recovers: its instance contends again and leads, after
    // (never before) its endpoint first passed again.
    let recovering = names.iter().copied().find(|n| *n != leader).unwrap();
    let recovered = pods.health(recovering).set(200);
    let led = pods
        .sidecar(recovering)
        .wait_leading(timing.lease * 2)
        .await;
    assert_ne!(led.term(), Some(old_term.as_str()), "a new term");
    let first_pass = pods
        .health(recovering)
        .answers()
        .into_iter()
        .find(|(at, status)| *at >= recovered && *status == 200)
        .unwrap()
        .0;
    let acquire = pods
        .writes(Some(recovering))
        .into_iter()
        .find(|w| w.at >= quiet_from)
        .unwrap();
    assert!(
        acquire.at > first_pass,
        "acquired after the collector passed"
    );
    // The old leader's collector recovers too: it follows the new leader.
    pods.health(&leader).set(200);
    pods.sidecar(&leader)
        .wait_for(timing.lease, |p| {
            p.body["collector_healthy"] == true && p.holder() == Some(recovering)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pods.monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_passed_its_check_is_not_led_for() {
    let timing = Timing::FAST;
    // Status 0: the endpoint closes every connection without an answer.
    let pods = Pods::start("health-never-up", &["a"], timing, 0, &[]).await;
    let sidecar = pods.sidecar("a");
    tokio::time::sleep(timing.lease + timing.retry).await;
    let probe = sidecar.leader().await.unwrap();
    assert_eq!(probe.status, 503);
    assert_eq!(probe.body["collector_healthy"], false);
    assert!(pods.monitor.samples().iter().all(|s| !s.leading()));
    assert!(pods.writes(Some("a")).is_empty(), "no acquisition attempt");
    assert!(
        sidecar.admin_get("/readyz").await.unwrap().status == 200,
        "ready: the API server answered"
    );

    let up = pods.health("a").set(200);
    sidecar.wait_leading(timing.lease * 2).await;
    let first_pass = pods
        .health("a")
        .answers()
        .into_iter()
        .find(|(at, status)| *at >= up && *status == 200)
        .unwrap()
        .0;
    let create = pods.writes(Some("a")).into_iter().next().unwrap();
    assert_eq!(create.verb, Verb::Create);
    assert!(create.at > first_pass, "created after the first pass");
}
