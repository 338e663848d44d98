//! The event stream and metrics of real `leader-gate` processes against the
//! fake Lease API server: paired transitions with the right reasons,
//! resumption across a disconnect, Prometheus metrics, and a second overlap
//! witness driven by every instance's event stream.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::events::{EventClient, Received, seq_of};
use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, Verb};
use support::proxy::Proxy;
use support::sidecar::{Sidecar, Timing, get, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);

/// Candidates subscribed to before the API server answers them, so each
/// stream sees every transition from the very first.
struct Watched {
    api: FakeApiServer,
    sidecars: Vec<Sidecar>,
    streams: HashMap<String, EventClient>,
    seen: HashMap<String, Vec<Received>>,
}

impl Watched {
    async fn start(test: &str, names: &[&str], timing: Timing) -> Watched {
        let api = FakeApiServer::start("collectors", LEASE).await;
        // Hold every request until all streams are subscribed (a partition
        // that heals), so no transition happens before.
        for name in names {
            api.set_fault(name, Fault::all(FaultKind::Partition));
        }
        let dir = test_dir(test);
        let sidecars: Vec<Sidecar> = names
            .iter()
            .map(|n| Sidecar::spawn(&api, &dir, n, timing))
            .collect();
        let mut streams = HashMap::new();
        for sidecar in &sidecars {
            sidecar.wait_serving().await;
            let mut client = EventClient::connect(sidecar.gate, None).await;
            let state = client.next(SECOND).await.expect("a state event first");
            assert_eq!(state.kind(), "state");
            streams.insert(sidecar.name.clone(), client);
        }
        for name in names {
            api.clear_faults(name);
        }
        Watched {
            api,
            sidecars,
            streams,
            seen: HashMap::new(),
        }
    }

    fn sidecar(&self, name: &str) -> &Sidecar {
        self.sidecars.iter().find(|s| s.name == name).unwrap()
    }

    /// Waits on `name`'s stream for an event of `kind` matching `pred`.
    async fn expect(
        &mut self,
        name: &str,
        kind: &str,
        timeout: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> Received {
        let deadline = Instant::now() + timeout;
        let stream = self.streams.get_mut(name).unwrap();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let received = stream.next(left).await.unwrap_or_else(|| {
                panic!(
                    "{name}: no {kind} within {timeout:?}; seen {:?}",
                    self.seen
                        .get(name)
                        .map(|v| v.iter().map(|r| r.kind().to_owned()).collect::<Vec<_>>())
                )
            });
            self.seen
                .entry(name.into())
                .or_default()
                .push(received.clone());
            if received.kind() == kind && pred(&received) {
                return received;
            }
        }
    }

    /// The first instance whose stream says it started leading.
    async fn leader(&mut self, timeout: Duration) -> (String, Received) {
        let deadline = Instant::now() + timeout;
        loop {
            let names: Vec<String> = self.streams.keys().cloned().collect();
            for name in names {
                let stream = self.streams.get_mut(&name).unwrap();
                while let Some(received) = stream.next(Duration::from_millis(20)).await {
                    self.seen
                        .entry(name.clone())
                        .or_default()
                        .push(received.clone());
                    if received.kind() == "started-leading" {
                        return (name, received);
                    }
                }
            }
            assert!(Instant::now() < deadline, "nobody started leading");
        }
    }

    /// Reads whatever every stream has now, then checks that no two
    /// instances' terms overlapped, by the publication times of their
    /// started/stopped events (one clock: this machine's).
    async fn assert_no_overlap_by_events(&mut self) {
        let names: Vec<String> = self.streams.keys().cloned().collect();
        for name in &names {
            let more = self
                .streams
                .get_mut(name)
                .unwrap()
                .drain(Duration::from_millis(200))
                .await;
            self.seen.entry(name.clone()).or_default().extend(more);
        }
        let mut terms: Vec<(String, String, i64, i64)> = Vec::new();
        for (name, events) in &self.seen {
            let mut open: Option<(String, i64)> = None;
            for e in events {
                let at = e.data["published_at_us"].as_i64().unwrap_or(0);
                match e.kind() {
                    "started-leading" => open = Some((e.term().unwrap().to_owned(), at)),
                    "stopped-leading" => {
                        let (term, from) = open.take().expect("a stop pairs with a start");
                        assert_eq!(
                            e.term(),
                            Some(term.as_str()),
                            "{name}: stop pairs with its start"
                        );
                        terms.push((name.clone(), term, from, at));
                    }
                    _ => {}
                }
            }
            if let Some((term, from)) = open {
                terms.push((name.clone(), term, from, i64::MAX));
            }
        }
        for a in &terms {
            for b in &terms {
                if a.0 != b.0 {
                    assert!(a.3 <= b.2 || b.3 <= a.2, "terms overlap: {a:?} and {b:?}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_start_and_stop_of_one_term_then_the_next_leader() {
    let timing = Timing::FAST;
    let mut w = Watched::start("events-failover", &["a", "b"], timing).await;
    let (leader, started) = w.leader(timing.lease * 2).await;
    let term = started.term().unwrap().to_owned();
    let other = if leader == "a" { "b" } else { "a" };

    w.api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    let stopped = w
        .expect(&leader, "stopped-leading", SECOND * 2, |_| true)
        .await;
    assert_eq!(stopped.term(), Some(term.as_str()), "paired by term id");
    assert_eq!(stopped.data["reason"], "lost-to-other-holder");
    assert!(stopped.at > started.at);
    // Keep the old leader from winning again, so the other one does.
    w.api
        .set_fault(&leader, Fault::on(&[Verb::Update], FaultKind::Status(403)));
    w.expect(&leader, "new-leader", timing.lease * 3, |e| {
        e.data["holder"] == other
    })
    .await;
    w.assert_no_overlap_by_events().await;
}

/// One scenario per reason: the stopped-leading event says why.
async fn stop_reason(
    test: &str,
    trigger: impl AsyncFnOnce(&FakeApiServer, &Sidecar),
    reason: &str,
) {
    let timing = Timing::FAST;
    let mut w = Watched::start(test, &["a", "b"], timing).await;
    let (leader, started) = w.leader(timing.lease * 2).await;
    trigger(&w.api, w.sidecar(&leader)).await;
    let stopped = w
        .expect(&leader, "stopped-leading", SECOND * 3, |_| true)
        .await;
    assert_eq!(stopped.term(), started.term());
    assert_eq!(stopped.data["reason"], reason);
    w.assert_no_overlap_by_events().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_renew_stops_with_reason_forbidden() {
    stop_reason(
        "events-403",
        async |api, leader| {
            api.set_fault(
                &leader.name,
                Fault::on(&[Verb::Update], FaultKind::Status(403)),
            )
        },
        "forbidden",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_stops_with_reason_lease_deleted() {
    stop_reason(
        "events-deleted",
        async |api, _| {
            api.delete_lease(LEASE);
        },
        "lease-deleted",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_a_final_stop_with_reason_shutdown_then_ends_the_stream() {
    let timing = Timing::FAST;
    let mut w = Watched::start("events-sigterm", &["a", "b"], timing).await;
    let (leader, started) = w.leader(timing.lease * 2).await;
    w.sidecar(&leader).signal(libc::SIGTERM);
    let stopped = w
        .expect(&leader, "stopped-leading", SECOND * 3, |_| true)
        .await;
    assert_eq!(stopped.term(), started.term());
    assert_eq!(stopped.data["reason"], "shutdown");
    let stream = w.streams.get_mut(&leader).unwrap();
    let rest = stream.until_end(SECOND * 6).await;
    assert!(
        stream.ended,
        "the stream ends with the process; still open after {rest:?}"
    );
    w.streams.remove(&leader);
    w.assert_no_overlap_by_events().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_subscriber_ends_up_with_exactly_the_events_of_a_connected_one() {
    let timing = Timing::FAST;
    let mut w = Watched::start("events-resume", &["a", "b"], timing).await;
    let (leader, _) = w.leader(timing.lease * 2).await;
    let follower = if leader == "a" { "b" } else { "a" };
    let gate = w.sidecar(follower).gate;
    // A second subscriber on the follower, which disconnects for a while.
    let mut flaky = EventClient::connect(gate, None).await;
    let state = flaky.next(SECOND).await.unwrap();
    let last_id = state.message.id.clone().unwrap();
    drop(flaky);
    // Events happen meanwhile: the leader loses to a ghost, then someone takes over.
    w.api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    w.expect(&leader, "stopped-leading", SECOND * 2, |_| true)
        .await;
    tokio::time::sleep(timing.lease + SECOND * 2).await;

    let mut resumed = EventClient::connect(gate, Some(&last_id)).await;
    let replayed = resumed.drain(Duration::from_millis(300)).await;
    let more = w
        .streams
        .get_mut(follower)
        .unwrap()
        .drain(Duration::from_millis(300))
        .await;
    w.seen.entry(follower.into()).or_default().extend(more);
    // The reference has been connected all along: what it saw after the
    // flaky subscriber's last id is what the resumed one must replay.
    let expected: Vec<String> = w.seen[follower]
        .iter()
        .filter_map(|e| e.message.id.clone())
        .filter(|id| seq_of(id) > seq_of(&last_id))
        .collect();
    // Only transitions have ids; a `renewed` (no id, not in the history)
    // follows the replay when the resumed instance leads.
    assert!(
        replayed
            .iter()
            .all(|e| e.message.id.is_some() || e.kind() == "renewed"),
        "only renewals come without an id: {replayed:?}"
    );
    let got: Vec<String> = replayed
        .iter()
        .filter_map(|e| e.message.id.clone())
        .collect();
    assert!(!got.is_empty(), "events were missed and replayed");
    assert!(
        replayed.iter().all(|e| e.kind() != "state"),
        "no state first when resuming"
    );
    assert_eq!(got, expected, "exactly the missed events, in order");
}

async fn scrape(admin: std::net::SocketAddr) -> HashMap<String, f64> {
    let probe = get(admin, "/metrics").await.expect("/metrics answers");
    assert_eq!(probe.status, 200);
    parse_metrics(probe.body.as_str().expect("text"))
}

/// Parses the Prometheus text format into `name{labels}` → value.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("malformed line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("malformed value in {line:?}"));
        assert!(
            series
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_'),
            "malformed series {series:?}"
        );
        if let Some((_, labels)) = series.split_once('{') {
            assert!(labels.ends_with('}'), "malformed labels in {line:?}");
        }
        out.insert(series.to_owned(), value);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_follow_the_leadership() {
    let timing = Timing::FAST;
    let mut w = Watched::start("events-metrics", &["a", "b"], timing).await;
    let (leader, _) = w.leader(timing.lease * 2).await;
    let follower = if leader == "a" { "b" } else { "a" };
    w.sidecar(follower)
        .wait_for(SECOND * 2, |p| p.holder() == Some(leader.as_str()))
        .await;
    let (leader_admin, follower_admin) = (w.sidecar(&leader).admin, w.sidecar(follower).admin);
    tokio::time::sleep(timing.retry * 2).await; // a renew or two
    let lease = r#"lease="collectors/cluster-metrics""#;
    let m = scrape(leader_admin).await;
    assert_eq!(m[&format!("leader_gate_leading{{{lease}}}")], 1.0);
    assert_eq!(m[&format!("leader_gate_leader_observed{{{lease}}}")], 1.0);
    assert_eq!(
        m[&format!(
            r#"leader_gate_transitions_total{{{lease},direction="started",reason="acquired"}}"#
        )],
        1.0
    );
    assert!(
        m[&format!(r#"leader_gate_api_requests_total{{{lease},verb="update",outcome="ok"}}"#)]
            >= 1.0
    );
    assert!(m[&format!("leader_gate_renew_duration_seconds_count{{{lease}}}")] >= 1.0);
    assert!(
        m[&format!("leader_gate_last_renew_age_seconds{{{lease}}}")]
            < timing.renew_deadline.as_secs_f64()
    );
    assert_eq!(m["leader_gate_event_subscribers"], 1.0);
    let f = scrape(follower_admin).await;
    assert_eq!(f[&format!("leader_gate_leading{{{lease}}}")], 0.0);
    assert_eq!(f[&format!("leader_gate_leader_observed{{{lease}}}")], 1.0);

    w.api
        .set_fault(&leader, Fault::on(&[Verb::Update], FaultKind::Status(403)));
    w.expect(&leader, "stopped-leading", SECOND * 3, |_| true)
        .await;
    let m = scrape(leader_admin).await;
    assert_eq!(m[&format!("leader_gate_leading{{{lease}}}")], 0.0);
    assert_eq!(
        m[&format!(
            r#"leader_gate_transitions_total{{{lease},direction="stopped",reason="forbidden"}}"#
        )],
        1.0
    );
    assert!(
        m[&format!(
            r#"leader_gate_api_requests_total{{{lease},verb="update",outcome="forbidden"}}"#
        )] >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_gate_watch_prints_every_event_once_across_a_disconnect() {
    let timing = Timing::FAST;
    let mut w = Watched::start("events-watch", &["a", "b"], timing).await;
    let (leader, _) = w.leader(timing.lease * 2).await;
    let follower = if leader == "a" { "b" } else { "a" };
    let proxy = Proxy::start(w.sidecar(follower).gate).await;
    let out = test_dir("events-watch-out").join("watch.jsonl");
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "watch",
            "--json",
            "--url",
            &format!("http://{}/events", proxy.addr),
        ])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect()
    };
    let deadline = Instant::now() + SECOND * 5;
    while lines().is_empty() {
        assert!(Instant::now() < deadline, "watch printed nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Cut the connection; meanwhile the leader loses and someone takes over.
    proxy.cut();
    w.api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    w.expect(&leader, "stopped-leading", SECOND * 2, |_| true)
        .await;
    tokio::time::sleep(timing.lease + SECOND * 2).await;
    proxy.up();
    tokio::time::sleep(SECOND * 7).await; // its reconnect backoff

    let printed = lines();
    let _ = watch.kill();
    let _ = watch.wait();
    let more = w
        .streams
        .get_mut(follower)
        .unwrap()
        .drain(Duration::from_millis(200))
        .await;
    w.seen.entry(follower.into()).or_default().extend(more);
    let reference: Vec<String> = w.seen[follower]
        .iter()
        .filter_map(|e| e.message.id.clone())
        .collect();
    let stderr = std::fs::read_to_string(out.with_extension("err")).unwrap();
    assert!(
        stderr.contains("reconnecting"),
        "the stream was cut: {stderr}"
    );
    let states = printed.iter().filter(|l| l["event"] == "state").count();
    assert_eq!(
        states, 1,
        "resumed with Last-Event-ID, no second state: {printed:#?}"
    );
    // Everything the reference saw after the state the watch began with.
    let first = printed[0]["id"].as_str().unwrap();
    let expected: Vec<String> = reference
        .iter()
        .filter(|id| seq_of(id) > seq_of(first))
        .cloned()
        .collect();
    // Renewals (when this one took over) have no id and are no history;
    // nor are the watch's own local stops (validity ran out meanwhile).
    let (local, events): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = printed[1..]
        .iter()
        .partition(|l| l["event"] == "renewed" || l["local"] == true);
    assert!(local.iter().all(|l| l["id"].is_null()), "{local:?}");
    assert!(
        local.iter().filter(|l| l["local"] == true).all(|l| {
            l["event"] == "stopped-leading"
                && ["stream-lost", "validity-expired"]
                    .contains(&l["data"]["reason"].as_str().unwrap_or(""))
        }),
        "{local:?}"
    );
    let ids: Vec<String> = events
        .iter()
        .map(|l| l["id"].as_str().expect("an event with an id").to_owned())
        .collect();
    assert!(!ids.is_empty(), "events after the reconnect were printed");
    assert_eq!(ids, expected, "every event once, in order");
}

/// Two thousand `/events` subscribers of a real leader: each costs the
/// sidecar a bounded few KiB (its task, the stream's state and hyper's read
/// and write buffers for the connection), every one of them gets the stop,
/// and the memory they used is handed back to the system once they are gone.
/// The bound is 16 KiB: 11.8 KiB measured with hyper's server in a debug
/// build. (Our own server, which kept no buffer per connection, cost 3.3 KiB
/// and was judged by issue 14 not worth an admin port that 128 clients
/// could lock: a pod holds 1–3 streams.) One more 8 KiB buffer per stream
/// would break the bound.
/// Measured as anonymous memory (`RssAnon`): the resident pages of a debug
/// binary come and go with the machine's load, and are no subscriber's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_subscribers_cost_a_few_kib_each_and_their_memory_comes_back() {
    const N: usize = 2000;
    support::raise_fd_limit(16_384);
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("many-subscribers");
    let timing = Timing::FAST;
    let cap = (N + 100).to_string();
    let leader = Sidecar::spawn_with(&api, &dir, "a", timing, &["--max-subscribers", &cap]);
    leader.wait_serving().await;
    leader.wait_leading(timing.lease * 3).await;
    // A first wave, so that what is measured is not the heap's first growth.
    let mut warm = Vec::new();
    for _ in 0..100 {
        warm.push(EventClient::connect(leader.gate, None).await);
    }
    drop(warm);
    tokio::time::sleep(SECOND).await;
    let rss_before = leader.anon_kib();

    let mut subscribers = Vec::new();
    for _ in 0..N {
        let mut client = EventClient::connect(leader.gate, None).await;
        assert_eq!(client.status, 200);
        client.next(SECOND * 5).await.expect("a state event");
        subscribers.push(client);
    }
    tokio::time::sleep(SECOND / 2).await;
    let rss_connected = leader.anon_kib();
    let per_subscriber = rss_connected.saturating_sub(rss_before) as f64 / N as f64;

    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    for client in &mut subscribers {
        let stop = client.next_of("stopped-leading", SECOND * 10).await;
        assert!(stop.is_some(), "a subscriber missed the stop");
    }
    drop(subscribers);
    // Handed back within a trim period (10 s) and a little.
    let deadline = Instant::now() + SECOND * 15;
    let rss_after = loop {
        tokio::time::sleep(SECOND / 2).await;
        let rss = leader.anon_kib();
        if rss <= rss_before + 1024 || Instant::now() > deadline {
            break rss;
        }
    };
    println!(
        "MEASURE {N} subscribers: RssAnon {rss_before} -> {rss_connected} KiB ({per_subscriber:.2} KiB each), {rss_after} KiB once they left"
    );
    assert!(
        per_subscriber <= 16.0,
        "{per_subscriber:.2} KiB per subscriber ({rss_before} -> {rss_connected} KiB)"
    );
    assert!(
        rss_after <= rss_before + 1024,
        "the subscribers' memory was kept: {rss_before} -> {rss_connected} -> {rss_after} KiB"
    );
}
