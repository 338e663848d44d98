//! Failover, detection and footprint, measured on real processes against the
//! fake API server. Prints a markdown table; `docs/BENCHMARKS.md` records it.
//!
//!     cargo bench --bench failover            # 5 rounds per row (about 3 minutes)
//!     ROUNDS=9 cargo bench --bench failover
//!
//! Every row is the median (and min–max) over the rounds; each round starts
//! fresh processes.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Verb};
use support::sidecar::{Sidecar, Timing, test_dir};

const NAMESPACE: &str = "bench";
const LEASE: &str = "bench";

const DEFAULTS: Timing = Timing {
    lease: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry: Duration::from_secs(2),
};

struct Group {
    api: FakeApiServer,
    sidecars: Vec<Sidecar>,
}

impl Group {
    async fn start(name: &str, timing: Timing, size: usize) -> Group {
        Self::start_with(name, timing, size, &[]).await
    }

    async fn start_with(name: &str, timing: Timing, size: usize, extra: &[&str]) -> Group {
        let api = FakeApiServer::start(NAMESPACE, LEASE).await;
        let dir = test_dir(&format!("bench-{name}"));
        let sidecars: Vec<Sidecar> = (0..size)
            .map(|i| Sidecar::spawn_with(&api, &dir, &format!("p{i}"), timing, extra))
            .collect();
        for s in &sidecars {
            s.wait_serving().await;
        }
        Group { api, sidecars }
    }

    /// Index of the instance answering 200, polled every millisecond.
    async fn leader_other_than(&self, old: Option<usize>, timeout: Duration) -> (usize, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, s) in self.sidecars.iter().enumerate() {
                if Some(i) != old && s.leader().await.is_some_and(|p| p.leading()) {
                    return (i, Instant::now());
                }
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn wait_renew(&self, leader: usize) {
        let name = &self.sidecars[leader].name;
        let count = || {
            self.api
                .requests()
                .iter()
                .filter(|r| &r.client == name && r.verb == Verb::Update && r.status == Some(200))
                .count()
        };
        let before = count();
        while count() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn graceful_handover() -> Duration {
    let mut group = Group::start("handover", DEFAULTS, 3).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    group.wait_renew(leader).await;
    let signalled = Instant::now();
    group.sidecars[leader].signal(libc::SIGTERM);
    let (_, took) = group
        .leader_other_than(Some(leader), DEFAULTS.lease * 2)
        .await;
    group.sidecars[leader]
        .wait_exit(Duration::from_secs(10))
        .await;
    took - signalled
}

async fn crash_failover(timing: Timing) -> Duration {
    let mut group = Group::start("crash", timing, 3).await;
    let (leader, _) = group.leader_other_than(None, timing.lease * 2).await;
    group.wait_renew(leader).await;
    let killed = Instant::now();
    group.sidecars[leader].signal(libc::SIGKILL);
    group.sidecars[leader]
        .wait_exit(Duration::from_secs(5))
        .await;
    let (_, took) = group
        .leader_other_than(Some(leader), timing.lease * 3)
        .await;
    took - killed
}

async fn edit_to_503() -> Duration {
    let group = Group::start("edit", DEFAULTS, 2).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    group.wait_renew(leader).await;
    let edited = Instant::now();
    group
        .api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    loop {
        if group.sidecars[leader]
            .leader()
            .await
            .is_some_and(|p| !p.leading())
        {
            return edited.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// From publication of a stopped-leading to its arrival at the last of
/// 1,000 subscribers of the leader's /events.
async fn fanout_latency() -> Duration {
    let group = Group::start_with("fanout", DEFAULTS, 2, &["--max-subscribers", "1100"]).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    let gate = group.sidecars[leader].gate;
    let mut clients = Vec::new();
    for _ in 0..1000 {
        let mut client = EventClient::connect(gate, None).await;
        assert_eq!(client.status, 200);
        client.next(Duration::from_secs(5)).await.expect("state");
        clients.push(client);
    }
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move { c.next_of("stopped-leading", Duration::from_secs(10)).await })
        })
        .collect();
    group
        .api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    let mut published = 0;
    let mut last = 0;
    for reader in readers {
        let event = reader
            .await
            .unwrap()
            .expect("every subscriber gets the stop");
        published = event.data["published_at_us"].as_i64().unwrap();
        last = last.max(event.wall_us);
    }
    Duration::from_micros((last - published) as u64)
}

/// RSS (KiB) of the leader and a follower after `settle`, and the requests
/// per minute each made besides its watch.
async fn footprint(settle: Duration) -> (u64, u64, f64, f64) {
    let group = Group::start("footprint", DEFAULTS, 2).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    let follower = 1 - leader;
    group.api.clear_requests();
    let from = Instant::now();
    tokio::time::sleep(settle).await;
    let minutes = from.elapsed().as_secs_f64() / 60.0;
    let per_minute = |i: usize| {
        let name = &group.sidecars[i].name;
        let n = group
            .api
            .requests()
            .iter()
            .filter(|r| &r.client == name && r.verb != Verb::Watch)
            .count();
        n as f64 / minutes
    };
    (
        group.sidecars[leader].rss_kib(),
        group.sidecars[follower].rss_kib(),
        per_minute(leader),
        per_minute(follower),
    )
}

fn row(name: &str, mut values: Vec<Duration>) -> String {
    values.sort();
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    format!(
        "| {name} | {} | {}–{} |",
        ms(values[values.len() / 2]),
        ms(values[0]),
        ms(values[values.len() - 1])
    )
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    support::raise_fd_limit(8192);
    runtime.block_on(async {
        let fast = Timing::FAST;
        let mut handover = Vec::new();
        let mut crash = Vec::new();
        let mut edit = Vec::new();
        let mut fanout = Vec::new();
        for _ in 0..rounds {
            handover.push(graceful_handover().await);
            crash.push(crash_failover(fast).await);
            edit.push(edit_to_503().await);
            fanout.push(fanout_latency().await);
        }
        let (rss_leader, rss_follower, req_leader, req_follower) =
            footprint(Duration::from_secs(30)).await;
        println!("rounds: {rounds}; 3 candidates per group unless noted\n");
        println!("| measurement | median ms | min–max ms |");
        println!("|---|---|---|");
        println!(
            "{}",
            row(
                "SIGTERM of the leader → another answers 200 (defaults 15s/10s/2s)",
                handover
            )
        );
        println!(
            "{}",
            row(
                "SIGKILL of the leader → another answers 200 (lease 4s, retry 1s)",
                crash
            )
        );
        println!(
            "{}",
            row(
                "external holder edit → old leader answers 503 (defaults)",
                edit
            )
        );
        println!(
            "{}",
            row(
                "stopped-leading published → received by the last of 1,000 /events subscribers",
                fanout
            )
        );
        println!();
        println!("| footprint after 30 s (defaults, 2 candidates) | leader | follower |");
        println!("|---|---|---|");
        println!("| resident memory (KiB) | {rss_leader} | {rss_follower} |");
        println!(
            "| API requests per minute besides the watch | {req_leader:.1} | {req_follower:.1} |"
        );
    });
}
