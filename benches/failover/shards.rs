//! Several Leases spread over a large group (`shards1000`, by name only):
//! 1,000 pods, each contending for the same 4 Leases as one `serve
//! --lease-name shard-0,…,shard-3` does — one kube client per pod shared by
//! its 4 elections, one watch per Lease, and the spreading coordinator of
//! `src/serve/spreading.rs` between them — all in this process, as
//! `swarm.rs` runs its candidates (the HTTP servers left out). Defaults
//! 15s/10s/2s and the default successor claim window.
//!
//! - **rebalance at a join**: one pod starts alone and takes all four
//!   Leases; then the 999 others join. The first pod hands its three
//!   surplus Leases over gracefully (`rebalance`), each to a pod that held
//!   none. Measured: every successful write and 409 on the Leases from the
//!   first join until each Lease has a holder of its own and a successor
//!   named, plus 500 ms (the releases, acquisitions, successor claims and
//!   every conflict of the whole spreading), and how long it took.
//! - **steady**: non-watch requests/s over a window at rest, and whether the
//!   four holders are four pods, at its start and its end.
//! - **crash**: a holder is crashed (its tasks aborted: its client and
//!   watches close) right after one of its renews arrived; from that renew
//!   to the acquisition of its Lease by another pod, whether that pod held
//!   none, and the writes and 409s on that Lease until a successor is named
//!   again. A replacement pod joins after each round.
//!
//! And `shards-memory` (in the default set): the resident and anonymous
//! memory of one real `leader-gate serve` process with one Lease and with
//! four, each leading what it holds, alone against the fake API server.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leader_gate::elector::driver::{self, Heartbeat, Inputs, ShutdownOptions};
use leader_gate::elector::machine::{DEFAULT_CLAIM_WINDOW, Settings};
use leader_gate::elector::machine::{Election, Spread};
use leader_gate::serve::metrics::Metrics;
use leader_gate::serve::published::Publisher;
use leader_gate::serve::spreading;
use leader_gate::serve::transitions::{EventLog, LeaseLabel};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::program::{DEFAULTS, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, Verb, lease_holder};
use crate::support::sidecar::{Sidecar, Timing, test_dir};
use crate::swarm::{client_of, ms};
use crate::table::Table;

const LEASES: [&str; 4] = ["shard-0", "shard-1", "shard-2", "shard-3"];
const SUCCESSOR: &str = "leader-gate.dev/successor";
/// Pods started at once while the group forms.
const BATCH: usize = 250;

/// A pod: its elections (one per Lease) and their coordinator.
struct Pod {
    name: String,
    tasks: Vec<JoinHandle<()>>,
}

struct Group {
    api: FakeApiServer,
    timing: Timing,
    pods: Vec<Pod>,
    next: usize,
}

impl Group {
    async fn new(timing: Timing) -> Group {
        let api = FakeApiServer::start_with_threads(NAMESPACE, LEASES[0], 2).await;
        api.set_bookmark_interval(Duration::from_secs(60));
        api.grant_leases(&LEASES[1..]);
        Group {
            api,
            timing,
            pods: Vec::new(),
            next: 0,
        }
    }

    /// Starts `n` pods and waits for their watches.
    async fn join(&mut self, n: usize) {
        for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
            let before = self.api.open_watches(None);
            for _ in chunk {
                self.spawn().await;
            }
            let deadline = Instant::now() + Duration::from_secs(120);
            while self.api.open_watches(None) < before + chunk.len() * LEASES.len() {
                assert!(Instant::now() < deadline, "watches not open in 2 min");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    async fn spawn(&mut self) {
        let name = format!("p{}", self.next);
        self.next += 1;
        let client = client_of(&self.api, &name, LEASES[0]).await;
        let (senders, spreads): (Vec<_>, Vec<_>) = LEASES
            .iter()
            .map(|_| watch::channel(Spread::default()))
            .unzip();
        let mut tasks = Vec::new();
        let mut states = Vec::new();
        for (shard, (lease, spread)) in LEASES.iter().zip(spreads).enumerate() {
            let settings = Settings {
                identity: name.clone(),
                namespace: NAMESPACE.into(),
                lease_name: (*lease).into(),
                lease_duration: self.timing.lease,
                renew_deadline: self.timing.renew_deadline,
                retry_period: self.timing.retry,
                holder_labels: Vec::new(),
            };
            let place = LeaseLabel {
                name: (*lease).into(),
                namespace: NAMESPACE.into(),
                shard,
                shards: LEASES.len(),
            };
            let events = EventLog::new(&name, place, 8, 8);
            let metrics = Arc::new(Metrics::new(NAMESPACE, lease));
            let (publisher, state) = Publisher::new(events, metrics);
            states.push(state);
            tasks.push(tokio::spawn(driver::run(
                Arc::new(client.for_lease(lease)),
                Election::new(settings, fastrand::u64(..)),
                publisher,
                Heartbeat::new(),
                CancellationToken::new(),
                ShutdownOptions {
                    release: true,
                    gate_lag: Duration::ZERO,
                    timeout: Duration::from_secs(10),
                },
                Inputs {
                    collector_health: None,
                    spread: Some(spread),
                    step_aside: None,
                },
            )));
        }
        tasks.push(spreading::spawn(name.clone(), states, senders));
        self.pods.push(Pod { name, tasks });
    }

    fn crash(&mut self, name: &str) {
        let i = self
            .pods
            .iter()
            .position(|p| p.name == name)
            .expect("a pod");
        for task in self.pods.remove(i).tasks {
            task.abort();
        }
    }

    fn abort_all(&mut self) {
        for pod in self.pods.drain(..) {
            for task in pod.tasks {
                task.abort();
            }
        }
    }

    /// Each Lease's holder and named successor, as the fake stores them.
    fn leases(&self) -> Vec<(Option<String>, Option<String>)> {
        LEASES
            .iter()
            .map(|name| match self.api.lease(name) {
                None => (None, None),
                Some(lease) => (
                    lease_holder(&lease),
                    lease["metadata"]["annotations"][SUCCESSOR]
                        .as_str()
                        .map(str::to_string),
                ),
            })
            .collect()
    }

    fn holders(&self) -> Vec<Option<String>> {
        self.leases().into_iter().map(|(h, _)| h).collect()
    }

    /// Every Lease held by a pod of its own, with a successor named (not
    /// its holder), for 500 ms; when that began.
    async fn spread(&self, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let leases = self.leases();
            let holders: BTreeSet<_> = leases.iter().filter_map(|(h, _)| h.clone()).collect();
            if holders.len() == LEASES.len() && leases.iter().all(|(h, s)| s.is_some() && s != h) {
                let at = Instant::now();
                tokio::time::sleep(Duration::from_millis(500)).await;
                if self.leases() == leases {
                    return at;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not spread within {timeout:?}: {leases:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Successful writes and 409s on `lease` (all four if `None`) arriving
    /// in `(from, to]`, leaving out renews (a holder's write keeping itself
    /// holder): the steady load of any election, not a hand-over's cost.
    /// Releases, acquisitions and successor claims are counted.
    fn writes(&self, lease: Option<&str>, from: Instant, to: Instant) -> (usize, usize) {
        let mut log = self.api.requests();
        log.sort_by_key(|r| r.at);
        let mut holder: HashMap<String, Option<String>> = HashMap::new();
        let (mut writes, mut conflicts) = (0, 0);
        for r in &log {
            let Some(name) = r.name.as_deref() else {
                continue;
            };
            if !matches!(r.verb, Verb::Update | Verb::Create | Verb::Patch) {
                continue;
            }
            let counted = r.at > from && r.at <= to && lease.is_none_or(|l| l == name);
            match r.status {
                Some(200) | Some(201) => {
                    let before = holder.insert(name.to_owned(), r.holder.clone());
                    let renew = r.holder.as_deref() == Some(r.client.as_str())
                        && before.flatten().as_deref() == Some(r.client.as_str());
                    writes += usize::from(counted && !renew);
                }
                Some(409) => conflicts += usize::from(counted),
                _ => {}
            }
        }
        (writes, conflicts)
    }

    /// The next successful write on `lease` by someone other than `not`,
    /// arriving after `after`.
    async fn acquisition(&self, lease: &str, not: &str, after: Instant) -> (String, Instant) {
        let deadline = Instant::now() + self.timing.lease * 3;
        loop {
            if let Some(r) = self.api.requests().into_iter().find(|r| {
                r.at > after
                    && r.name.as_deref() == Some(lease)
                    && r.client != not
                    && matches!(r.verb, Verb::Update | Verb::Create)
                    && matches!(r.status, Some(200) | Some(201))
                    && self
                        .api
                        .lease(lease)
                        .and_then(|l| lease_holder(&l))
                        .as_deref()
                        != Some(not)
            }) {
                return (r.client, r.at);
            }
            assert!(Instant::now() < deadline, "{lease} not taken over");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The next successful renew of `lease` by `holder` after now.
    async fn next_renew(&self, lease: &str, holder: &str) -> Instant {
        let after = Instant::now();
        loop {
            if let Some(r) = self.api.requests().into_iter().find(|r| {
                r.at > after
                    && r.client == holder
                    && r.name.as_deref() == Some(lease)
                    && r.verb == Verb::Update
                    && r.status == Some(200)
            }) {
                return r.at;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[derive(Default)]
pub struct Row {
    pub pods: usize,
    /// The spreading after the join: writes, 409s, seconds until spread.
    pub join_writes: usize,
    pub join_conflicts: usize,
    pub join_s: f64,
    /// Steady window: non-watch requests/s; distinct holders at its start and end.
    pub steady_per_s: f64,
    pub steady_s: f64,
    pub distinct_at_rest: (usize, usize),
    /// Per crash round: ms from the last renew to the acquisition; whether
    /// the new holder held none; writes and 409s on that Lease.
    pub crash_ms: Vec<f64>,
    pub crash_to_idle: usize,
    pub crash_writes: Vec<usize>,
    pub crash_conflicts: Vec<usize>,
}

pub async fn run(pods: usize, rounds: usize, steady: Duration, note: &dyn Fn(&str)) -> Row {
    let t = DEFAULTS;
    let mut group = Group::new(t).await;
    group.join(1).await;
    // Alone, the first pod takes every Lease (one more tier of two retry
    // periods per Lease already held).
    let deadline = Instant::now() + t.lease * 8;
    while group.holders().iter().any(|h| h.as_deref() != Some("p0")) {
        assert!(Instant::now() < deadline, "p0 never held all four");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    note(&format!(
        "shards{pods}: p0 holds all four; {} join",
        pods - 1
    ));
    let joined = Instant::now();
    group.join(pods - 1).await;
    let spread_at = group.spread(DEFAULT_CLAIM_WINDOW * 3).await;
    let (writes, conflicts) = group.writes(None, joined, spread_at + Duration::from_millis(500));
    let mut row = Row {
        pods,
        join_writes: writes,
        join_conflicts: conflicts,
        join_s: (spread_at - joined).as_secs_f64(),
        ..Row::default()
    };
    note(&format!(
        "shards{pods}: spread in {:.1} s, {writes} writes, {conflicts} 409s",
        row.join_s
    ));

    let before = group.holders();
    let from = Instant::now();
    tokio::time::sleep(steady).await;
    let to = Instant::now();
    let after = group.holders();
    let distinct = |h: &[Option<String>]| h.iter().flatten().collect::<BTreeSet<_>>().len();
    row.distinct_at_rest = (distinct(&before), distinct(&after));
    let requests = group
        .api
        .requests()
        .iter()
        .filter(|r| r.at > from && r.at <= to && r.verb != Verb::Watch)
        .count();
    row.steady_s = (to - from).as_secs_f64();
    row.steady_per_s = requests as f64 / row.steady_s;
    assert_eq!(before, after, "the spread moved at rest");

    note(&format!("shards{pods}: crash"));
    for round in 0..rounds {
        let _ = group.spread(DEFAULT_CLAIM_WINDOW * 3).await;
        group.api.clear_requests();
        let holders = group.holders();
        let lease = LEASES[round % LEASES.len()];
        let victim = holders[round % LEASES.len()].clone().expect("held");
        let renew = group.next_renew(lease, &victim).await;
        group.crash(&victim);
        let (taker, acquired) = group.acquisition(lease, &victim, renew).await;
        if !holders.iter().flatten().any(|h| *h == taker) {
            row.crash_to_idle += 1;
        }
        row.crash_ms.push(ms(acquired - renew));
        let settled = group.spread(DEFAULT_CLAIM_WINDOW * 3).await;
        let (w, c) = group.writes(Some(lease), renew, settled + Duration::from_millis(500));
        row.crash_writes.push(w);
        row.crash_conflicts.push(c);
        group.join(1).await;
    }
    group.abort_all();
    row
}

/// Resident and anonymous memory (KiB) of one `serve` process with one
/// Lease, then with four, once it leads every Lease it contends for.
pub async fn memory(rounds: usize) -> Vec<(usize, u64, u64)> {
    let mut out = Vec::new();
    for leases in [1usize, 4] {
        for round in 0..rounds {
            let api = FakeApiServer::start(NAMESPACE, LEASES[0]).await;
            api.grant_leases(&LEASES[1..]);
            let dir = test_dir(&format!("bench-shards-memory-{leases}-{round}"));
            let names = LEASES[1..leases].join(",");
            let mut extra = vec!["--successor-claim-window", "2s"];
            if leases > 1 {
                extra.extend(["--lease-name", &names]);
            }
            let pod = Sidecar::spawn_with(&api, &dir, "a", Timing::FAST, &extra);
            pod.wait_serving().await;
            let deadline = Instant::now() + Duration::from_secs(60);
            while (0..leases).any(|i| {
                api.lease(LEASES[i])
                    .and_then(|l| lease_holder(&l))
                    .as_deref()
                    != Some("a")
            }) {
                assert!(Instant::now() < deadline, "a never led all {leases}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A few renewals of each, so the buffers are those of a working sidecar.
            tokio::time::sleep(Duration::from_secs(5)).await;
            out.push((leases, pod.rss_kib(), pod.anon_kib()));
        }
    }
    out
}

/// The crash row, into the main table.
pub fn rows(row: &Row, table: &mut Table) {
    if !row.crash_ms.is_empty() {
        table.signed(
            &format!(
                "shards: {} pods × 4 Leases, holder crashed → its Lease acquired, from its last renew (lease 15 s)",
                row.pods
            ),
            "≤ 15,100",
            &row.crash_ms,
            |p| p <= 15_100.0,
        );
    }
}

/// The tables of their own: the group's figures, and the memory.
pub fn print(row: &Row, memory: &[(usize, u64, u64)]) {
    if row.pods > 0 {
        println!();
        println!(
            "| {} pods × 4 Leases (defaults 15s/10s/2s, in one process) | figure | goal |",
            row.pods
        );
        println!("|---|---|---|");
        println!(
            "| steady: non-watch requests/s over {:.0} s | {:.2} | ≤ 2.40 (4 × 0.60) |",
            row.steady_s, row.steady_per_s
        );
        println!(
            "| at rest: pods holding the 4 Leases (start / end of the window) | {} / {} | 4 / 4 |",
            row.distinct_at_rest.0, row.distinct_at_rest.1
        );
        println!(
            "| join: one pod holds all 4, {} join → spread out: writes (renews apart) / 409s | {} / {} in {:.1} s | O(1): 3 rebalances, 4 successor claims |",
            row.pods - 1,
            row.join_writes,
            row.join_conflicts,
            row.join_s
        );
        let n = row.crash_ms.len();
        if n > 0 {
            let median = |v: &[usize]| {
                let mut v = v.to_vec();
                v.sort_unstable();
                v[v.len() / 2]
            };
            let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
            println!(
                "| crash: taken over by a pod that held none | {} of {n} | {n} of {n} |",
                row.crash_to_idle
            );
            println!(
                "| crash: writes (renews apart) / 409s on its Lease until a successor is named again, median (max) | {} ({}) / {} ({}) | 409s ≤ 5 |",
                median(&row.crash_writes),
                max(&row.crash_writes),
                median(&row.crash_conflicts),
                max(&row.crash_conflicts)
            );
        }
    }
    if !memory.is_empty() {
        let median = |leases: usize, pick: fn(&(usize, u64, u64)) -> u64| {
            let mut v: Vec<u64> = memory.iter().filter(|m| m.0 == leases).map(pick).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (rss1, rss4) = (median(1, |m| m.1), median(4, |m| m.1));
        let (anon1, anon4) = (median(1, |m| m.2), median(4, |m| m.2));
        println!();
        println!(
            "| one sidecar, leading what it contends for (median of {} each) | 1 Lease | 4 Leases | 4 ÷ 1 | goal |",
            memory.len() / 2
        );
        println!("|---|---|---|---|---|");
        println!(
            "| resident (KiB) | {rss1} | {rss4} | {:.2} | ≤ 1.5 |",
            rss4 as f64 / rss1 as f64
        );
        println!(
            "| anonymous (KiB) | {anon1} | {anon4} | {:.2} | |",
            anon4 as f64 / anon1 as f64
        );
    }
}
