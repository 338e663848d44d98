//! Failover, step-down, API server load, `/leader` throughput and footprint,
//! measured on real `leader-gate` processes against the fake API server.
//! Prints one markdown table; `docs/BENCHMARKS.md` records it.
//!
//!     cargo bench --bench failover                       # 30 rounds per row
//!     cargo bench --bench failover -- --quick            # 5 rounds, shorter load windows
//!     cargo bench --bench failover -- --only graceful,acquire
//!     ROUNDS=50 ONLY=crash QUICK=1 cargo bench --bench failover   # the same, by env
//!
//! Scenarios (names for `--only`, matched as substrings): `acquire`,
//! `graceful`, `crash`, `edit`, `forbidden`, `hang`, `startup`, `load10`,
//! `load100`, `wrk`, `fanout`. `LEADER_GATE_BIN=/path` runs another build of
//! the binary (e.g. the previous commit's) under the same bench.
//!
//! Every latency row gives min / median / p99 / max over its rounds. The p99
//! is by nearest rank, so below 100 rounds it is the maximum: read it as
//! "the worst of N".

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, RequestRecord, Verb, lease_holder};
use support::sidecar::{Sidecar, Timing, test_dir};

const NAMESPACE: &str = "bench";
const LEASE: &str = "bench";
const RELEASED_TERM: &str = "leader-gate.dev/released-term";

const DEFAULTS: Timing = Timing {
    lease: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry: Duration::from_secs(2),
};
const FAST: Timing = Timing::FAST;

// ---------------------------------------------------------------- options

struct Opts {
    rounds: usize,
    quick: bool,
    only: Vec<String>,
}

impl Opts {
    fn parse() -> Opts {
        let mut quick = std::env::var("QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut only: Vec<String> = std::env::var("ONLY").map(|v| split(&v)).unwrap_or_default();
        let mut rounds: Option<usize> = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok());
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--only" => only.extend(args.next().map(|v| split(&v)).unwrap_or_default()),
                "--rounds" => rounds = args.next().and_then(|r| r.parse().ok()),
                _ => {} // `--bench` from cargo, and anything else
            }
        }
        Opts {
            rounds: rounds.unwrap_or(if quick { 5 } else { 30 }),
            quick,
            only,
        }
    }

    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }
}

fn split(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------- a group of candidates

struct Group {
    api: FakeApiServer,
    dir: std::path::PathBuf,
    timing: Timing,
    sidecars: Vec<Sidecar>,
    next: usize,
}

impl Group {
    async fn start(name: &str, timing: Timing, size: usize) -> Group {
        Self::start_with(name, timing, size, &[]).await
    }

    async fn start_with(name: &str, timing: Timing, size: usize, extra: &[&str]) -> Group {
        let api = FakeApiServer::start(NAMESPACE, LEASE).await;
        let dir = test_dir(&format!("bench-{name}"));
        let mut group = Group {
            api,
            dir,
            timing,
            sidecars: Vec::new(),
            next: 0,
        };
        for _ in 0..size {
            group.spawn(extra);
        }
        for s in &group.sidecars {
            s.wait_serving().await;
        }
        group
    }

    fn spawn(&mut self, extra: &[&str]) -> usize {
        let name = format!("p{}", self.next);
        self.next += 1;
        self.sidecars.push(Sidecar::spawn_with(
            &self.api,
            &self.dir,
            &name,
            self.timing,
            extra,
        ));
        self.sidecars.len() - 1
    }

    /// Replaces the (exited) instance `i` with a fresh candidate.
    async fn replace(&mut self, i: usize) {
        let mut old = self.sidecars.remove(i);
        old.wait_exit(Duration::from_secs(15)).await;
        drop(old);
        let j = self.spawn(&[]);
        self.sidecars[j].wait_serving().await;
        // Let it list and watch before the next round.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Index of an instance answering 200 (not `old`), polled every millisecond.
    async fn leader_other_than(&self, old: Option<&str>, timeout: Duration) -> (usize, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, s) in self.sidecars.iter().enumerate() {
                if Some(s.name.as_str()) != old && s.leader().await.is_some_and(|p| p.leading()) {
                    return (i, Instant::now());
                }
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for the next successful renew of `leader`; returns its record.
    async fn wait_renew(&self, leader: usize) -> RequestRecord {
        let name = self.sidecars[leader].name.clone();
        let before = self.successful_updates(&name).len();
        loop {
            let updates = self.successful_updates(&name);
            if updates.len() > before {
                return updates.last().cloned().expect("one");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn successful_updates(&self, name: &str) -> Vec<RequestRecord> {
        self.api
            .requests_of(name, Verb::Update)
            .into_iter()
            .filter(|r| r.status == Some(200))
            .collect()
    }

    /// Polls `i`'s `/leader` every millisecond until it answers 503.
    async fn wait_503(&self, i: usize, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            if self.sidecars[i]
                .leader()
                .await
                .is_some_and(|p| !p.leading())
            {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "no step-down within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Like an operator: clears the holder with the release mark of the
    /// current term, so every candidate may take the Lease at once.
    fn operator_release(&self) {
        self.api.update_lease(LEASE, |l| {
            let uid = l["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let transitions = l["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
            if let Some(spec) = l["spec"].as_object_mut() {
                spec.remove("holderIdentity");
            }
            if !l["metadata"]["annotations"].is_object() {
                l["metadata"]["annotations"] = json!({});
            }
            l["metadata"]["annotations"][RELEASED_TERM] = json!(format!("{uid}/{transitions}"));
        });
    }

    fn holder(&self) -> Option<String> {
        self.api.lease(LEASE).as_ref().and_then(lease_holder)
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == name)
    }
}

// ---------------------------------------------------------------- latency scenarios

/// Fresh API server without a Lease, three fresh candidates: from the first
/// spawn to the first `/leader` 200.
async fn first_acquisition() -> Duration {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("bench-acquire");
    let started = Instant::now();
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|i| Sidecar::spawn(&api, &dir, &format!("p{i}"), DEFAULTS))
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
async fn startup() -> Duration {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("bench-startup");
    let started = Instant::now();
    let s = Sidecar::spawn(&api, &dir, "p0", DEFAULTS);
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
async fn graceful(rounds: usize) -> Vec<Duration> {
    let mut group = Group::start("graceful", DEFAULTS, 3).await;
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
async fn crash(rounds: usize) -> Vec<Duration> {
    let mut group = Group::start("crash", FAST, 3).await;
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
async fn edit(rounds: usize) -> Vec<Duration> {
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
async fn forbidden(rounds: usize) -> (Vec<Duration>, Vec<f64>) {
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
async fn hang(rounds: usize) -> Vec<f64> {
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

fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1000.0
    } else {
        -((b - a).as_secs_f64() * 1000.0)
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

// ---------------------------------------------------------------- API server load

struct Load {
    candidates: usize,
    seconds: f64,
    requests_per_s: f64,
    events_per_s: f64,
    bookmarks_per_s: f64,
    bytes_per_s: f64,
    handover: Burst,
    expiry: Burst,
    rss_mean_kib: u64,
}

/// Writes (POST/PUT) by candidates in the second after the first one, and how
/// many of them got 409.
#[derive(Default)]
struct Burst {
    writes: usize,
    conflicts: usize,
    took: Duration,
}

fn burst(requests: &[RequestRecord], exclude: &str, from: Instant) -> Burst {
    let writes: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| {
            r.client != exclude && r.at >= from && matches!(r.verb, Verb::Update | Verb::Create)
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
        took: Duration::ZERO,
    }
}

async fn wait_holder_other_than(group: &Group, old: &str, timeout: Duration) -> String {
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

async fn load(candidates: usize, steady: Duration) -> Load {
    let mut group = Group::start(&format!("load{candidates}"), DEFAULTS, candidates).await;
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
        .filter(|r| r.client == first && r.verb == Verb::Update)
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
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    }
}

// ---------------------------------------------------------------- /leader under wrk

struct WrkRun {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_before: u64,
    rss_after: u64,
    rss_after_5s: u64,
    follower_rss: u64,
    max_renew_gap: Duration,
    renews: usize,
    still_leading: bool,
}

async fn wrk_leader(seconds: u64) -> Option<WrkRun> {
    let group = Group::start("wrk", DEFAULTS, 2).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    let follower = 1 - leader;
    group.wait_renew(leader).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = group.sidecars[leader].rss_kib();
    let follower_rss = group.sidecars[follower].rss_kib();
    let name = group.sidecars[leader].name.clone();
    group.api.clear_requests();
    let url = format!("http://{}/leader", group.sidecars[leader].gate);
    let from = Instant::now();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("wrk")
            .args(["-t2", "-c64", &format!("-d{seconds}s"), "--latency", &url])
            .output()
    })
    .await
    .unwrap();
    let output = match output {
        Ok(o) if o.status.success() => o,
        other => {
            eprintln!("wrk did not run ({other:?}); apt-get install -y wrk");
            return None;
        }
    };
    let until = Instant::now();
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let rss_after = group.sidecars[leader].rss_kib();
    let still_leading = group.sidecars[leader]
        .leader()
        .await
        .is_some_and(|p| p.leading());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after_5s = group.sidecars[leader].rss_kib();
    // Renews during the load: the gaps between successive successful renews
    // (and from the start and to the end of the load).
    let mut times: Vec<Instant> = vec![from];
    times.extend(
        group
            .successful_updates(&name)
            .iter()
            .map(|r| r.at)
            .filter(|at| *at <= until),
    );
    let renews = times.len() - 1;
    times.push(until);
    let max_renew_gap = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    Some(WrkRun {
        requests_per_s: wrk_field(&text, "Requests/sec:"),
        p50_ms: wrk_latency(&text, "50%"),
        p99_ms: wrk_latency(&text, "99%"),
        rss_before,
        rss_after,
        rss_after_5s,
        follower_rss,
        max_renew_gap,
        renews,
        still_leading,
    })
}

fn wrk_field(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// A line of wrk's latency distribution (`50%  612.00us`), in ms.
fn wrk_latency(text: &str, key: &str) -> f64 {
    let value = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or("");
    let (number, unit) = value.split_at(
        value
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(value.len()),
    );
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

// ---------------------------------------------------------------- the table

struct Table {
    rows: Vec<String>,
}

impl Table {
    fn durations(
        &mut self,
        name: &str,
        goal: &str,
        values: &[Duration],
        met: impl Fn(f64) -> bool,
    ) {
        let ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        self.signed(name, goal, &ms, met);
    }

    /// `met` is judged on the p99.
    fn signed(&mut self, name: &str, goal: &str, values: &[f64], met: impl Fn(f64) -> bool) {
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let p99 = v[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
        let verdict = if goal.is_empty() {
            ""
        } else if met(p99) {
            "met"
        } else {
            "**not met**"
        };
        self.rows.push(format!(
            "| {name} | {n} | {:.1} | {:.1} | {:.1} | {:.1} | {goal} | {verdict} |",
            v[0],
            v[n / 2],
            p99,
            v[n - 1]
        ));
    }

    fn print(&self) {
        if self.rows.is_empty() {
            return;
        }
        println!("| measurement (ms) | rounds | min | median | p99 | max | goal (p99) | |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            println!("{r}");
        }
    }
}

fn main() {
    let opts = Opts::parse();
    let rounds = opts.rounds;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    support::raise_fd_limit(8192);
    let binary = std::env::var("LEADER_GATE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_leader-gate").to_string());
    runtime.block_on(async {
        let mut table = Table { rows: Vec::new() };
        let started = Instant::now();
        let note = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

        if opts.wants("acquire") {
            note("acquire");
            let mut v = Vec::new();
            for _ in 0..rounds {
                v.push(first_acquisition().await);
            }
            table.durations(
                "first acquisition: 3 fresh candidates, no Lease → first 200 (from the first spawn)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
        }
        if opts.wants("graceful") {
            note("graceful");
            let v = graceful(rounds).await;
            table.durations(
                "graceful: SIGTERM of the leader → another answers 200 (defaults 15s/10s/2s, 3 candidates)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
        }
        if opts.wants("crash") {
            note("crash");
            let v = crash(rounds).await;
            table.durations(
                "crash: SIGKILL → another answers 200, overshoot beyond last renew + lease (4s/3s/1s)",
                "≤ 100",
                &v,
                |p| p <= 100.0,
            );
        }
        if opts.wants("edit") {
            note("edit");
            let v = edit(rounds).await;
            table.durations(
                "step-down: external holder edit → old leader answers 503 (defaults)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
        }
        if opts.wants("forbidden") {
            note("forbidden");
            let (from_403, lateness) = forbidden(rounds).await;
            table.durations(
                "step-down: renew answered 403 (received by the fake) → 503 (defaults)",
                "",
                &from_403,
                |_| true,
            );
            table.signed(
                "step-down: 403 → 503, lateness vs last renew + renew deadline (negative = early, by design for 403)",
                "",
                &lateness,
                |_| true,
            );
        }
        if opts.wants("hang") {
            note("hang");
            let v = hang(rounds).await;
            let never_early = v.iter().all(|l| *l >= 0.0);
            table.signed(
                "step-down: renews hang → 503, lateness vs last renew received + renew deadline (4s/3s/1s)",
                "0 ≤ x ≤ 10",
                &v,
                |p| never_early && p <= 10.0,
            );
        }
        if opts.wants("startup") {
            note("startup");
            let mut v = Vec::new();
            for _ in 0..rounds {
                v.push(startup().await);
            }
            table.durations(
                "start: spawn → first /leader answer (one process)",
                "≤ 100",
                &v,
                |p| p <= 100.0,
            );
        }
        if opts.wants("fanout") {
            note("fanout");
            let mut v = Vec::new();
            for _ in 0..rounds.min(5) {
                v.push(fanout_latency().await);
            }
            table.durations(
                "stopped-leading published → received by the last of 1,000 /events subscribers",
                "",
                &v,
                |_| true,
            );
        }

        let steady = if opts.quick {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(10)
        };
        let mut loads = Vec::new();
        if opts.wants("load10") {
            note("load10");
            loads.push(load(10, steady).await);
        }
        if opts.wants("load100") && !opts.quick {
            note("load100");
            loads.push(load(100, steady).await);
        }
        let wrk = if opts.wants("wrk") {
            note("wrk");
            wrk_leader(if opts.quick { 3 } else { 10 }).await
        } else {
            None
        };
        note("done");

        println!();
        println!("binary: {binary}");
        println!(
            "rounds: {rounds}{}; 2 worker threads in the bench; p99 by nearest rank\n",
            if opts.quick { " (quick)" } else { "" }
        );
        table.print();
        if !loads.is_empty() {
            println!();
            println!(
                "| API server load (defaults) | steady s | non-watch req/s | watch events/s | bookmarks/s | bytes/s | hand-over: writes (409s) in 1 s, took | expiry: writes (409s) in 1 s, took | mean RSS KiB |"
            );
            println!("|---|---|---|---|---|---|---|---|---|");
            for l in &loads {
                println!(
                    "| {} candidates | {:.1} | {:.2} | {:.2} | {:.2} | {:.0} | {} ({}), {:.0} ms | {} ({}), {:.0} ms | {} |",
                    l.candidates,
                    l.seconds,
                    l.requests_per_s,
                    l.events_per_s,
                    l.bookmarks_per_s,
                    l.bytes_per_s,
                    l.handover.writes,
                    l.handover.conflicts,
                    l.handover.took.as_secs_f64() * 1000.0,
                    l.expiry.writes,
                    l.expiry.conflicts,
                    l.expiry.took.as_secs_f64() * 1000.0,
                    l.rss_mean_kib,
                );
            }
        }
        println!();
        println!("| footprint and /leader load | value | goal | |");
        println!("|---|---|---|---|");
        let size = std::fs::metadata(&binary).map(|m| m.len()).unwrap_or(0);
        println!(
            "| binary size | {:.1} MiB | | |",
            size as f64 / (1024.0 * 1024.0)
        );
        if let Some(w) = wrk {
            let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
            println!(
                "| wrk -t2 -c64 /leader on the leader: requests/s | {:.0} | ≥ 100000 | {} |",
                w.requests_per_s,
                verdict(w.requests_per_s >= 100_000.0)
            );
            println!(
                "| wrk latency p50 / p99 | {:.2} / {:.2} ms | p99 ≤ 2 ms | {} |",
                w.p50_ms,
                w.p99_ms,
                verdict(w.p99_ms <= 2.0)
            );
            println!(
                "| renews during the load: count, longest gap (retry 2 s) | {}, {:.0} ms; still leading: {} | no missed renew | {} |",
                w.renews,
                w.max_renew_gap.as_secs_f64() * 1000.0,
                w.still_leading,
                verdict(w.still_leading && w.max_renew_gap < Duration::from_millis(2500))
            );
            println!(
                "| idle follower RSS | {} KiB | ≤ 8192 | {} |",
                w.follower_rss,
                verdict(w.follower_rss <= 8192)
            );
            println!(
                "| leader RSS before / right after / 5 s after the load | {} / {} / {} KiB | ≤ 8192 after | {} |",
                w.rss_before,
                w.rss_after,
                w.rss_after_5s,
                verdict(w.rss_after_5s <= 8192)
            );
        }
    });
}
