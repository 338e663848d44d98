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
use support::fake_apiserver::{FakeApiServer, RequestRecord, Verb, free_local_addr, lease_holder};
use support::gate_clients::{ChildLog, GateClient};
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
        text.contains("\nleader_gate_collector_healthy{lease=\"collectors/cluster-metrics\"} 0\n"),
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
            .contains("\nleader_gate_collector_healthy{lease=\"collectors/cluster-metrics\"} 1\n")
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
async fn no_group_stays_leaderless_because_every_collector_is_broken() {
    let timing = Timing::FAST;
    let names = ["a", "b", "c"];
    let grace = Duration::from_secs(3);
    let pods = Pods::start(
        "health-all-down",
        &names,
        timing,
        200,
        &["--collector-health-grace", "3s"],
    )
    .await;
    pods.wait_leader(timing.lease * 2).await;
    // Each one's collector has run on a follower for a lease duration, so a
    // failure there counts as broken, not as "not started yet".
    tokio::time::sleep(timing.lease + timing.retry * 2).await;

    for name in names {
        pods.health(name).set(500);
    }
    let broken_from = Instant::now();
    // Every collector is broken: the group still gets a leader again and
    // again (for the grace each time), never a lease duration plus the
    // longest stand-back wait without one.
    let watch = timing.lease * 6;
    tokio::time::sleep(watch).await;
    let samples: Vec<_> = pods
        .monitor
        .samples()
        .into_iter()
        .filter(|s| s.sent >= broken_from)
        .collect();
    let mut leaderless_from = broken_from;
    let mut longest = Duration::ZERO;
    for sample in &samples {
        if sample.leading() {
            leaderless_from = sample.sent;
        }
        longest = longest.max(sample.sent - leaderless_from);
    }
    println!(
        "MEASURE every collector broken: longest leaderless {longest:?} over {watch:?} (lease 4 s, grace 3 s)"
    );
    let bound = timing.lease + timing.lease + grace;
    assert!(
        longest < bound,
        "leaderless for {longest:?} (bound {bound:?})\n{}",
        pods.logs()
    );
    let mut terms: Vec<&str> = samples
        .iter()
        .filter(|s| s.leading())
        .filter_map(|s| s.term.as_deref())
        .collect();
    terms.dedup();
    assert!(
        terms.len() >= 2,
        "broken collectors still get their turns ({terms:?})\n{}",
        pods.logs()
    );
    // Each leader released after the grace: its collector never passed.
    let released = pods
        .sidecars
        .iter()
        .filter(|s| s.log().contains("did not pass its health check within"))
        .count();
    assert!(released >= 1, "{}", pods.logs());

    // One collector recovers: at the next release it takes the Lease at once
    // (the broken ones stand back) and keeps it.
    let recovering = "b";
    let recovered = pods.health(recovering).set(200);
    let led = pods
        .sidecar(recovering)
        .wait_for(timing.lease * 4, |p| p.leading())
        .await;
    let term = led.term().unwrap().to_owned();
    let first_pass = pods
        .health(recovering)
        .answers()
        .into_iter()
        .find(|(at, status)| *at >= recovered && *status == 200)
        .unwrap()
        .0;
    assert!(first_pass >= recovered);
    tokio::time::sleep(grace * 2).await;
    let probe = pods.sidecar(recovering).leader().await.unwrap();
    assert!(probe.leading(), "keeps it: {}", pods.logs());
    assert_eq!(probe.term(), Some(term.as_str()), "the same term");
    pods.monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_collector_does_not_pass_within_the_grace_releases_for_a_working_peer() {
    let timing = Timing::FAST;
    let grace = Duration::from_secs(3);
    // Status 0: the endpoint closes every connection without an answer, as
    // before the collector started.
    let pods = Pods::start(
        "health-grace",
        &["a", "b"],
        timing,
        0,
        &["--collector-health-grace", "3s"],
    )
    .await;
    // Nobody's collector has passed, yet one contends and leads.
    let (leader, probe) = pods.wait_leader(timing.lease * 2).await;
    let peer = if leader == "a" { "b" } else { "a" };
    let term = probe.term().unwrap().to_owned();
    let led_at = Instant::now();
    pods.health(peer).set(200);

    let (mut stream, _) = subscribe(pods.sidecar(&leader)).await;
    let stopped = stream
        .next_of("stopped-leading", grace * 3)
        .await
        .unwrap_or_else(|| panic!("the leader kept the lease\n{}", pods.logs()));
    assert_eq!(stopped.data["reason"], "collector-unhealthy");
    assert_eq!(stopped.term(), Some(term.as_str()));
    assert!(
        stopped.at >= led_at + grace - timing.retry,
        "kept for the grace: stopped {:?} after leading",
        stopped.at - led_at
    );
    let new = pods.sidecar(peer).wait_leading(timing.lease).await;
    assert_ne!(new.term(), Some(term.as_str()));
    assert!(
        pods.sidecar(&leader)
            .log()
            .contains("did not pass its health check within --collector-health-grace")
    );
    // The old leader's collector is known broken now: it stands back while
    // the peer leads, and makes no write.
    let quiet_from = Instant::now();
    tokio::time::sleep(timing.lease * 2).await;
    let writes: Vec<_> = pods
        .writes(Some(&leader))
        .into_iter()
        .filter(|w| w.at >= quiet_from)
        .collect();
    assert!(writes.is_empty(), "wrote while standing back: {writes:?}");
    assert!(pods.sidecar(peer).leader().await.unwrap().leading());
    pods.monitor.assert_no_overlap();
}

/// The first of `sidecars` seen leading, with its answer.
async fn wait_any_leader<'a>(sidecars: &[&'a Sidecar], within: Duration) -> (&'a Sidecar, Probe) {
    let deadline = Instant::now() + within;
    loop {
        for sidecar in sidecars {
            if let Some(probe) = sidecar.leader().await
                && probe.leading()
            {
                return (sidecar, probe);
            }
        }
        let logs: Vec<String> = sidecars.iter().map(|s| s.log()).collect();
        assert!(Instant::now() < deadline, "nobody led\n{}", logs.join("\n"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A collector stand-in for `leader-gate exec`: answers 200 to every
/// request on 127.0.0.1:`$PORT` and appends `start`/`stop` lines like
/// [`gate_clients::COLLECTOR`] to `$LOG`.
const HTTP_COLLECTOR: &str = r#"
import http.server, os, signal, sys, time
def note(what):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{what} {os.environ['NAME']} {os.environ.get('LEADER_GATE_TERM')} {time.time():.6f} {os.getpid()}\n")
def stop(*_):
    note("stop")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *_):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Ok)
note("start")
server.serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_exec_one_instance_leads_and_its_collector_runs_and_passes() {
    let timing = Timing::FAST;
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("health-exec");
    let log = ChildLog(dir.join("children.log"));
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        // Each pod's collector on a port of its own, as in its own network
        // namespace; it answers only while `exec` runs it, on the leader.
        let port = free_local_addr().port().to_string();
        let health = format!("http://127.0.0.1:{port}/");
        let sidecar = Sidecar::spawn_with(
            &api,
            &dir,
            name,
            timing,
            &[
                "--collector-health-url",
                &health,
                "--collector-health-grace",
                "3s",
            ],
        );
        sidecar.wait_serving().await;
        let url = format!("http://{}", sidecar.gate);
        let exec = GateClient::spawn(
            &dir,
            &format!("exec-{name}"),
            &[
                "exec",
                "--url",
                &url,
                "--grace",
                "1s",
                "--",
                "python3",
                "-c",
                HTTP_COLLECTOR,
            ],
            &[
                ("NAME", name),
                ("PORT", &port),
                ("LOG", log.0.to_str().unwrap()),
            ],
        );
        pods.push((sidecar, exec));
    }
    let sidecars: Vec<&Sidecar> = pods.iter().map(|(s, _)| s).collect();
    let (leader, probe) = wait_any_leader(&sidecars, timing.lease * 3).await;
    let term = probe.term().unwrap().to_owned();
    let started = log
        .wait_for(timing.lease, |e| e.what == "start" && e.name == leader.name)
        .await;
    assert_eq!(started.term, term, "the child runs in the leader's term");
    // Its check passes once the child serves, within the grace.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !leader
        .log()
        .contains("the collector passes its health check")
    {
        assert!(Instant::now() < deadline, "{}", leader.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Long past the grace, the same term: the check passes, so the leader
    // keeps the Lease, and the follower's collector never ran.
    tokio::time::sleep(Duration::from_secs(3) * 3).await;
    let probe = leader.leader().await.unwrap();
    assert!(probe.leading(), "{}", leader.log());
    assert_eq!(probe.term(), Some(term.as_str()));
    let follower = sidecars.iter().find(|s| s.name != leader.name).unwrap();
    let follower_probe = follower.leader().await.unwrap();
    assert_eq!(follower_probe.holder(), Some(leader.name.as_str()));
    let runs = log.intervals();
    assert_eq!(runs.len(), 1, "one child, the leader's: {runs:?}");
    log.assert_never_two_at_once();
}
