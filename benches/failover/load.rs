//! API server load: steady requests, watch traffic, and the burst of
//! writes at a hand-over and at an expiry, as the fake counts them.

use std::time::{Duration, Instant};

use crate::group::Group;
use crate::program::DEFAULTS;
use crate::program::Program;
use crate::support::fake_apiserver::{RequestRecord, Verb};
use crate::support::sidecar::Sidecar;

pub struct Load {
    pub candidates: usize,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub events_per_s: f64,
    pub bookmarks_per_s: f64,
    pub bytes_per_s: f64,
    pub handover: Burst,
    pub expiry: Burst,
    pub rss_mean_kib: u64,
    /// The most candidates answering `/leader` 200 in one sweep over all of
    /// them, polled for 3 s once a new holder took the expired Lease (1 when
    /// the election is sound).
    pub leaders_after_expiry: usize,
}

/// Writes (POST/PUT/PATCH) by candidates in the second after the first one,
/// and how many of them got 409.
#[derive(Default)]
pub struct Burst {
    pub writes: usize,
    pub conflicts: usize,
    /// From the first write of the burst to the arrival of its last.
    pub span: Duration,
    pub took: Duration,
}

pub fn burst(requests: &[RequestRecord], exclude: &str, from: Instant) -> Burst {
    let writes: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| {
            r.client != exclude
                && r.at >= from
                && matches!(r.verb, Verb::Update | Verb::Create | Verb::Patch)
        })
        .collect();
    let Some(first) = writes.first() else {
        return Burst::default();
    };
    let window: Vec<&&RequestRecord> = writes
        .iter()
        .filter(|r| r.at < first.at + Duration::from_secs(1))
        .collect();
    Burst {
        writes: window.len(),
        conflicts: window.iter().filter(|r| r.status == Some(409)).count(),
        span: window.last().map_or(Duration::ZERO, |r| r.at - first.at),
        took: Duration::ZERO,
    }
}

pub async fn wait_holder_other_than(group: &Group, old: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(h) = group.holder()
            && h != old
            && group.index_of(&h).is_some()
        {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "no new holder within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn load(program: &Program, candidates: usize, steady: Duration) -> Load {
    let name = format!("load{candidates}");
    // The raw hand-over: leader-gate's default --gate-lag (80% of the
    // margin, 4 s) would be most of it; the peer has no such wait.
    let extra: &[&str] = match program {
        Program::LeaderGate => &["--gate-lag", "0s"],
        Program::Peer(_) => &[],
    };
    let mut group = Group::start_program(program, &name, DEFAULTS, candidates, extra).await;
    let first = wait_holder_other_than(&group, "", DEFAULTS.lease * 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_mean_kib = group.sidecars.iter().map(Sidecar::rss_kib).sum::<u64>() / candidates as u64;

    // Steady state.
    group.api.clear_requests();
    let before = group.api.traffic();
    let from = Instant::now();
    tokio::time::sleep(steady).await;
    let after = group.api.traffic();
    let seconds = from.elapsed().as_secs_f64();
    let requests = group
        .api
        .requests()
        .iter()
        .filter(|r| r.verb != Verb::Watch)
        .count();

    // Hand-over: SIGTERM of the leader, then the writes after its release.
    group.api.clear_requests();
    let leader = group.index_of(&first).expect("leader is ours");
    let signalled = Instant::now();
    group.sidecars[leader].signal(libc::SIGTERM);
    let second = wait_holder_other_than(&group, &first, DEFAULTS.lease * 2).await;
    let handover_took = signalled.elapsed();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = group.api.requests();
    let release = log
        .iter()
        .filter(|r| r.client == first && matches!(r.verb, Verb::Update | Verb::Patch))
        .map(|r| r.at)
        .next_back()
        .unwrap_or(signalled);
    let mut handover = burst(&log, &first, release + Duration::from_micros(1));
    handover.took = handover_took;
    let mut gone = group.sidecars.remove(leader);
    gone.wait_exit(Duration::from_secs(15)).await;
    drop(gone);

    // Expiry: SIGKILL of the new leader; the rest wait one lease duration.
    group.api.clear_requests();
    let leader = group.index_of(&second).expect("leader is ours");
    let killed = Instant::now();
    group.sidecars[leader].signal(libc::SIGKILL);
    let _third = wait_holder_other_than(&group, &second, DEFAULTS.lease * 3).await;
    let expiry_took = killed.elapsed();
    let leaders_after_expiry = most_leaders(&group, Duration::from_secs(3)).await;
    let mut expiry = burst(&group.api.requests(), &second, killed);
    expiry.took = expiry_took;

    Load {
        candidates,
        seconds,
        requests_per_s: requests as f64 / seconds,
        events_per_s: (after.watch_events - before.watch_events) as f64 / seconds,
        bookmarks_per_s: (after.bookmarks - before.bookmarks) as f64 / seconds,
        bytes_per_s: (after.bytes_written - before.bytes_written) as f64 / seconds,
        handover,
        expiry,
        rss_mean_kib,
        leaders_after_expiry,
    }
}

/// The most instances of `group` answering 200 in one sweep, over `window`.
async fn most_leaders(group: &Group, window: Duration) -> usize {
    let until = Instant::now() + window;
    let mut most = 0;
    while Instant::now() < until {
        let mut leading = 0;
        for s in &group.sidecars {
            if s.leader().await.is_some_and(|p| p.leading()) {
                leading += 1;
            }
        }
        most = most.max(leading);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    most
}
