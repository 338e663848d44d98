//! The chaos harness: five real `leader-gate serve` processes against the
//! fake Lease API server under a seeded random mix of faults, recorded from
//! two independent sources (every process's event stream and a sampler of
//! every process's leader endpoint, on the test's monotonic clock) for the
//! history checker (`support/history.rs`), one history per Lease.
//!
//! A [`World`] says what differs between runs: the Leases each sidecar
//! contends for, its flags, which faults apply and how often, and how the
//! run ends. `tests/it/chaos.rs` (one Lease, routing, named successors) and
//! `tests/it/chaos_several.rs` (three Leases, the spread) are the two worlds
//! with the checks they make at the end.
//!
//! Seeds: by default (CI) a world's fixed CI seeds, schedules that passed;
//! `LEADER_GATE_CHAOS_SEED=random` draws a fresh seed,
//! `LEADER_GATE_CHAOS_SEED=<n>` replays one (printed first, and again with
//! any failure); `LEADER_GATE_CHAOS_SECS=<n>` sets how long faults are
//! injected. The seed fixes the sequence of fault *decisions* — kind,
//! Lease, target choice, duration, variant, pauses — drawn from one
//! `fastrand::Rng` the same way whatever happens ([`draw`]). The processes
//! run in real time with their own jitter, so a replay injects the same
//! faults, not at the same instants of their elections (a fault aimed at
//! "the holder" hits whoever holds then).
//!
//! Every fault heals after a bounded time; at most two slots of faults are
//! active at once (a squeeze takes both).
//!
//! Rooms: this one runs the cluster (members, the run loop, exits, the end
//! of recording); `faults.rs` the kinds and the draw; `inject.rs` carries
//! a decision out and heals it; `successor.rs` the named-successor faults;
//! `record.rs` the recorder and the per-Lease histories.

mod faults;
mod inject;
mod record;
mod successor;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::support::fake_apiserver::{FakeApiServer, Fault, FaultKind, lease_holder};
use crate::support::history::{Bounds, End, FaultSpan, History, Message, Stretch, Violation, rel};
use crate::support::sidecar::{Sidecar, Timing, test_dir};

pub use faults::Kind;
use faults::{Active, Draw, Heal, Until, draw, secs};
pub use record::{Frame, Process, Recorder, lease_history};
pub use successor::SuccessorStats;

pub const NAMESPACE: &str = "collectors";
pub const NAMES: [&str; 5] = ["c0", "c1", "c2", "c3", "c4"];
pub const TIMING: Timing = Timing::FAST;
/// Sampler resolution, request latency and scheduling on a busy machine.
pub const EPSILON: Duration = Duration::from_secs(1);

pub fn bounds() -> Bounds {
    Bounds {
        lease: TIMING.lease,
        retry: TIMING.retry,
        epsilon: EPSILON,
    }
}

/// What differs between chaos runs.
pub struct World {
    /// Names the test directory, the log lines and the reports.
    pub label: &'static str,
    /// The Leases every sidecar contends for; the first is the one the fake
    /// API server's Role names. With one, the sidecars are asked as a
    /// sidecar of one Lease is (`/leader`, `/events`).
    pub leases: &'static [&'static str],
    /// The faults injected, with their weights.
    pub kinds: &'static [(Kind, u32)],
    /// How often each process's leader endpoint is sampled, per Lease.
    pub sample_every: Duration,
    /// Readies the API server (before any sidecar starts).
    pub prepare: fn(&FakeApiServer),
    /// Member `i`'s flags besides the timing and its `--state-dir`.
    pub flags: fn(usize) -> Vec<String>,
    /// Two thirds of the SIGTERMs come after a pre-stop step-down (`POST
    /// /handover`, as `leader-gate prestop` sends it), up to 1.5 s before.
    pub prestop_hook: bool,
    /// One 403 in three is on every verb (else on updates).
    pub forbid_every_verb: bool,
    /// The fault the run ends with, once its time is up.
    pub closing: Option<Kind>,
}

pub fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// Runs `world` once per seed, each announced as it starts, and hands each
/// run to `finish` once its last fault healed. The seeds:
/// `LEADER_GATE_CHAOS_SEED` unset, `ci`; `random`, a fresh one; a number,
/// that one. Each injects faults for `LEADER_GATE_CHAOS_SECS`, or
/// `default_secs`.
pub async fn run_each<F: Future<Output = ()>>(
    world: &'static World,
    ci: &[u64],
    default_secs: u64,
    mut finish: impl FnMut(Chaos) -> F,
) {
    let secs = env_u64("LEADER_GATE_CHAOS_SECS").unwrap_or(default_secs);
    let seeds = match std::env::var("LEADER_GATE_CHAOS_SEED") {
        Err(_) => ci.to_vec(),
        Ok(value) if value.trim() == "random" => vec![fastrand::u64(..)],
        Ok(_) => vec![env_u64("LEADER_GATE_CHAOS_SEED").expect("set")],
    };
    for seed in seeds {
        eprintln!(
            "{} seed {seed} ({secs} s of faults); replay with \
             LEADER_GATE_CHAOS_SEED={seed} LEADER_GATE_CHAOS_SECS={secs}",
            world.label
        );
        let mut chaos = Chaos::start(world, seed).await;
        chaos.run(Duration::from_secs(secs)).await;
        finish(chaos).await;
    }
}

/// The first `n` decisions `seed` draws in `world`, each as
/// `kind/lease/index/variant`: what a test pins so that a CI seed keeps
/// replaying the schedule it passed with.
pub fn drawn(world: &World, seed: u64, n: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            let d = draw(&mut rng, world.kinds, world.leases.len(), NAMES.len());
            format!("{}/{}/{}/{}", d.kind.name(), d.lease, d.index, d.variant)
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Proc {
    Running,
    Stopped,
    /// SIGTERM sent at this instant; waiting for the exit.
    Terminating(Instant),
    Down,
}

pub struct Member {
    pub name: &'static str,
    pub incarnation: u32,
    pub sidecar: Option<Sidecar>,
    pub state: Proc,
    /// A per-client fault of the API server is active.
    api_faulted: bool,
    /// After a SIGTERM exit: how long to stay down.
    down_for: Duration,
}

pub struct Chaos {
    pub world: &'static World,
    pub seed: u64,
    pub api: FakeApiServer,
    pub dir: PathBuf,
    pub rec: Arc<Recorder>,
    pub members: Vec<Member>,
    rng: fastrand::Rng,
    /// Every fault injected, with the one Lease it concerns (`None`: all).
    pub spans: Vec<(Option<usize>, FaultSpan)>,
    active: Vec<Active>,
    pub counts: BTreeMap<&'static str, usize>,
    /// Decisions not carried out: no eligible target.
    pub skipped: usize,
    api_down: bool,
    /// The store's resource version once the API server had stopped.
    api_down_rv: u64,
    pub origin: Instant,
    pub check_from: Instant,
    pub violations: Vec<Violation>,
    tasks: Vec<JoinHandle<()>>,
    /// The operator's kubeconfig (a client of its own, never faulted).
    operator: PathBuf,
    handovers: Vec<successor::PendingHandover>,
    pub successor: SuccessorStats,
    /// How often each pod was seen (in the API server's records) starting
    /// to hold two Leases or more.
    pub doubled: BTreeMap<String, usize>,
    holding_two: Option<String>,
    pub squeezes: usize,
    /// Who held each Lease just before the latest heal.
    pub before_heal: Vec<Option<String>>,
}

impl Chaos {
    /// Starts the cluster: every member serving and every stream of every
    /// member subscribed before anybody may win.
    pub async fn start(world: &'static World, seed: u64) -> Chaos {
        let origin = Instant::now();
        let api = FakeApiServer::start(NAMESPACE, world.leases[0]).await;
        let dir = test_dir(&format!("{}-{seed}", world.label));
        let operator = api.write_kubeconfig("operator", &dir);
        (world.prepare)(&api);
        let rec = Arc::new(Recorder::new(world.leases));
        rec.wall.lock().unwrap().calibrate();
        let mut chaos = Chaos {
            world,
            seed,
            api,
            dir,
            rec: rec.clone(),
            members: NAMES
                .iter()
                .map(|name| Member {
                    name,
                    incarnation: 0,
                    sidecar: None,
                    state: Proc::Down,
                    api_faulted: false,
                    down_for: Duration::ZERO,
                })
                .collect(),
            rng: fastrand::Rng::with_seed(seed),
            spans: Vec::new(),
            active: Vec::new(),
            counts: BTreeMap::new(),
            skipped: 0,
            api_down: false,
            api_down_rv: 0,
            origin,
            check_from: origin,
            violations: Vec::new(),
            tasks: Vec::new(),
            operator,
            handovers: Vec::new(),
            successor: SuccessorStats::default(),
            doubled: BTreeMap::new(),
            holding_two: None,
            squeezes: 0,
            before_heal: Vec::new(),
        };
        chaos
            .tasks
            .push(tokio::spawn(record::calibrate(rec.clone())));
        for name in NAMES {
            for lease in 0..world.leases.len() {
                let task = record::sample(rec.clone(), name.to_owned(), lease, world.sample_every);
                chaos.tasks.push(tokio::spawn(task));
            }
        }
        // Nobody may win before every stream is subscribed: hold every
        // request (a partition that heals once all listen).
        for name in NAMES {
            chaos.api.set_fault(name, Fault::all(FaultKind::Partition));
        }
        for i in 0..NAMES.len() {
            chaos.spawn(i).await;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !rec.all_streams_connected() {
            assert!(Instant::now() < deadline, "streams never connected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for name in NAMES {
            chaos.api.clear_faults(name);
        }
        chaos.check_from = Instant::now();
        chaos
    }

    /// Starts the next incarnation of member `i` and its stream readers.
    async fn spawn(&mut self, i: usize) {
        let member = &mut self.members[i];
        member.incarnation += 1;
        let (name, number) = (member.name, member.incarnation);
        let leases = self.world.leases.len();
        let process = Process::new(name, number, Instant::now(), leases);
        self.rec.processes.lock().unwrap().push(process);
        let (api, dir) = (self.api.clone(), self.dir.clone());
        let mut flags = (self.world.flags)(i);
        // The pod's emptyDir: kept across the member's restarts (a
        // subdirectory per Lease), so a restarted holder may resume its terms.
        let state = dir.join(format!("state-{name}"));
        flags.extend(["--state-dir".to_owned(), state.display().to_string()]);
        let sidecar = tokio::task::spawn_blocking(move || {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Sidecar::spawn_logged(
                &api,
                &dir,
                name,
                &format!("{name}.{number}.log"),
                TIMING,
                &flags,
            )
        })
        .await
        .expect("spawn a sidecar");
        sidecar.wait_serving().await;
        let gate = sidecar.gate;
        self.rec
            .targets
            .lock()
            .unwrap()
            .insert(name.to_owned(), Some((gate, number)));
        for lease in 0..leases {
            let reader =
                record::read_stream(self.rec.clone(), name.to_owned(), number, lease, gate);
            self.tasks.push(tokio::spawn(reader));
        }
        let member = &mut self.members[i];
        member.sidecar = Some(sidecar);
        member.state = Proc::Running;
    }

    /// Records that member `i`'s process ended (before it is signalled, for
    /// SIGKILL, so no probe is attributed to a dead process).
    fn mark_ended(&mut self, i: usize, end: End, at: Instant) {
        let member = &self.members[i];
        self.rec
            .targets
            .lock()
            .unwrap()
            .insert(member.name.to_owned(), None);
        self.rec.process(member.name, member.incarnation, |p| {
            p.ended.get_or_insert((at, end));
        });
    }

    async fn kill(&mut self, i: usize) {
        self.mark_ended(i, End::Killed, Instant::now());
        let member = &mut self.members[i];
        if let Some(s) = &mut member.sidecar {
            s.signal(libc::SIGKILL);
            s.wait_exit(Duration::from_secs(5)).await;
        }
        member.state = Proc::Down;
    }

    /// SIGTERM of member `i`, down for `down_for` once it exited.
    fn terminate(&mut self, i: usize, down_for: Duration) {
        let member = &mut self.members[i];
        if let Some(s) = &member.sidecar {
            s.signal(libc::SIGTERM);
        }
        member.state = Proc::Terminating(Instant::now());
        member.down_for = down_for;
    }

    fn freeze(&mut self, i: usize) {
        if let Some(s) = &self.members[i].sidecar {
            s.signal(libc::SIGSTOP);
        }
        self.members[i].state = Proc::Stopped;
    }

    fn cont(&mut self, i: usize) {
        if let Some(s) = &self.members[i].sidecar {
            s.signal(libc::SIGCONT);
        }
        self.members[i].state = Proc::Running;
    }

    /// Who each Lease's record names.
    pub fn holders(&self) -> Vec<Option<String>> {
        self.world
            .leases
            .iter()
            .map(|l| self.api.lease(l).as_ref().and_then(lease_holder))
            .collect()
    }

    fn holder_index(&self, lease: usize) -> Option<usize> {
        let holder = self.holders()[lease].clone()?;
        NAMES.iter().position(|n| *n == holder)
    }

    fn running(&self, name: &str) -> Option<usize> {
        NAMES
            .iter()
            .position(|n| *n == name)
            .filter(|&i| self.members[i].state == Proc::Running)
    }

    fn eligible(&self, kind: Kind, i: usize) -> bool {
        let member = &self.members[i];
        if kind.is_process_fault() {
            member.state == Proc::Running
        } else if kind.is_api_fault() {
            !member.api_faulted
        } else {
            true
        }
    }

    /// Notes when a pod starts holding two Leases or more.
    fn watch_doubles(&mut self) {
        let holders = self.holders();
        let two = NAMES
            .iter()
            .find(|n| holders.iter().flatten().filter(|h| h == n).count() > 1)
            .map(|n| (*n).to_owned());
        if let Some(name) = &two
            && self.holding_two.as_ref() != Some(name)
        {
            *self.doubled.entry(name.clone()).or_default() += 1;
            eprintln!(
                "{} {}: {name} holds two Leases or more: {holders:?}",
                self.world.label,
                rel(self.origin, Instant::now())
            );
        }
        self.holding_two = two;
    }

    /// Injects faults for `duration`, then waits for every active one to
    /// heal (after the world's closing fault, if it has one).
    pub async fn run(&mut self, duration: Duration) {
        let chaos_end = Instant::now() + duration;
        let mut next = Instant::now() + Duration::from_secs(2);
        let mut pending: Option<Draw> = None;
        let mut closed = self.world.closing.is_none();
        // Since when a successor's SIGKILL waits for a successor to be named.
        let mut awaiting_successor: Option<Instant> = None;
        loop {
            self.poll_processes().await;
            self.poll_handovers(false).await;
            self.heal_due().await;
            self.watch_doubles();
            let now = Instant::now();
            let used: usize = self.active.iter().map(|a| a.slots).sum();
            if now >= chaos_end && closed {
                if self.active.is_empty() {
                    break;
                }
            } else if now >= next {
                let mut d = pending.take().unwrap_or_else(|| {
                    let (kinds, leases) = (self.world.kinds, self.world.leases.len());
                    draw(&mut self.rng, kinds, leases, NAMES.len())
                });
                // A world that ends with a given fault (fixed by the seed,
                // as every choice) takes it once the time is up.
                if now >= chaos_end
                    && let Some(kind) = self.world.closing
                {
                    d.kind = kind;
                }
                if used + d.kind.slots() > d.max_active.max(d.kind.slots()) {
                    // Wait for a heal; the same decision is taken then.
                    pending = Some(d);
                } else if d.kind == Kind::SuccessorKill
                    && self.live_successor(d.lease).is_none()
                    && awaiting_successor.get_or_insert(now).elapsed() < TIMING.lease * 2
                {
                    // Wait (two lease durations at most) for a live
                    // successor to be named: skipped, this fault would
                    // too often not happen at all.
                    pending = Some(d);
                } else {
                    awaiting_successor = None;
                    closed |= now >= chaos_end;
                    next = now + d.pause;
                    self.inject(d).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keeps watching the processes (and the hand-overs) for `quiet`.
    pub async fn idle(&mut self, quiet: Duration) {
        let quiet_end = Instant::now() + quiet;
        while Instant::now() < quiet_end {
            self.poll_processes().await;
            self.poll_handovers(false).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Notices exits: the end of a SIGTERM, or a crash.
    pub async fn poll_processes(&mut self) {
        let label = self.world.label;
        for i in 0..self.members.len() {
            let state = self.members[i].state;
            if state == Proc::Down {
                continue;
            }
            let name = self.members[i].name;
            let Some(status) = self.members[i].sidecar.as_mut().and_then(Sidecar::exited) else {
                if let Proc::Terminating(since) = state
                    && since.elapsed() > Duration::from_secs(15)
                {
                    self.violations.push(Violation {
                        at: since,
                        rule: "shutdown",
                        detail: format!("{name} did not exit within 15 s of SIGTERM"),
                    });
                    if let Some(s) = &self.members[i].sidecar {
                        s.signal(libc::SIGKILL);
                    }
                }
                continue;
            };
            let now = Instant::now();
            if let Proc::Terminating(since) = state {
                self.mark_ended(i, End::Terminated, now);
                if status.code() != Some(0) {
                    self.violations.push(Violation {
                        at: now,
                        rule: "shutdown",
                        detail: format!("{name} exited with {status} after SIGTERM"),
                    });
                }
                let member = &mut self.members[i];
                member.state = Proc::Down;
                let heal_at = now + member.down_for;
                eprintln!(
                    "{label} {}: {name} exited {:?} after SIGTERM",
                    rel(self.origin, now),
                    now - since
                );
                for a in &mut self.active {
                    if matches!(a.heal, Heal::AfterExit(j) if j == i) {
                        a.heal_at = Some(heal_at);
                    }
                }
            } else {
                let log = self.members[i]
                    .sidecar
                    .as_ref()
                    .map(Sidecar::log)
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "{label}: {name} crashed ({status}); its log ends:\n{}",
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
                self.mark_ended(i, End::Crashed(status.to_string()), now);
                self.members[i].state = Proc::Down;
                // Keep five candidates: start it again.
                self.spawn(i).await;
            }
        }
    }

    /// The end of recording: a violation for each process that logged a
    /// panic and for the first answers or events that named another Lease;
    /// returns the instant the histories end.
    pub async fn stop_recording(&mut self) -> Instant {
        for m in &self.members {
            if let Some(s) = &m.sidecar
                && s.log().contains("panicked")
            {
                self.violations.push(Violation {
                    at: Instant::now(),
                    rule: "crash",
                    detail: format!("{} logged a panic", m.name),
                });
            }
        }
        let end = Instant::now();
        self.rec.stop.store(true, Ordering::SeqCst);
        for task in &self.tasks {
            task.abort();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mislabelled = self.rec.mislabelled.lock().unwrap().clone();
        for (k, (at, what)) in mislabelled.iter().enumerate().take(5) {
            self.violations.push(Violation {
                at: *at,
                rule: "lease-label",
                detail: format!("{what} ({} of {})", k + 1, mislabelled.len()),
            });
        }
        end
    }

    /// Records a violation found now (not by the history checker).
    pub fn violated(&mut self, rule: &'static str, detail: String) {
        let at = Instant::now();
        self.violations.push(Violation { at, rule, detail });
    }

    /// Lease `lease`'s history up to `end`.
    pub fn history(&self, lease: usize, end: Instant) -> History {
        let frame = Frame {
            seed: self.seed,
            origin: self.origin,
            check_from: self.check_from,
            end,
        };
        lease_history(&self.rec, &self.spans, lease, &frame)
    }

    /// Prints the summary and keeps it; with a report, keeps it and fails.
    pub fn publish(&self, summary: &str, report: &str) {
        eprintln!("{summary}");
        let _ = std::fs::write(self.dir.join("summary.txt"), summary);
        if !report.is_empty() {
            let path = self.dir.join("failure.txt");
            let _ = std::fs::write(&path, report);
            panic!(
                "{} seed {} failed (report in {}, logs in {}):\n{report}",
                self.world.label,
                self.seed,
                path.display(),
                self.dir.display()
            );
        }
    }
}

/// How often each stop reason ended a term in `history`.
pub fn stop_reasons(history: &History) -> BTreeMap<&str, usize> {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &history.events {
        if let Message::Stopped { reason } = &e.message {
            *reasons.entry(reason.as_deref().unwrap_or("-")).or_default() += 1;
        }
    }
    reasons
}

/// A leaderless stretch for a summary.
pub fn stretch(origin: Instant, gap: Option<Stretch>) -> String {
    gap.map_or("none".to_owned(), |g| {
        format!("{:?} at {}", g.len(), rel(origin, g.from))
    })
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.rec.stop.store(true, Ordering::SeqCst);
        // A frozen process must not outlive the test.
        for m in &self.members {
            if let Some(s) = &m.sidecar {
                s.signal(libc::SIGCONT);
            }
        }
    }
}
