//! Scale: 10, 1,000 and 5,000 candidates, many per process.
//!
//! 5,000 processes do not fit a 2-core machine, so every candidate here
//! runs inside the bench process: the same [`leader_gate::elector::driver::run`] and
//! [`leader_gate::election::Election`] that `leader-gate serve` starts (see
//! `src/serve/sidecar.rs`), each with its own `KubeLeaseStore` (its own kube
//! client, its own connections, its own watch) against the fake API server
//! on a real socket. Only the HTTP servers of the sidecar (`/leader`,
//! `/events`, `/metrics`) are left out; the published state is read from
//! the driver's `watch` channel instead. A crash aborts the candidate's task
//! (its client and watch connection are dropped and close); a graceful stop
//! cancels the driver's shutdown token, which is what SIGTERM does in the
//! sidecar (step down, gate lag — 0 here —, release). Replacements (the
//! next pod of the DaemonSet) join after each round, so the group keeps its
//! size.
//!
//! Every figure is read from the fake's request log: a time "to the new
//! leader" runs from the release's arrival (or the last renew's, for an
//! expiry) to the arrival of the new holder's acquisition; the writes of a
//! hand-over are all writes by candidates from the release (or the crash)
//! until a new successor is named, plus 500 ms: the release, the
//! acquisition, the claim of the emptied successor slot, and every 409 of
//! the burst. The fake sends bookmarks once a minute here, as the real API
//! server does (its default of one a second would be 5,000 bookmarks/s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use leader_gate::elector::driver::{self, Heartbeat, ShutdownOptions};
use leader_gate::elector::lease_client::KubeLeaseStore;
use leader_gate::elector::machine::{Election, Settings};
use leader_gate::serve::metrics::Metrics;
use leader_gate::serve::published::{LeaderState, Publisher};
use leader_gate::serve::transitions::{EventLog, LeaseLabel};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, RequestRecord, Verb, lease_holder};
use crate::support::sidecar::{Timing, test_dir};
use crate::table::Table;

const SUCCESSOR: &str = "leader-gate.dev/successor";
/// Candidates started at once while the group forms.
const BATCH: usize = 250;

struct Member {
    name: String,
    stop: CancellationToken,
    task: JoinHandle<()>,
    state: watch::Receiver<LeaderState>,
}

pub struct Swarm {
    pub api: FakeApiServer,
    timing: Timing,
    members: Vec<Member>,
    next: usize,
    /// `--successor-claim-window` of every candidate (default: the default).
    claim_window: Option<Duration>,
}

fn kubeconfig_yaml(api: &FakeApiServer, client: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    namespace: {ns}\n    user: {client}\n\
         current-context: fake\nusers:\n- name: {client}\n  user:\n    token: {token}\n",
        url = api.url(),
        ns = api.namespace(),
        token = api.token(client),
    )
}

/// A kube client of its own for candidate `name`, on Lease `lease`.
pub(crate) async fn client_of(api: &FakeApiServer, name: &str, lease: &str) -> KubeLeaseStore {
    let kubeconfig = Kubeconfig::from_yaml(&kubeconfig_yaml(api, name)).expect("yaml");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    KubeLeaseStore::new(config, NAMESPACE, lease).expect("client")
}

impl Swarm {
    pub async fn start(size: usize, timing: Timing) -> Swarm {
        Self::start_with(size, timing, None).await
    }

    /// With every candidate's claim window set to `claim_window`.
    pub async fn start_with(size: usize, timing: Timing, claim_window: Option<Duration>) -> Swarm {
        // Two threads, as a real API server answers a write while it fans
        // an event out (one thread would queue the successor's write behind
        // 5,000 watch writes).
        let api = FakeApiServer::start_with_threads(NAMESPACE, LEASE, 2).await;
        api.set_bookmark_interval(Duration::from_secs(60));
        let mut swarm = Swarm {
            api,
            timing,
            members: Vec::new(),
            next: 0,
            claim_window,
        };
        while swarm.members.len() < size {
            let n = BATCH.min(size - swarm.members.len());
            for _ in 0..n {
                swarm.spawn().await;
            }
            swarm.wait_watches(swarm.members.len()).await;
        }
        swarm
    }

    async fn wait_watches(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.api.open_watches(None) < n {
            assert!(Instant::now() < deadline, "{n} watches not open in 2 min");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn spawn(&mut self) {
        let name = format!("m{}", self.next);
        self.next += 1;
        let store = client_of(&self.api, &name, LEASE).await;
        let settings = Settings {
            identity: name.clone(),
            namespace: NAMESPACE.into(),
            lease_name: LEASE.into(),
            lease_duration: self.timing.lease,
            renew_deadline: self.timing.renew_deadline,
            retry_period: self.timing.retry,
            holder_labels: Vec::new(),
        };
        let events = EventLog::new(&name, LeaseLabel::alone(NAMESPACE, LEASE), 8, 8);
        let metrics = Arc::new(Metrics::new(NAMESPACE, LEASE));
        let (publisher, state) = Publisher::new(events, metrics);
        let stop = CancellationToken::new();
        let mut election = Election::new(settings, fastrand::u64(..));
        if let Some(window) = self.claim_window {
            election.set_successor_claim_window(window);
        }
        let task = tokio::spawn(driver::run(
            Arc::new(store),
            election,
            publisher,
            Heartbeat::new(),
            stop.clone(),
            ShutdownOptions {
                release: true,
                gate_lag: Duration::ZERO,
                timeout: Duration::from_secs(10),
            },
            driver::Inputs::default(),
        ));
        self.members.push(Member {
            name,
            stop,
            task,
            state,
        });
    }

    fn index_of(&self, name: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} is not a member"))
    }

    /// Holder (not released) and named successor, as the fake stores them.
    pub(crate) fn lease(&self) -> (Option<String>, Option<String>) {
        let Some(lease) = self.api.lease(LEASE) else {
            return (None, None);
        };
        let successor = lease["metadata"]["annotations"][SUCCESSOR]
            .as_str()
            .map(str::to_string);
        (lease_holder(&lease), successor)
    }

    /// Waits for a holder and a named successor other than it.
    async fn settled(&self, timeout: Duration) -> (String, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let (Some(h), Some(s)) = self.lease()
                && h != s
            {
                return (h, s);
            }
            assert!(
                Instant::now() < deadline,
                "no holder and successor within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) async fn holder_other_than(&self, old: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let (Some(h), _) = self.lease()
                && h != old
            {
                return h;
            }
            assert!(
                Instant::now() < deadline,
                "no new holder within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The next successful write of `name` arriving after `after`.
    pub(crate) async fn wait_write(&self, name: &str, after: Option<Instant>) -> RequestRecord {
        loop {
            let mut writes = self.api.requests_of(name, Verb::Update);
            writes.extend(self.api.requests_of(name, Verb::Create));
            writes.sort_by_key(|r| r.at);
            if let Some(r) = writes.into_iter().find(|r| {
                after.is_none_or(|a| r.at > a) && matches!(r.status, Some(200) | Some(201))
            }) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The last successful write of `name` arriving before `before`.
    pub(crate) fn last_write(&self, name: &str, before: Instant) -> RequestRecord {
        self.api
            .requests_of(name, Verb::Update)
            .into_iter()
            .filter(|r| r.at < before && r.status == Some(200))
            .max_by_key(|r| r.at)
            .unwrap_or_else(|| {
                let mine: Vec<_> = self
                    .api
                    .requests()
                    .into_iter()
                    .filter(|r| r.client == name)
                    .map(|r| (r.verb, r.status, r.at.elapsed()))
                    .collect();
                panic!(
                    "no write of {name} before {:?} ago: {mine:?}",
                    before.elapsed()
                )
            })
    }

    /// Until every candidate's published state names `holder`.
    pub(crate) async fn all_see(&self, holder: &str, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let behind = self
                .members
                .iter()
                .filter(|m| m.state.borrow().holder.as_deref() != Some(holder))
                .count();
            if behind == 0 {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "{behind} never saw {holder}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Edits an annotation no candidate reads and times the fake's writing
    /// of the event to every open watch.
    pub(crate) async fn fake_fanout(&self) -> f64 {
        let n = self.api.open_watches(None) as u64;
        let before = self.api.traffic().watch_events;
        let t0 = Instant::now();
        self.api.update_lease(LEASE, |l| {
            l["metadata"]["annotations"]["bench/probe"] = fastrand::u64(..).to_string().into();
        });
        while self.api.traffic().watch_events < before + n {
            assert!(t0.elapsed() < Duration::from_secs(30), "fan-out not done");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        ms(t0.elapsed())
    }

    /// When `name` publishes a holder other than `from` (it saw the release
    /// or the new holder on its watch), as its driver publishes it.
    fn sees_change(&self, name: &str, from: &str) -> JoinHandle<Instant> {
        let mut state = self.members[self.index_of(name)].state.clone();
        let from = from.to_string();
        tokio::spawn(async move {
            loop {
                if state.borrow_and_update().holder.as_deref() != Some(from.as_str()) {
                    return Instant::now();
                }
                if state.changed().await.is_err() {
                    return Instant::now();
                }
            }
        })
    }

    pub(crate) fn crash(&mut self, name: &str) {
        let m = self.members.remove(self.index_of(name));
        m.task.abort();
    }

    /// SIGTERM's path; the task ends after its release.
    pub(crate) async fn stop(&mut self, name: &str) {
        let m = self.members.remove(self.index_of(name));
        m.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), m.task).await;
    }

    /// Ends every candidate (the row is done).
    pub(crate) fn abort_all(&mut self) {
        for m in self.members.drain(..) {
            m.task.abort();
        }
    }

    pub(crate) async fn replace(&mut self, n: usize) {
        let before = self.api.open_watches(None);
        for _ in 0..n {
            self.spawn().await;
        }
        self.wait_watches(before + n).await;
    }

    /// Writes by candidates (not `except`) arriving in `[from, to]`:
    /// (successful, 409). The new holder's successful renews after its
    /// acquisition `acq` are the steady load, not the hand-over's.
    pub(crate) fn writes(
        &self,
        from: Instant,
        to: Instant,
        except: &[&str],
        acq: &RequestRecord,
    ) -> (usize, usize) {
        let log = self.api.requests();
        let w: Vec<_> = log
            .iter()
            .filter(|r| {
                r.at >= from
                    && r.at <= to
                    && !except.contains(&r.client.as_str())
                    && matches!(r.verb, Verb::Update | Verb::Create | Verb::Patch)
                    && !(r.client == acq.client && r.at > acq.at && r.status == Some(200))
            })
            .collect();
        (
            w.iter()
                .filter(|r| r.status == Some(200) || r.status == Some(201))
                .count(),
            w.iter().filter(|r| r.status == Some(409)).count(),
        )
    }

    /// The end of a hand-over: a new successor named (other than `new`),
    /// plus 500 ms for the stragglers.
    async fn refilled(&self, new: &str) -> Instant {
        let window = leader_gate::elector::machine::DEFAULT_CLAIM_WINDOW + Duration::from_secs(10);
        let deadline = Instant::now() + window;
        loop {
            if let (Some(h), Some(s)) = self.lease()
                && h == new
                && s != new
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no successor claimed within {window:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        Instant::now()
    }
}

#[derive(Default)]
pub struct Row {
    pub candidates: usize,
    pub steady_s: f64,
    pub steady_per_s: f64,
    pub steady_claims: usize,
    /// Per round: ms to the new leader; successful writes; 409s; fan-out ms
    /// (acquisition → every candidate publishes the new holder).
    pub graceful: Vec<Round>,
    pub expiry: Vec<Round>,
    pub expiry_dead: Vec<Round>,
    pub operator: Vec<Round>,
    /// The fake's own share: an edit of an annotation nobody reads → the
    /// fake wrote the event to every watch (ms).
    pub fake_fanout_ms: Vec<f64>,
    /// Operator rounds where the old leader published "not leading" before
    /// its release arrived.
    pub operator_gates_first: usize,
}

#[derive(Clone, Copy, Default)]
pub struct Round {
    pub ms: f64,
    pub writes: usize,
    pub conflicts: usize,
    pub fanout_ms: f64,
    /// Graceful and operator: from the successor's publishing of the
    /// release it saw on its watch to its acquisition's arrival (the
    /// elector's own share), and from the release's arrival to that.
    pub after_seen_ms: f64,
    pub seen_ms: f64,
    /// The new holder was the named successor.
    pub successor_won: bool,
}

pub async fn run(
    size: usize,
    rounds: usize,
    steady: Duration,
    binary: &str,
    note: &dyn Fn(&str),
) -> Row {
    let t = DEFAULTS;
    let mut swarm = Swarm::start(size, t).await;
    note(&format!("swarm{size}: {size} candidates watching"));
    let first = swarm.holder_other_than("", t.lease * 3).await;
    // Steady: from a second after the first acquisition (the start's burst
    // is over; the claim of the empty slot is included when it lands in the
    // window, always at 1,000 and more).
    let acquired = swarm.wait_write(&first, None).await;
    let from = (acquired.at + Duration::from_secs(1)).max(Instant::now() + Duration::from_secs(1));
    tokio::time::sleep((from + steady).saturating_duration_since(Instant::now())).await;
    let log = swarm.api.requests();
    let in_window: Vec<_> = log
        .iter()
        .filter(|r| r.at > from && r.at <= from + steady && r.verb != Verb::Watch)
        .collect();
    let steady_claims = in_window
        .iter()
        .filter(|r| r.client != first && r.verb == Verb::Update)
        .count();
    let mut row = Row {
        candidates: size,
        steady_s: steady.as_secs_f64(),
        steady_per_s: in_window.len() as f64 / steady.as_secs_f64(),
        steady_claims,
        ..Row::default()
    };
    let _ = swarm.settled(Duration::from_secs(90)).await;
    for _ in 0..3 {
        row.fake_fanout_ms.push(swarm.fake_fanout().await);
        // Every candidate handles the edit before anything else happens: a
        // release built on the object before it would be answered 409 and,
        // on shutdown, not sent again (the Lease would expire).
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    note(&format!("swarm{size}: graceful"));
    for _ in 0..rounds {
        let (h, s) = swarm.settled(Duration::from_secs(90)).await;
        swarm.api.clear_requests();
        let saw = swarm.sees_change(&s, &h);
        let t0 = Instant::now();
        swarm.stop(&h).await;
        let new = swarm.holder_other_than(&h, t.lease * 2).await;
        let acq = swarm.wait_write(&new, Some(t0)).await;
        let release = swarm.last_write(&h, acq.at);
        let seen = swarm.all_see(&new, Duration::from_secs(30)).await;
        let end = swarm.refilled(&new).await;
        let (writes, conflicts) = swarm.writes(release.at, end, &[], &acq);
        let saw = saw.await.expect("watch task");
        row.graceful.push(Round {
            ms: ms(acq.at - release.at),
            after_seen_ms: ms(acq.at.saturating_duration_since(saw)),
            seen_ms: ms(saw.saturating_duration_since(release.at)),
            writes,
            conflicts,
            fanout_ms: ms(seen - acq.at),
            successor_won: new == s,
        });
        swarm.replace(1).await;
    }

    note(&format!("swarm{size}: operator hand-over"));
    let dir = test_dir(&format!("bench-swarm{size}"));
    let kubeconfig = swarm.api.write_kubeconfig("operator", &dir);
    for _ in 0..rounds {
        let (h, s) = swarm.settled(Duration::from_secs(90)).await;
        swarm.api.clear_requests();
        let mut state = swarm.members[swarm.index_of(&h)].state.clone();
        // The wall clock of the snapshot that said "not leading" (a later
        // one if this task runs late: it errs towards "not first").
        let closed = tokio::spawn(async move {
            loop {
                {
                    let now = state.borrow_and_update();
                    if !now.leading {
                        return now.since_micros;
                    }
                }
                if state.changed().await.is_err() {
                    return i64::MAX;
                }
            }
        });
        let saw = swarm.sees_change(&s, &h);
        let t0 = Instant::now();
        let out = tokio::process::Command::new(binary)
            .args([
                "handover",
                "--lease-name",
                LEASE,
                "--lease-namespace",
                NAMESPACE,
            ])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .await
            .expect("leader-gate handover");
        assert!(
            out.status.success(),
            "handover: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let new = swarm.holder_other_than(&h, t.lease * 2).await;
        let request = swarm.wait_write("operator", Some(t0)).await;
        let acq = swarm.wait_write(&new, Some(request.at)).await;
        let release = swarm.last_write(&h, acq.at);
        let closed_at = closed.await.expect("state task");
        let release_wall = release
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as i64;
        if closed_at < release_wall {
            row.operator_gates_first += 1;
        }
        let seen = swarm.all_see(&new, Duration::from_secs(30)).await;
        let end = swarm.refilled(&new).await;
        let (writes, conflicts) = swarm.writes(request.at, end, &["operator"], &acq);
        let saw = saw.await.expect("watch task");
        row.operator.push(Round {
            ms: ms(acq.at - request.at),
            after_seen_ms: ms(acq.at.saturating_duration_since(saw)),
            seen_ms: ms(saw.saturating_duration_since(release.at)),
            writes,
            conflicts,
            fanout_ms: ms(seen - acq.at),
            successor_won: new == s,
        });
    }

    for dead in [false, true] {
        note(&format!(
            "swarm{size}: expiry{}",
            if dead { ", successor dead too" } else { "" }
        ));
        for _ in 0..rounds {
            let (h, s) = swarm.settled(Duration::from_secs(90)).await;
            swarm.api.clear_requests();
            let renew = swarm.wait_write(&h, Some(Instant::now())).await;
            if dead {
                swarm.crash(&s);
            }
            swarm.crash(&h);
            let t0 = Instant::now();
            let new = swarm.holder_other_than(&h, t.lease * 3).await;
            let acq = swarm.wait_write(&new, Some(renew.at)).await;
            let seen = swarm.all_see(&new, Duration::from_secs(30)).await;
            let end = swarm.refilled(&new).await;
            let (writes, conflicts) = swarm.writes(t0, end, &[], &acq);
            let r = Round {
                ms: ms(acq.at - renew.at),
                writes,
                conflicts,
                fanout_ms: ms(seen - acq.at),
                successor_won: new == s,
                ..Round::default()
            };
            if dead {
                row.expiry_dead.push(r);
            } else {
                row.expiry.push(r);
            }
            swarm.replace(if dead { 2 } else { 1 }).await;
        }
    }
    for m in swarm.members.drain(..) {
        m.task.abort();
    }
    row
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Rows of the main table (times) and a table of writes per hand-over.
pub fn print(rows: &[Row], table: &mut Table) {
    let lease_ms = ms(DEFAULTS.lease);
    let retry_ms = ms(DEFAULTS.retry);
    for r in rows {
        let n = r.candidates;
        let v = |rs: &[Round]| rs.iter().map(|x| x.ms).collect::<Vec<_>>();
        table.signed(
            &format!("swarm {n}: graceful stop → new leader's acquisition, after the release (defaults, gate lag 0)"),
            "≤ 50",
            &v(&r.graceful),
            |p| p <= 50.0,
        );
        for (what, rs) in [("graceful", &r.graceful), ("operator", &r.operator)] {
            table.signed(
                &format!("swarm {n}: {what}: release's arrival → the successor publishes it saw the release (watch fan-out)"),
                "",
                &rs.iter().map(|x| x.seen_ms).collect::<Vec<_>>(),
                |_| true,
            );
            table.signed(
                &format!("swarm {n}: {what}: successor saw the release → its acquisition arrives (the elector's own share)"),
                "",
                &rs.iter().map(|x| x.after_seen_ms).collect::<Vec<_>>(),
                |_| true,
            );
        }
        table.signed(
            &format!("swarm {n}: expiry, successor alive → acquisition, after the last renew (lease 15 s)"),
            &format!("≤ {:.0}", lease_ms + 100.0),
            &v(&r.expiry),
            |p| p <= lease_ms + 100.0,
        );
        table.signed(
            &format!("swarm {n}: expiry, successor dead too → acquisition, after the last renew"),
            &format!("≤ {:.0}", lease_ms + retry_ms),
            &v(&r.expiry_dead),
            |p| p <= lease_ms + retry_ms,
        );
        table.signed(
            &format!("swarm {n}: operator hand-over → acquisition, after the request's PUT"),
            "≤ 100",
            &v(&r.operator),
            |p| p <= 100.0,
        );
    }
}

pub fn print_writes(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "| scale (defaults 15s/10s/2s, in one process) | steady non-watch req/s (claims in window) | graceful: writes / 409s (max) | expiry: writes / 409s (max) | expiry, successor dead: writes / 409s (max) | operator: writes / 409s (max), gates closed first | successor took over (g/e/o) | fan-out ms, acquisition → all candidates (median / max) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let wc = |rs: &[Round]| {
            let w: Vec<usize> = rs.iter().map(|x| x.writes).collect();
            let c: Vec<usize> = rs.iter().map(|x| x.conflicts).collect();
            format!(
                "{} / {} ({} / {})",
                med(&w),
                med(&c),
                w.iter().max().unwrap_or(&0),
                c.iter().max().unwrap_or(&0)
            )
        };
        let won = |rs: &[Round]| rs.iter().filter(|x| x.successor_won).count();
        let mut fan: Vec<f64> = [&r.graceful, &r.expiry, &r.expiry_dead, &r.operator]
            .iter()
            .flat_map(|rs| rs.iter().map(|x| x.fanout_ms))
            .collect();
        fan.sort_by(|a, b| a.total_cmp(b));
        println!(
            "| {} candidates | {:.2} over {:.0} s ({}) | {} | {} | {} | {}, {}/{} | {}/{} / {}/{} / {}/{} | {:.0} / {:.0} |",
            r.candidates,
            r.steady_per_s,
            r.steady_s,
            r.steady_claims,
            wc(&r.graceful),
            wc(&r.expiry),
            wc(&r.expiry_dead),
            wc(&r.operator),
            r.operator_gates_first,
            r.operator.len(),
            won(&r.graceful),
            r.graceful.len(),
            won(&r.expiry),
            r.expiry.len(),
            won(&r.operator),
            r.operator.len(),
            fan.get(fan.len() / 2).copied().unwrap_or(0.0),
            fan.last().copied().unwrap_or(0.0),
        );
    }
    for r in rows {
        println!(
            "\nfake API server alone, one event to {} watches: {:?} ms",
            r.candidates,
            r.fake_fanout_ms
                .iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>()
        );
    }
}

pub(crate) fn med(v: &[usize]) -> usize {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}
