//! The history checker of the chaos test: what every instance said, from
//! two independent sources, on the test's one monotonic clock, and the rules
//! a correct run obeys. It knows nothing about processes or sockets: tests
//! feed it synthetic histories to show that each rule catches its violation.
//!
//! # Sources
//!
//! - **Probes**: a sampler sends `GET /leader` to every instance every ~20 ms
//!   and records when the request was *sent* and the answer *received*. The
//!   answer was computed at some unknown instant between the two; nothing
//!   else is assumed about it. A probe that got no answer (timeout, refused)
//!   is recorded too, with status 0: it means "unknown", never "not leading".
//! - **Stream events**: every message of every incarnation's `/events`,
//!   stamped on arrival, and with its publication instant: the sidecar's
//!   `published_at_us` (CLOCK_REALTIME of this same machine) mapped onto the
//!   monotonic clock by [`WallMap`]. Ordering transitions of different
//!   processes by publication, not arrival, keeps a slow reader from
//!   inventing or hiding an overlap.
//! - **Incarnations**: each process of each instance, when it was spawned and
//!   how it ended (SIGKILL sent, exit after SIGTERM, or a crash).
//! - **Faults**: when each fault was injected and when it healed.
//! - **Slice writes**: every successful write of the routing EndpointSlice,
//!   from the fake API server's request log: who wrote it, when the server
//!   received it, and whom it lists. Faults delay a request only after it is
//!   logged, so receipt is the send, give or take the loopback's latency.
//!
//! # Rules (see [`check`])
//!
//! 1. **No overlap** (probes). A term's leadership is one interval of time.
//!    It certainly contains every instant at which one of its 200s was
//!    computed, so it contains `[min received, max sent]` over its 200s,
//!    and nothing more can be proven. Two terms A and B *provably* overlap
//!    iff `maxsent(A) > minreceived(B)` and `maxsent(B) > minreceived(A)`:
//!    otherwise the computation instants can be placed so that A's all come
//!    before B's (or after). This is `monitor.rs`'s rule ("an older term's
//!    200 sent after a newer term's 200 was received"), made symmetric so it
//!    needs no guess of which term is older. A term answered 200 by two
//!    processes is an overlap too — unless they are successive incarnations
//!    of one instance, each spawned after the previous one ended: a term
//!    resumed from the pod's state directory, judged per process then (the
//!    old process's 200s must not overlap the new one's).
//! 2. **No long leaderless gap in fault-free time** (probes). Each run of
//!    consecutive 200s of one process bounds a leadership from outside:
//!    from the send of the process's previous answered probe (or its spawn)
//!    to the earliest of the receipt of its next answered probe, its exit,
//!    and — when no probe in between went unanswered — `received +
//!    valid_for_ms` of the run's last 200. Time outside every such bound is
//!    provably leaderless. Fault windows `[injected, healed]` are cut out of
//!    each gap and the clock restarts at every heal (and at instantaneous
//!    faults that by design block takeover for a lease: holder edits,
//!    deletion); what remains, a stretch of fault-free time, must be at most
//!    `lease_duration + retry_period + ε`: a holder left behind by a fault
//!    expires one lease duration after peers last saw it change (G3, G7),
//!    acquisitions are spread over half a retry period, and ε covers the
//!    sampler's resolution and request latency. Faults that by design never
//!    delay a takeover by the healthy peers (dropped watches, 410 Gone,
//!    token rotation) do not suspend the check.
//! 3. **Paired transitions** (streams). Within one process's stream a
//!    `started-leading` is followed by the `stopped-leading` of the same
//!    term (with a reason) before any other start; `renewed` names the open
//!    term; a stream that ended cleanly (SIGTERM) closed its term first. A
//!    term ends at the earlier of its stop's publication and the end of its
//!    last confirmed validity (publication of a `state`/`renewed` or arrival
//!    of a `started-leading`, plus `valid_for_ms`) — a SIGKILLed or frozen
//!    process never sends its stop, its validity ends its term. Another
//!    process's `started-leading` must not be published before that end —
//!    except by a process that never showed a holder, within a lease
//!    duration after the chaos deleted the Lease: the deletion destroyed
//!    the only record of the last holder, and an absent Lease may be created
//!    at once (DESIGN G7). Those starts are counted and printed apart; rule
//!    1 still holds them to account for any provable overlap. Nor does it
//!    bind the next incarnation of the same instance resuming that very
//!    term (`--state-dir`) once the old process had ended (SIGKILL sent, or
//!    its exit): a dead process's validity speaks for nobody.
//! 4. **Terms never repeat**: no term starts twice (streams), every term is
//!    answered 200 by one process only (probes) — a resumed term aside, as
//!    in rule 1 — and every term a process answered 200 for is announced on
//!    that process's stream.
//!
//! 5. **The slice names only a leader** (slice writes, with the terms of
//!    rules 2 and 3). A write that lists instance X was written by X itself,
//!    lists nobody else, and was received while X led one of its terms as
//!    its own stream shows (from the term's start to its end, as rule 3
//!    defines them) or its probes do (within the bounds of one of its runs
//!    of 200s, as rule 2 draws them), widened by ε. A write that lists X
//!    only marked terminating (not ready, still serving: a graceful
//!    step-down's mark, which kube-proxy uses only while no ready endpoint
//!    exists) was written by X itself, lists nobody else, and was received
//!    after X began a leadership. A write that lists nobody breaks no rule. Rule 5 judges the
//!    sending of a write, not when the server applied it: a write held by a
//!    fault lands later, and the compare-and-swap makes it fail if the next
//!    leader wrote first.
//!
//! Known limit: the wall-to-monotonic mapping assumes CLOCK_REALTIME is not
//! stepped during the run (slewing is harmless: the map is recalibrated).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One `GET /leader` of the sampler.
#[derive(Clone, Debug)]
pub struct Probe {
    pub instance: String,
    pub incarnation: u32,
    pub sent: Instant,
    pub received: Instant,
    /// The HTTP status; 0 when nothing answered.
    pub status: u16,
    pub term: Option<String>,
    pub holder: Option<String>,
    pub valid_for: Duration,
}

impl Probe {
    pub fn leading(&self) -> bool {
        self.status == 200
    }

    pub fn answered(&self) -> bool {
        self.status != 0
    }
}

/// What a stream message said.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// The current state (first message of a fresh stream). `since` is when
    /// the current leading/holder state began.
    State {
        leading: bool,
        since: Option<Instant>,
        /// The holder it had observed, if any.
        holder: Option<String>,
    },
    Started,
    Stopped {
        reason: Option<String>,
    },
    NewLeader {
        holder: Option<String>,
    },
    Renewed,
    /// The reader fell behind: events were skipped.
    Lagged,
    Other(String),
}

impl Message {
    pub fn name(&self) -> &str {
        match self {
            Message::State { .. } => "state",
            Message::Started => "started-leading",
            Message::Stopped { .. } => "stopped-leading",
            Message::NewLeader { .. } => "new-leader",
            Message::Renewed => "renewed",
            Message::Lagged => "lagged",
            Message::Other(kind) => kind,
        }
    }
}

/// One message of one process's `/events`.
#[derive(Clone, Debug)]
pub struct StreamEvent {
    pub instance: String,
    pub incarnation: u32,
    pub arrived: Instant,
    /// `published_at_us`, on the monotonic clock.
    pub published: Instant,
    pub message: Message,
    pub id: Option<String>,
    pub term: Option<String>,
    pub valid_for: Option<Duration>,
}

/// How a process ended.
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    /// SIGKILL was sent at this instant.
    Killed,
    /// It exited after SIGTERM (observed at this instant).
    Terminated,
    /// It exited without being told to: a crash (the exit status).
    Crashed(String),
}

/// How the test's reader of a process's stream finished.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StreamEnd {
    /// The server ended it (clean end of the chunked body).
    Clean,
    /// Transport error, or the process died.
    Broken,
}

/// One process of one instance.
#[derive(Clone, Debug)]
pub struct Incarnation {
    pub instance: String,
    pub number: u32,
    pub spawned: Instant,
    pub ended: Option<(Instant, End)>,
    /// When the test's `/events` stream was connected.
    pub stream_from: Option<Instant>,
    pub stream_end: Option<(Instant, StreamEnd)>,
}

/// One injected fault.
#[derive(Clone, Debug)]
pub struct FaultSpan {
    pub kind: String,
    pub target: String,
    pub detail: String,
    pub injected: Instant,
    /// `None`: still active at the end.
    pub healed: Option<Instant>,
    /// Whether the gap check is suspended while it is active and restarts
    /// its clock when it heals (rule 2).
    pub suspends_gap_check: bool,
}

/// One successful write (create or update) of the routing EndpointSlice.
#[derive(Clone, Debug)]
pub struct SliceWrite {
    /// The client that wrote it: the instance's name.
    pub instance: String,
    /// When the API server received it.
    pub received: Instant,
    /// The pods it lists (empty: nobody).
    pub lists: Vec<String>,
    /// It lists its pods marked terminating (`ready: false, serving: true,
    /// terminating: true`), every one of them: a step-down's mark.
    pub marked: bool,
}

/// The timing the bounds derive from.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub lease: Duration,
    pub retry: Duration,
    pub epsilon: Duration,
}

impl Bounds {
    /// The longest leaderless stretch of fault-free time allowed.
    pub fn max_gap(&self) -> Duration {
        self.lease + self.retry + self.epsilon
    }
}

/// Everything the test saw.
#[derive(Clone, Debug)]
pub struct History {
    pub seed: u64,
    /// Times are printed relative to this.
    pub origin: Instant,
    /// Gaps are checked from here (every instance serving) ...
    pub check_from: Instant,
    /// ... to here (sampling stopped).
    pub end: Instant,
    pub probes: Vec<Probe>,
    pub events: Vec<StreamEvent>,
    pub incarnations: Vec<Incarnation>,
    pub faults: Vec<FaultSpan>,
    pub slice_writes: Vec<SliceWrite>,
}

/// A broken rule, with the instant to print the history around.
#[derive(Clone, Debug)]
pub struct Violation {
    pub at: Instant,
    pub rule: &'static str,
    pub detail: String,
}

impl Violation {
    /// `[rule] at +1.234s: detail`, the instant relative to `origin`.
    pub fn line(&self, origin: Instant) -> String {
        format!(
            "[{}] at {}: {}",
            self.rule,
            rel(origin, self.at),
            self.detail
        )
    }
}

/// A leaderless stretch of fault-free time.
#[derive(Clone, Copy, Debug)]
pub struct Stretch {
    pub from: Instant,
    pub to: Instant,
}

impl Stretch {
    pub fn len(&self) -> Duration {
        self.to.saturating_duration_since(self.from)
    }
}

/// The outcome of [`check`].
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    /// The longest leaderless stretch of fault-free time (rule 2).
    pub longest_gap: Option<Stretch>,
    /// The longest leaderless gap of all, faults included.
    pub longest_raw_gap: Option<Stretch>,
    /// Stream messages by kind.
    pub transitions: BTreeMap<String, usize>,
    /// Terms seen leading by the sampler.
    pub terms_probed: usize,
    /// Terms announced on the streams.
    pub terms_announced: usize,
    pub probes: usize,
    pub unanswered: usize,
    /// Starts that rule 3 would reject, made by a process that never saw
    /// the Lease held, within a lease duration after the chaos deleted it:
    /// the deletion destroyed the only record of the last holder (DESIGN
    /// G7 lets an absent Lease be created at once). Counted, not excused
    /// silently.
    pub blind_after_deletion: Vec<String>,
    /// Terms a restarted process resumed from its state directory.
    pub terms_resumed: usize,
    /// Slice writes that list somebody, each checked by rule 5.
    pub slice_writes_listing: usize,
    /// Slice writes that list nobody.
    pub slice_writes_empty: usize,
    /// Slice writes that mark their writer terminating (a step-down).
    pub slice_writes_marked: usize,
    /// The farthest a write that passed rule 5 lay outside its writer's
    /// leadership (zero: every write was inside one, ε unused).
    pub slice_write_margin_used: Duration,
}

/// Checks every rule of the module docs.
pub fn check(history: &History, bounds: &Bounds) -> Verdict {
    let mut verdict = Verdict {
        probes: history.probes.len(),
        unanswered: history.probes.iter().filter(|p| !p.answered()).count(),
        ..Verdict::default()
    };
    for event in &history.events {
        *verdict
            .transitions
            .entry(event.message.name().to_owned())
            .or_default() += 1;
    }
    check_overlap(history, &mut verdict);
    check_gaps(history, bounds, &mut verdict);
    let terms = check_streams(history, bounds, &mut verdict);
    check_slice(history, bounds, &terms, &mut verdict);
    for i in &history.incarnations {
        if let Some((at, End::Crashed(status))) = &i.ended {
            verdict.violations.push(Violation {
                at: *at,
                rule: "crash",
                detail: format!(
                    "{} exited without being told to: {status}",
                    process_name((&i.instance, i.number))
                ),
            });
        }
    }
    verdict.violations.sort_by_key(|v| v.at);
    verdict
}

type Process<'a> = (&'a str, u32);

fn process_name((instance, incarnation): Process<'_>) -> String {
    format!("{instance}#{incarnation}")
}

/// Whether `processes` (of one term) are successive incarnations of one
/// instance, each spawned only after the one before had ended: a term
/// resumed from the pod's state directory (`--state-dir`) after a restart,
/// never held by two live processes.
fn resumed_in_turn(history: &History, processes: &[Process<'_>]) -> bool {
    let mut sorted = processes.to_vec();
    sorted.sort_by_key(|p| p.1);
    sorted.dedup();
    sorted
        .windows(2)
        .all(|pair| resumed_by(history, pair[0], pair[1]))
}

/// `later` is a later incarnation of `earlier`'s instance, spawned after
/// `earlier` ended (SIGKILL sent, or its exit).
fn resumed_by(history: &History, earlier: Process<'_>, later: Process<'_>) -> bool {
    let find = |(instance, number): Process<'_>| {
        history
            .incarnations
            .iter()
            .find(|i| i.instance == instance && i.number == number)
    };
    earlier.0 == later.0
        && earlier.1 < later.1
        && match (find(earlier), find(later)) {
            (Some(e), Some(l)) => e.ended.as_ref().is_some_and(|(at, _)| *at <= l.spawned),
            _ => false,
        }
}

// --- rule 1: overlap, from the probes ---

struct TermProbes<'a> {
    first_received: &'a Probe,
    last_sent: &'a Probe,
    processes: Vec<Process<'a>>,
}

fn check_overlap(history: &History, verdict: &mut Verdict) {
    let mut terms: BTreeMap<&str, TermProbes<'_>> = BTreeMap::new();
    for probe in history.probes.iter().filter(|p| p.leading()) {
        let Some(term) = probe.term.as_deref() else {
            verdict.violations.push(Violation {
                at: probe.received,
                rule: "overlap",
                detail: format!(
                    "{} answered 200 without a term",
                    process_name((&probe.instance, probe.incarnation))
                ),
            });
            continue;
        };
        let process = (probe.instance.as_str(), probe.incarnation);
        let entry = terms.entry(term).or_insert(TermProbes {
            first_received: probe,
            last_sent: probe,
            processes: Vec::new(),
        });
        if probe.received < entry.first_received.received {
            entry.first_received = probe;
        }
        if probe.sent > entry.last_sent.sent {
            entry.last_sent = probe;
        }
        if !entry.processes.contains(&process) {
            entry.processes.push(process);
        }
    }
    verdict.terms_probed = terms.len();
    for (term, t) in &terms {
        if t.processes.len() > 1 && !resumed_in_turn(history, &t.processes) {
            let names: Vec<String> = t.processes.iter().copied().map(process_name).collect();
            verdict.violations.push(Violation {
                at: t.first_received.received,
                rule: "overlap",
                detail: format!(
                    "term {term} was answered 200 by more than one process: {}",
                    names.join(", ")
                ),
            });
        }
    }
    // A resumed term is judged per process, as if each had its own: the
    // old process's 200s must all come before the new one's.
    let mut per_process: BTreeMap<(&str, Process<'_>), TermProbes<'_>> = BTreeMap::new();
    for probe in history.probes.iter().filter(|p| p.leading()) {
        let Some(term) = probe.term.as_deref() else {
            continue;
        };
        let process = (probe.instance.as_str(), probe.incarnation);
        let entry = per_process.entry((term, process)).or_insert(TermProbes {
            first_received: probe,
            last_sent: probe,
            processes: vec![process],
        });
        if probe.received < entry.first_received.received {
            entry.first_received = probe;
        }
        if probe.sent > entry.last_sent.sent {
            entry.last_sent = probe;
        }
    }
    let all: Vec<(&str, &TermProbes<'_>)> = per_process
        .iter()
        .map(|((term, _), t)| (*term, t))
        .collect();
    for (i, (term_a, a)) in all.iter().enumerate() {
        for (term_b, b) in &all[i + 1..] {
            if a.last_sent.sent > b.first_received.received
                && b.last_sent.sent > a.first_received.received
            {
                let at = a.first_received.received.max(b.first_received.received);
                verdict.violations.push(Violation {
                    at,
                    rule: "overlap",
                    detail: format!(
                        "two leaders: {pa} led term {term_a} (200 received {ra}, 200 sent {sa}) \
                         and {pb} led term {term_b} (200 received {rb}, 200 sent {sb}): each \
                         answered 200 to a request sent after the other's 200 had arrived",
                        pa = process_name((&a.last_sent.instance, a.last_sent.incarnation)),
                        pb = process_name((&b.last_sent.instance, b.last_sent.incarnation)),
                        ra = rel(history.origin, a.first_received.received),
                        sa = rel(history.origin, a.last_sent.sent),
                        rb = rel(history.origin, b.first_received.received),
                        sb = rel(history.origin, b.last_sent.sent),
                    ),
                });
            }
        }
    }
}

// --- rule 2: leaderless gaps, from the probes ---

/// Outer bounds of every leadership the probes show (runs of 200s), with
/// the instance that led.
fn leadership_bounds(history: &History) -> Vec<(&str, Instant, Instant)> {
    let incarnations: HashMap<Process<'_>, &Incarnation> = history
        .incarnations
        .iter()
        .map(|i| ((i.instance.as_str(), i.number), i))
        .collect();
    let mut by_process: HashMap<Process<'_>, Vec<&Probe>> = HashMap::new();
    for probe in &history.probes {
        by_process
            .entry((probe.instance.as_str(), probe.incarnation))
            .or_default()
            .push(probe);
    }
    let mut bounds = Vec::new();
    for (process, mut probes) in by_process {
        probes.sort_by_key(|p| p.sent);
        let incarnation = incarnations.get(&process);
        let spawned = incarnation.map(|i| i.spawned);
        let exited = incarnation.and_then(|i| i.ended.as_ref().map(|(at, _)| *at));
        let mut i = 0;
        while i < probes.len() {
            if !probes[i].leading() {
                i += 1;
                continue;
            }
            // A run: consecutive answered 200s of one term (unanswered
            // probes inside it are unknowns between two 200s of one term,
            // and a term is one interval).
            let term = probes[i].term.clone();
            let first = i;
            let mut last = i;
            let mut j = i + 1;
            while j < probes.len() {
                let p = probes[j];
                if p.leading() && p.term == term {
                    last = j;
                } else if p.answered() {
                    break;
                }
                j += 1;
            }
            let lo = probes[..first]
                .iter()
                .rev()
                .find(|p| p.answered())
                .map(|p| p.sent)
                .or(spawned)
                .unwrap_or(probes[first].sent)
                .min(probes[first].sent);
            let last_200 = probes[last];
            let next_answered = probes[last + 1..].iter().find(|p| p.answered());
            let unknown_between = probes[last + 1..]
                .iter()
                .take_while(|p| !p.answered())
                .next()
                .is_some();
            let mut hi = None::<Instant>;
            let mut cap = |t: Instant| hi = Some(hi.map_or(t, |h| h.min(t)));
            if let Some(next) = next_answered {
                cap(next.received);
            }
            if let Some(exited) = exited {
                cap(exited);
            }
            if !unknown_between {
                cap(last_200.received + last_200.valid_for);
            }
            // Unknown until the end of sampling: assume it led throughout.
            let hi = hi.unwrap_or(history.end).max(last_200.received);
            bounds.push((process.0, lo, hi));
            i = last + 1;
        }
    }
    bounds.sort_by_key(|b| b.1);
    bounds
}

fn check_gaps(history: &History, bounds: &Bounds, verdict: &mut Verdict) {
    // Merge the leadership bounds; the complement is provably leaderless.
    let mut gaps = Vec::new();
    let mut cursor = history.check_from;
    for (_, lo, hi) in leadership_bounds(history) {
        if lo > cursor && cursor < history.end {
            gaps.push(Stretch {
                from: cursor,
                to: lo.min(history.end),
            });
        }
        cursor = cursor.max(hi);
    }
    if cursor < history.end {
        gaps.push(Stretch {
            from: cursor,
            to: history.end,
        });
    }
    let mut windows: Vec<(Instant, Instant)> = history
        .faults
        .iter()
        .filter(|f| f.suspends_gap_check)
        .map(|f| (f.injected, f.healed.unwrap_or(history.end)))
        .collect();
    windows.sort();
    for gap in gaps {
        if verdict
            .longest_raw_gap
            .is_none_or(|longest| gap.len() > longest.len())
        {
            verdict.longest_raw_gap = Some(gap);
        }
        for stretch in fault_free(gap, &windows) {
            if verdict
                .longest_gap
                .is_none_or(|longest| stretch.len() > longest.len())
            {
                verdict.longest_gap = Some(stretch);
            }
            if stretch.len() > bounds.max_gap() {
                verdict.violations.push(Violation {
                    at: stretch.from,
                    rule: "leaderless",
                    detail: format!(
                        "nobody led for {:?} of fault-free time ({} to {}; the whole gap {} to {}), \
                         more than lease + retry + ε = {:?}",
                        stretch.len(),
                        rel(history.origin, stretch.from),
                        rel(history.origin, stretch.to),
                        rel(history.origin, gap.from),
                        rel(history.origin, gap.to),
                        bounds.max_gap(),
                    ),
                });
            }
        }
    }
}

/// The parts of `gap` outside every fault window, the clock restarting at
/// each heal (an instantaneous fault splits the gap in two).
fn fault_free(gap: Stretch, windows: &[(Instant, Instant)]) -> Vec<Stretch> {
    let mut out = Vec::new();
    let mut cursor = gap.from;
    for &(start, heal) in windows {
        if heal < gap.from || start > gap.to {
            continue;
        }
        if start > cursor {
            out.push(Stretch {
                from: cursor,
                to: start,
            });
        }
        cursor = cursor.max(heal);
    }
    if cursor < gap.to {
        out.push(Stretch {
            from: cursor,
            to: gap.to,
        });
    }
    out
}

// --- rules 3 and 4: the streams ---

/// A term as one process's stream told it.
#[derive(Clone, Debug)]
struct StreamTerm {
    process: (String, u32),
    term: String,
    start: Instant,
    /// The end of the last confirmed validity.
    valid_until: Option<Instant>,
    /// Publication of its stop.
    stopped: Option<Instant>,
    /// Whether the process had shown any holder (its own earlier term, or
    /// another's) before this start: if not, it never saw the Lease held.
    saw_holder: bool,
}

impl StreamTerm {
    /// Where the term certainly ended; `None`: it never did (still leading).
    fn end(&self) -> Option<Instant> {
        match (self.stopped, self.valid_until) {
            (Some(s), Some(v)) => Some(s.min(v)),
            (Some(s), None) => Some(s),
            (None, v) => v,
        }
    }
}

/// Rules 3 and 4; returns the terms the streams told, for rule 5.
fn check_streams(history: &History, bounds: &Bounds, verdict: &mut Verdict) -> Vec<StreamTerm> {
    let mut by_process: BTreeMap<(String, u32), Vec<&StreamEvent>> = BTreeMap::new();
    for event in &history.events {
        by_process
            .entry((event.instance.clone(), event.incarnation))
            .or_default()
            .push(event);
    }
    let incarnations: HashMap<(String, u32), &Incarnation> = history
        .incarnations
        .iter()
        .map(|i| ((i.instance.clone(), i.number), i))
        .collect();
    let mut terms: Vec<StreamTerm> = Vec::new();
    let mut announced: HashMap<(String, u32), HashSet<String>> = HashMap::new();
    let mut started: HashMap<String, Vec<(String, u32)>> = HashMap::new();
    for (process, mut events) in by_process {
        events.sort_by_key(|e| e.arrived);
        let name = process_name((&process.0, process.1));
        let mut open: Option<StreamTerm> = None;
        let mut saw_holder = false;
        let push = |v: &mut Verdict, at: Instant, rule: &'static str, detail: String| {
            v.violations.push(Violation { at, rule, detail });
        };
        for event in events {
            let term = event.term.clone();
            let shown_before = saw_holder;
            saw_holder |= match &event.message {
                Message::State {
                    leading, holder, ..
                } => *leading || holder.is_some(),
                Message::NewLeader { holder } => holder.is_some(),
                Message::Started => true,
                _ => false,
            };
            match &event.message {
                Message::State { leading, since, .. } => match (leading, &term, &mut open) {
                    (true, Some(t), None) => {
                        announced
                            .entry(process.clone())
                            .or_default()
                            .insert(t.clone());
                        open = Some(StreamTerm {
                            process: process.clone(),
                            term: t.clone(),
                            start: since.unwrap_or(event.published).min(event.published),
                            valid_until: event.valid_for.map(|v| event.published + v),
                            stopped: None,
                            saw_holder: shown_before,
                        });
                    }
                    (true, Some(t), Some(o)) if *t == o.term => {
                        if let Some(v) = event.valid_for {
                            o.valid_until = Some(event.published + v);
                        }
                    }
                    (false, _, None) => {}
                    _ => push(
                        verdict,
                        event.arrived,
                        "pairing",
                        format!(
                            "{name}: a state (leading {leading}, term {term:?}) contradicts the open term {:?}",
                            open.as_ref().map(|o| &o.term)
                        ),
                    ),
                },
                Message::Started => {
                    let Some(t) = term else {
                        push(
                            verdict,
                            event.arrived,
                            "pairing",
                            format!("{name}: started-leading without a term"),
                        );
                        continue;
                    };
                    if let Some(o) = open.take() {
                        push(
                            verdict,
                            event.arrived,
                            "pairing",
                            format!(
                                "{name}: started-leading {t} while term {} was never stopped",
                                o.term
                            ),
                        );
                        terms.push(o);
                    }
                    announced
                        .entry(process.clone())
                        .or_default()
                        .insert(t.clone());
                    started.entry(t.clone()).or_default().push(process.clone());
                    open = Some(StreamTerm {
                        process: process.clone(),
                        term: t,
                        start: event.published,
                        // Judged when written to the stream, before arrival.
                        valid_until: event.valid_for.map(|v| event.arrived + v),
                        stopped: None,
                        saw_holder: shown_before,
                    });
                }
                Message::Stopped { reason } => match (&term, open.take()) {
                    (Some(t), Some(mut o)) if *t == o.term => {
                        if reason.as_deref().is_none_or(str::is_empty) {
                            push(
                                verdict,
                                event.arrived,
                                "pairing",
                                format!("{name}: stopped-leading {t} without a reason"),
                            );
                        }
                        o.stopped = Some(event.published);
                        terms.push(o);
                    }
                    (_, o) => {
                        push(
                            verdict,
                            event.arrived,
                            "pairing",
                            format!(
                                "{name}: stopped-leading for term {term:?} but the open term is {:?}",
                                o.as_ref().map(|o| &o.term)
                            ),
                        );
                        if let Some(o) = o {
                            terms.push(o);
                        }
                    }
                },
                Message::Renewed => match (&term, &mut open) {
                    (Some(t), Some(o)) if *t == o.term => {
                        if let Some(v) = event.valid_for {
                            o.valid_until = Some(event.published + v);
                        }
                    }
                    _ => push(
                        verdict,
                        event.arrived,
                        "pairing",
                        format!(
                            "{name}: renewed for term {term:?} but the open term is {:?}",
                            open.as_ref().map(|o| &o.term)
                        ),
                    ),
                },
                Message::Lagged => push(
                    verdict,
                    event.arrived,
                    "pairing",
                    format!(
                        "{name}: the test's reader lagged; transitions were skipped and cannot be checked"
                    ),
                ),
                Message::NewLeader { .. } | Message::Other(_) => {}
            }
        }
        if let Some(o) = open {
            let incarnation = incarnations.get(&process);
            let clean_end = incarnation
                .and_then(|i| i.stream_end)
                .filter(|(_, end)| *end == StreamEnd::Clean);
            if let Some((at, _)) = clean_end {
                push(
                    verdict,
                    at,
                    "pairing",
                    format!(
                        "{name}: its stream ended cleanly with term {} never stopped",
                        o.term
                    ),
                );
            }
            let running = incarnation.is_some_and(|i| i.ended.is_none() && i.stream_end.is_none());
            let mut o = o;
            if running {
                // Still running and connected at the end: still leading.
                o.valid_until = None;
            }
            terms.push(o);
        }
    }
    verdict.terms_announced = started.len();

    // Rule 4: a term starts once.
    for (term, processes) in &started {
        let processes_ref: Vec<Process<'_>> =
            processes.iter().map(|(i, n)| (i.as_str(), *n)).collect();
        if processes.len() > 1 && resumed_in_turn(history, &processes_ref) {
            verdict.terms_resumed += 1;
        } else if processes.len() > 1 {
            let at = terms
                .iter()
                .filter(|t| &t.term == term)
                .map(|t| t.start)
                .max()
                .unwrap_or(history.end);
            let names: Vec<String> = processes
                .iter()
                .map(|(i, n)| process_name((i, *n)))
                .collect();
            verdict.violations.push(Violation {
                at,
                rule: "repeated-term",
                detail: format!("term {term} started more than once: {}", names.join(", ")),
            });
        }
    }
    // Rule 4: what the sampler saw leading was announced on the stream.
    let mut probed: BTreeMap<(String, u32, String), &Probe> = BTreeMap::new();
    for probe in history.probes.iter().filter(|p| p.leading()) {
        if let Some(term) = &probe.term {
            probed
                .entry((probe.instance.clone(), probe.incarnation, term.clone()))
                .or_insert(probe);
        }
    }
    for ((instance, number, term), first) in probed {
        let process = (instance, number);
        let Some(incarnation) = incarnations.get(&process) else {
            continue;
        };
        // Only while the stream was connected can it be held to account.
        let connected = incarnation
            .stream_from
            .is_some_and(|from| from <= first.sent)
            && incarnation
                .stream_end
                .is_none_or(|(at, _)| at >= first.received);
        let known = announced
            .get(&process)
            .is_some_and(|terms| terms.contains(&term));
        if connected && !known {
            verdict.violations.push(Violation {
                at: first.received,
                rule: "unannounced-term",
                detail: format!(
                    "{} answered 200 for term {term}, which its stream never announced",
                    process_name((&process.0, process.1))
                ),
            });
        }
    }
    // Rule 3: no start before the previous term of another process ended.
    terms.sort_by_key(|t| t.start);
    for (i, a) in terms.iter().enumerate() {
        for b in &terms[i + 1..] {
            if a.process == b.process {
                continue;
            }
            // Its own term, resumed by the next incarnation once this one
            // was gone: its validity no longer speaks for a live process.
            if a.term == b.term
                && resumed_by(
                    history,
                    (&a.process.0, a.process.1),
                    (&b.process.0, b.process.1),
                )
            {
                continue;
            }
            let end = a.end();
            if end.is_none_or(|end| end > b.start) {
                if !b.saw_holder && deleted_shortly_before(history, bounds, b.start) {
                    verdict.blind_after_deletion.push(format!(
                        "{} started term {} at {}, {} after the Lease was deleted, never \
                         having seen it held, while {}'s term {} was still valid",
                        process_name((&b.process.0, b.process.1)),
                        b.term,
                        rel(history.origin, b.start),
                        history
                            .faults
                            .iter()
                            .filter(|f| f.kind == LEASE_DELETED && f.injected <= b.start)
                            .map(|f| format!("{:?}", b.start - f.injected))
                            .next_back()
                            .unwrap_or_default(),
                        process_name((&a.process.0, a.process.1)),
                        a.term,
                    ));
                    continue;
                }
                verdict.violations.push(Violation {
                    at: b.start,
                    rule: "pairing",
                    detail: format!(
                        "{} started term {} (published {}) while {}'s term {} had not ended \
                         (stop published {}, validity until {})",
                        process_name((&b.process.0, b.process.1)),
                        b.term,
                        rel(history.origin, b.start),
                        process_name((&a.process.0, a.process.1)),
                        a.term,
                        a.stopped
                            .map_or("never".to_owned(), |s| rel(history.origin, s)),
                        a.valid_until
                            .map_or("open".to_owned(), |v| rel(history.origin, v)),
                    ),
                });
            }
        }
    }
    terms
}

// --- rule 5: the routing slice ---

fn check_slice(history: &History, bounds: &Bounds, terms: &[StreamTerm], verdict: &mut Verdict) {
    let eps = bounds.epsilon;
    // Every leadership of each instance, from both sources.
    let mut led: HashMap<&str, Vec<(Instant, Instant)>> = HashMap::new();
    for t in terms {
        let to = t.end().unwrap_or(history.end).max(t.start);
        led.entry(t.process.0.as_str())
            .or_default()
            .push((t.start, to));
    }
    for (instance, lo, hi) in leadership_bounds(history) {
        led.entry(instance).or_default().push((lo, hi));
    }
    // How far `at` lies outside the nearest leadership of `instance`
    // (zero inside one; `None`: it never led).
    let outside = |instance: &str, at: Instant| {
        led.get(instance)?
            .iter()
            .map(|&(from, to)| {
                from.saturating_duration_since(at)
                    .max(at.saturating_duration_since(to))
            })
            .min()
    };
    let mut margin = Duration::ZERO;
    for write in &history.slice_writes {
        let Some(pod) = write.lists.first() else {
            verdict.slice_writes_empty += 1;
            continue;
        };
        verdict.slice_writes_listing += 1;
        let at = rel(history.origin, write.received);
        let mut push = |detail: String| {
            verdict.violations.push(Violation {
                at: write.received,
                rule: "routing",
                detail,
            });
        };
        if write.lists.len() > 1 {
            push(format!(
                "{}'s write of the slice (received {at}) lists {:?}: more than one pod",
                write.instance, write.lists
            ));
        }
        for listed in &write.lists {
            if *listed != write.instance {
                push(format!(
                    "{}'s write of the slice (received {at}) lists {listed}: only a leader \
                     writes the slice, and only itself",
                    write.instance
                ));
            }
        }
        if *pod != write.instance {
            continue; // a violation above, whoever leads
        }
        if write.marked {
            // A step-down's mark: after a leadership of the writer began.
            verdict.slice_writes_marked += 1;
            let led_before = led
                .get(pod.as_str())
                .is_some_and(|spans| spans.iter().any(|(from, _)| *from <= write.received + eps));
            if !led_before {
                push(format!(
                    "{pod} marked itself terminating in the slice (received {at}) before it ever led"
                ));
            }
            continue;
        }
        match outside(pod, write.received) {
            Some(d) if d <= eps => margin = margin.max(d),
            _ => {
                let spans = led.get(pod.as_str()).cloned().unwrap_or_default();
                let span = |s: Option<&(Instant, Instant)>| {
                    s.map_or("none".to_owned(), |(f, t)| {
                        format!("{}..{}", rel(history.origin, *f), rel(history.origin, *t))
                    })
                };
                let before = spans
                    .iter()
                    .filter(|(_, to)| *to < write.received)
                    .max_by_key(|(_, to)| *to);
                let after = spans
                    .iter()
                    .filter(|(from, _)| *from > write.received)
                    .min_by_key(|(from, _)| *from);
                push(format!(
                    "{pod} wrote itself into the slice (received {at}) while it led none of its \
                 terms: it led {} before and {} after (its stream terms and runs of 200s; \
                 {eps:?} allowed either side)",
                    span(before),
                    span(after),
                ));
            }
        }
    }
    verdict.slice_write_margin_used = margin;
}

/// The kind of fault that deletes the Lease.
pub const LEASE_DELETED: &str = "lease-deleted";

/// Whether the Lease was deleted within one lease duration before `at`.
fn deleted_shortly_before(history: &History, bounds: &Bounds, at: Instant) -> bool {
    history
        .faults
        .iter()
        .any(|f| f.kind == LEASE_DELETED && f.injected <= at && at - f.injected <= bounds.lease)
}

// --- printing ---

/// `+12.345s` relative to `origin`.
pub fn rel(origin: Instant, t: Instant) -> String {
    if t >= origin {
        format!("+{:.3}s", (t - origin).as_secs_f64())
    } else {
        format!("-{:.3}s", (origin - t).as_secs_f64())
    }
}

/// The interleaved history (both sources, incarnations and faults) within
/// `window` of `at`, sorted by time; runs of equal probes of one process are
/// collapsed into one line.
pub fn render(history: &History, at: Instant, window: Duration) -> String {
    let from = at.checked_sub(window).unwrap_or(history.origin);
    let to = at + window;
    let within = |t: Instant| t >= from && t <= to;
    let mut lines: Vec<(Instant, String)> = Vec::new();
    for f in &history.faults {
        if within(f.injected) {
            lines.push((
                f.injected,
                format!("FAULT  {} on {} ({}) injected", f.kind, f.target, f.detail),
            ));
        }
        if let Some(h) = f.healed.filter(|h| within(*h)) {
            lines.push((h, format!("FAULT  {} on {} healed", f.kind, f.target)));
        }
    }
    for i in &history.incarnations {
        let name = process_name((&i.instance, i.number));
        if within(i.spawned) {
            lines.push((i.spawned, format!("PROC   {name} spawned")));
        }
        if let Some((t, end)) = i.ended.as_ref().filter(|(t, _)| within(*t)) {
            lines.push((*t, format!("PROC   {name} ended: {end:?}")));
        }
        if let Some(t) = i.stream_from.filter(|t| within(*t)) {
            lines.push((t, format!("STREAM {name} connected")));
        }
        if let Some((t, end)) = i.stream_end.filter(|(t, _)| within(*t)) {
            lines.push((t, format!("STREAM {name} ended: {end:?}")));
        }
    }
    for w in history.slice_writes.iter().filter(|w| within(w.received)) {
        lines.push((
            w.received,
            format!(
                "SLICE  {} wrote the slice listing {:?}{}",
                w.instance,
                w.lists,
                if w.marked { " marked terminating" } else { "" }
            ),
        ));
    }
    for e in history.events.iter().filter(|e| within(e.arrived)) {
        let mut line = format!(
            "EVENT  {} {}",
            process_name((&e.instance, e.incarnation)),
            e.message.name()
        );
        if let Some(t) = &e.term {
            let _ = write!(line, " term={t}");
        }
        match &e.message {
            Message::Stopped { reason } => {
                let _ = write!(line, " reason={}", reason.as_deref().unwrap_or("-"));
            }
            Message::NewLeader { holder } => {
                let _ = write!(line, " holder={}", holder.as_deref().unwrap_or("-"));
            }
            Message::State { leading, .. } => {
                let _ = write!(line, " leading={leading}");
            }
            _ => {}
        }
        if let Some(v) = e.valid_for {
            let _ = write!(line, " valid_for={}ms", v.as_millis());
        }
        let _ = write!(line, " (published {})", rel(history.origin, e.published));
        lines.push((e.arrived, line));
    }
    // Probes: collapse runs of the same answer of one process.
    let mut by_process: BTreeMap<Process<'_>, Vec<&Probe>> = BTreeMap::new();
    for p in history.probes.iter().filter(|p| within(p.sent)) {
        by_process
            .entry((p.instance.as_str(), p.incarnation))
            .or_default()
            .push(p);
    }
    for (process, mut probes) in by_process {
        probes.sort_by_key(|p| p.sent);
        let mut i = 0;
        while i < probes.len() {
            let key = |p: &Probe| (p.status, p.term.clone(), p.holder.clone());
            let mut j = i;
            while j + 1 < probes.len() && key(probes[j + 1]) == key(probes[i]) {
                j += 1;
            }
            let (a, b) = (probes[i], probes[j]);
            let answer = match a.status {
                0 => "no answer".to_owned(),
                200 => format!("200 term={}", a.term.as_deref().unwrap_or("-")),
                s => format!("{s} holder={}", a.holder.as_deref().unwrap_or("-")),
            };
            lines.push((
                a.sent,
                format!(
                    "PROBE  {} {answer} x{} (first sent {} recv {}; last sent {} recv {} valid_for={}ms)",
                    process_name(process),
                    j - i + 1,
                    rel(history.origin, a.sent),
                    rel(history.origin, a.received),
                    rel(history.origin, b.sent),
                    rel(history.origin, b.received),
                    b.valid_for.as_millis(),
                ),
            ));
            i = j + 1;
        }
    }
    lines.sort_by_key(|(t, _)| *t);
    let mut out = String::new();
    for (t, line) in lines {
        let _ = writeln!(out, "{:>10}  {line}", rel(history.origin, t));
    }
    out
}

/// The report of a failed check: the seed, every violation, and the
/// interleaved history around the first few.
pub fn failure_report(history: &History, verdict: &Verdict, bounds: &Bounds) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "history check failed: {} violation(s); replay with LEADER_GATE_CHAOS_SEED={}",
        verdict.violations.len(),
        history.seed
    );
    for v in &verdict.violations {
        let _ = writeln!(out, "  {}", v.line(history.origin));
    }
    let mut shown: Vec<Instant> = Vec::new();
    let window = bounds.max_gap();
    for v in &verdict.violations {
        if shown.len() == 3 || shown.iter().any(|t| v.at.max(*t) - v.at.min(*t) < window) {
            continue;
        }
        shown.push(v.at);
        let _ = writeln!(
            out,
            "\n--- history around {} ({}) ---\n{}",
            rel(history.origin, v.at),
            v.rule,
            render(history, v.at, window)
        );
    }
    out
}

// --- the wall clock on the monotonic one ---

/// Maps CLOCK_REALTIME microseconds (what the sidecars stamp events with)
/// onto the test's monotonic clock, from calibration pairs taken during the
/// run (the nearest one is used, so slewing does not accumulate).
#[derive(Clone, Debug, Default)]
pub struct WallMap {
    points: Vec<(i64, Instant)>,
}

impl WallMap {
    /// Takes a calibration pair now.
    pub fn calibrate(&mut self) {
        let wall = leader_gate::clock::wall_micros();
        self.points.push((wall, Instant::now()));
    }

    pub fn add(&mut self, wall_us: i64, at: Instant) {
        self.points.push((wall_us, at));
    }

    /// The monotonic instant of the wall-clock `wall_us`.
    pub fn map(&self, wall_us: i64) -> Option<Instant> {
        let (wall, at) = self
            .points
            .iter()
            .min_by_key(|(w, _)| (w - wall_us).unsigned_abs())?;
        let delta = wall_us - wall;
        if delta >= 0 {
            at.checked_add(Duration::from_micros(delta as u64))
        } else {
            at.checked_sub(Duration::from_micros(delta.unsigned_abs()))
        }
    }
}
