//! Leader routing (`--route-service`), make before break, on real processes:
//! how long the slice names nobody during a graceful hand-over (SIGTERM; 0:
//! the old leader stays listed, marked terminating, until the new leader's
//! write replaces it), how long after a new leader's acquisition the
//! EndpointSlice names it, and how long the old leader's terminating entry
//! was the one listed (the stretch in which kube-proxy falls back to it).
//! Judged on every version the fake API server stored, not on samples.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, Resource, Verb};
use crate::support::sidecar::{Sidecar, test_dir};

const SERVICE: &str = "bench";
const SLICE: &str = "bench-leader";

/// One graceful hand-over's figures.
pub struct Round {
    /// New leader's acquisition arrived → the slice version naming it stored.
    pub named_after_acquisition: Duration,
    /// The slice named nobody for this long in all (SIGTERM → new leader named).
    pub empty: Duration,
    /// The old leader's entry marked terminating → the new leader named.
    pub marked: Duration,
    /// SIGTERM sent → the slice names the new leader.
    pub switched: Duration,
}

/// The pods a version lists, each with whether it is marked terminating.
fn entries(slice: &Value) -> Vec<(String, bool)> {
    let endpoints = slice["endpoints"].as_array().cloned().unwrap_or_default();
    listed(slice)
        .into_iter()
        .zip(
            endpoints
                .iter()
                .map(|e| e["conditions"]["terminating"].as_bool() == Some(true)),
        )
        .collect()
}

fn listed(slice: &Value) -> Vec<String> {
    slice["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| e["targetRef"]["name"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

async fn api() -> FakeApiServer {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.ship_route_slice(SERVICE);
    api
}

fn spawn(api: &FakeApiServer, dir: &std::path::Path, n: usize) -> Sidecar {
    let ip = format!("10.244.{}.{}", n / 200, n % 200 + 10);
    Sidecar::spawn_with(
        api,
        dir,
        &format!("p{n}"),
        DEFAULTS,
        &[
            "--route-service",
            SERVICE,
            "--pod-ip",
            &ip,
            "--gate-lag",
            "0s",
        ],
    )
}

/// `rounds` graceful hand-overs in a group of three (defaults, gate lag 0 s,
/// as the routing example ships).
pub async fn run(rounds: usize) -> Vec<Round> {
    let api = api().await;
    let dir = test_dir("bench-routing");
    let mut next = 0;
    let mut sidecars: Vec<Sidecar> = (0..3)
        .map(|_| {
            next += 1;
            spawn(&api, &dir, next - 1)
        })
        .collect();
    for s in &sidecars {
        s.wait_serving().await;
    }
    let mut out = Vec::new();
    for _ in 0..rounds {
        let leader = loop {
            let mut found = None;
            for (i, s) in sidecars.iter().enumerate() {
                if s.leader().await.is_some_and(|p| p.leading()) {
                    found = Some(i);
                }
            }
            if let Some(i) = found {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let old = sidecars[leader].name.clone();
        wait_listed(&api, &old).await;
        let stopped_at = Instant::now();
        let mut stopping = sidecars.remove(leader);
        stopping.signal(libc::SIGTERM);
        // The next leader, listed.
        let new = loop {
            let now = api
                .endpoint_slice(SLICE)
                .map(|s| listed(&s))
                .unwrap_or_default();
            if let [one] = now.as_slice()
                && *one != old
            {
                break one.clone();
            }
            assert!(
                stopped_at.elapsed() < DEFAULTS.lease * 2,
                "no new leader listed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        stopping.wait_exit(Duration::from_secs(20)).await;
        let requests = api.requests();
        let lease_write = |who: &str, holder: Option<&str>| {
            requests
                .iter()
                .filter(|r| r.at > stopped_at && r.client == who && r.verb == Verb::Update)
                .filter(|r| r.resource == Some(Resource::Leases) && r.status == Some(200))
                .find(|r| r.holder.as_deref() == holder)
                .map(|r| r.at)
                .expect("the lease write")
        };
        let acquired = lease_write(&new, Some(&new));
        let history: Vec<(Instant, Vec<(String, bool)>)> = api
            .endpoint_slice_history()
            .into_iter()
            .filter(|(at, _)| *at > stopped_at)
            .map(|(at, v)| (at, entries(&v)))
            .collect();
        let named_index = history
            .iter()
            .position(|(_, e)| e.iter().any(|(pod, _)| *pod == new))
            .expect("the version naming the new leader");
        let named = history[named_index].0;
        // Each version before the one naming the new leader lasted until the
        // next; an empty one counts for that long. (Before SIGTERM the slice
        // listed the old leader.)
        let mut empty = Duration::ZERO;
        for pair in history[..=named_index].windows(2) {
            if pair[0].1.is_empty() {
                empty += pair[1].0 - pair[0].0;
            }
        }
        let marked = history[..named_index]
            .iter()
            .find(|(_, e)| {
                e.iter()
                    .any(|(pod, terminating)| *pod == old && *terminating)
            })
            .map(|(at, _)| named.saturating_duration_since(*at))
            .unwrap_or_default();
        out.push(Round {
            named_after_acquisition: named.saturating_duration_since(acquired),
            empty,
            marked,
            switched: named.saturating_duration_since(stopped_at),
        });
        next += 1;
        let fresh = spawn(&api, &dir, next - 1);
        fresh.wait_serving().await;
        sidecars.push(fresh);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out
}

async fn wait_listed(api: &FakeApiServer, pod: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.endpoint_slice(SLICE).map(|s| listed(&s)) != Some(vec![pod.to_string()]) {
        assert!(Instant::now() < deadline, "{pod} never listed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
