//! The election state machine: everything leader-gate knows about the Lease
//! and what it does next, as a pure function of inputs and an `Instant`.
//!
//! No I/O and no clock reads: the driver feeds [`Input`]s with a [`Now`] and
//! carries out the [`Action`]s; tests do the same with explicit instants.
//! The guarantees of DESIGN.md live here:
//!
//! - G1: every loss returns to [`Role::Following`], from which the next
//!   acquisition is computed again; no input ends the machine.
//! - G2: [`Election::lead_deadline`] is `last successful renew sent +
//!   renew_deadline`; [`Election::handle`] steps down when a tick reaches it,
//!   whatever is in flight, and at once on another owner, deletion or a 403.
//! - G3: a follower's expiry is `observed_at + max(record, local duration)`
//!   where `observed_at` is when the record content last changed here.
//! - G4: writes are built from the last full object seen, with its
//!   resourceVersion; a renew counts only if the resourceVersion changed.
//! - G6: [`Input::Shutdown`] ends the term for good; [`Input::Release`]
//!   then asks for the marked release of our own record, once nothing is in
//!   flight. Every write, the release included, comes out of
//!   [`Election::handle`].
//! - G5: a term's id is the Lease's uid and the `leaseTransitions` our
//!   acquisition wrote, whatever the record says by the time we learn it
//!   landed.
//! - G7: a record is ours only with our identity *and* the `renewTime` of one
//!   of our own writes; a deleted Lease or an unmarked cleared holder counts
//!   as held by the last holder for one more duration. A term starts only
//!   when our own acquisition landed on what we judged free — a create that
//!   lands after a record we saw since was deleted starts none.
//! - G7, creating: a POST is no compare-and-swap of what we saw, only "does
//!   not exist now" — an absence seen before the watch broke may since have
//!   been a peer's Lease, deleted by an operator a moment ago while that peer
//!   still leads (absent, created, deleted: ABA). So after
//!   [`Input::WatchInterrupted`] the machine creates nothing until the watch
//!   shows the Lease again, and an absence it then shows counts as a
//!   deletion seen now: held by the last holder for one duration. (A PUT is
//!   safe from a stale view: its resourceVersion precondition fails.)
//!
//! Collector health ([`Input::CollectorHealth`]) gates contention: while the
//! collector is unhealthy the machine does not lead, makes no acquisition
//! attempt, and releases its own record once with the mark of G6.
//!
//! A step-down request from this pod ([`Input::StepAside`], its collector's
//! pre-stop hook) ends the term as a hand-over request does, and keeps the
//! machine from contending for a bounded time only: unlike
//! [`Input::Shutdown`] it never ends contention for good (G1).
//!
//! # Layout
//!
//! - this module: the types, [`Election::handle`], the snapshot and the
//!   role changes (start, step down, the deadline on both clocks);
//! - `view`: the Lease as seen here — observation, staleness, standing
//!   (free or held until when) and ownership by content;
//! - `requests`: what the machine asks of the API server — the next
//!   request, writes and their results, backoff, timeouts, wakeups.

use std::collections::VecDeque;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::elector::api_error::ApiError;
use crate::elector::lease::{Lease, TermId, WriterMark};

mod requests;
mod resume;
mod revision;
mod spread;
mod successor;
mod view;

pub use resume::{Dropped, NotResumed, Resumption};
pub use spread::{Held, Spread, spread_of};
pub use successor::{
    DEFAULT_CLAIM_WINDOW, HANDOVER_ANNOTATION, SUCCESSOR_ANNOTATION, handover_to, preferred_holder,
    successor_of,
};

use requests::Pending;
use view::{OwnWrite, Source, View};

/// Static settings of one candidate.
#[derive(Clone, Debug)]
pub struct Settings {
    pub identity: String,
    pub namespace: String,
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// Put on the Lease with each acquisition, removed by a release
    /// ([`crate::elector::lease::label_holder`]): this pod and its node.
    pub holder_labels: Vec<(String, String)>,
}

/// The time of an input: the monotonic instant everything is judged on; the
/// boot clock, which also counts suspend, for the validity readers see (G2);
/// and the wall clock, used only to write `renewTime` for humans (G3).
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub instant: Instant,
    pub boot: BootInstant,
    pub wall_micros: i64,
}

/// What happens to the machine.
#[derive(Debug)]
pub enum Input {
    /// The watch, or a read, reports the Lease (`None`: it does not exist).
    /// The first after [`Input::WatchInterrupted`] is the fresh watch's list
    /// (or a GET): the server's truth, taken even with an older
    /// resourceVersion; later ones are events, and a late one is dropped.
    Observed(Option<Lease>),
    /// The write started by the last [`Action::Write`] finished.
    Written(Result<Lease, ApiError>),
    /// The read started by the last [`Action::Read`] finished.
    Read(Result<Option<Lease>, ApiError>),
    /// A deadline may have passed.
    Tick,
    /// The watch failed or ended: changes may be missed until it delivers
    /// the Lease again (the driver then starts a fresh one, which lists).
    WatchInterrupted,
    /// Stop leading for good: the process is shutting down (G6).
    Shutdown,
    /// Hand the Lease over (G6): implies [`Input::Shutdown`], then asks for
    /// the marked release of our own record under `timeout` — only when
    /// nothing is in flight (its outcome decides what the release builds
    /// on), and never for a record that is not ours. The driver sends the
    /// write only once the gates had their lag after the step-down.
    Release { timeout: Duration },
    /// The collector passes (`true`) or fails its health check. Before the
    /// first of these the collector counts as healthy (no check configured).
    CollectorHealth(bool),
    /// Like `CollectorHealth(false)`, because the gates say that nothing of
    /// the term has run for too long (a crash-looping collector): the term
    /// ends with [`StopReason::CollectorNotRunning`]. `CollectorHealth(true)`
    /// ends it.
    CollectorNotRunning,
    /// What this process holds of its group's other Leases (see `spread`);
    /// a process elected for one Lease never sends it.
    Spread(Spread),
    /// Hand the Lease over without shutting down (a step-down request from
    /// this pod, e.g. its collector's pre-stop hook): step down
    /// ([`StopReason::HandoverRequested`]), release our own record with the
    /// mark of G6 (naming the successor already named), and stand aside —
    /// no acquisition, no claim of the successor slot — for `stand_aside`,
    /// so that a peer takes over. Then contend again (G1): a collector
    /// restarted in place (a failed liveness probe runs its pre-stop hook
    /// too) must not leave its pod out of the election for good.
    StepAside { stand_aside: Duration },
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send one write under `timeout`; report it as [`Input::Written`].
    Write(Write),
    /// GET the Lease under `timeout` (fallback when the watch stays silent
    /// after a 409); report it as [`Input::Read`].
    Read { timeout: Duration },
    /// The token was rejected: re-read credentials before the next request.
    ReloadCredentials,
}

/// One CAS write.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub purpose: Purpose,
    /// `Create` when the Lease is absent (POST), else a PUT of this object,
    /// which carries the resourceVersion it was built from.
    pub op: WriteOp,
    pub timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum WriteOp {
    Create(Box<DynamicObject>),
    Replace(Box<DynamicObject>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Acquire,
    Renew,
    Release,
    /// A claim of the empty successor slot, or clearing our own name from it.
    Successor,
}

/// Why a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// No renew succeeded within `renew_deadline` (requests failed or conflicted).
    RenewDeadline,
    /// No renew succeeded within `renew_deadline` and the API server did not answer.
    ApiUnreachable,
    /// The renew got a 403.
    Forbidden,
    /// The record names another holder (or ours, without our `renewTime`).
    LostToOtherHolder,
    /// The holder was cleared by someone else.
    HolderCleared,
    /// The Lease was deleted.
    LeaseDeleted,
    /// The process is shutting down.
    Shutdown,
    /// The collector failed its health check too many times in a row.
    CollectorUnhealthy,
    /// The gates said that nothing of the term ran, for too long.
    CollectorNotRunning,
    /// A hand-over was asked for (`leader-gate handover`, or another
    /// identity in `spec.preferredHolder`).
    HandoverRequested,
    /// This process leads another Lease of its group, and a pod that held
    /// none was named successor of this one (see `spread`).
    Rebalance,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RenewDeadline => "renew-deadline",
            Self::ApiUnreachable => "api-unreachable",
            Self::Forbidden => "forbidden",
            Self::LostToOtherHolder => "lost-to-other-holder",
            Self::HolderCleared => "holder-cleared",
            Self::LeaseDeleted => "lease-deleted",
            Self::Shutdown => "shutdown",
            Self::CollectorUnhealthy => "collector-unhealthy",
            Self::CollectorNotRunning => "collector-not-running",
            Self::HandoverRequested => "handover-requested",
            Self::Rebalance => "rebalance",
        }
    }
}

/// What the collector policy says of this instance's collector, as the
/// driver hears it (see [`crate::serve::collector_policy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectorVerdict {
    /// It may lead, or keep leading.
    Fit,
    /// Its health check keeps it from leading.
    Unhealthy,
    /// Its gates said for too long that nothing runs.
    NotRunning,
}

impl CollectorVerdict {
    /// The machine's input for it.
    pub fn input(self) -> Input {
        match self {
            Self::Fit => Input::CollectorHealth(true),
            Self::Unhealthy => Input::CollectorHealth(false),
            Self::NotRunning => Input::CollectorNotRunning,
        }
    }
}

/// This candidate's role.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// Not leading; waiting for the Lease to become free.
    Following,
    /// Leading `term` until `deadline` unless a renew succeeds first.
    Leading {
        term: TermId,
        /// `last successful renew sent + renew_deadline` (G2).
        deadline: Instant,
        /// The same on the boot clock, fixed when the renew was sent: a
        /// suspend after that can only bring it nearer, never move it later.
        valid_until: BootInstant,
        /// When the next renew is due.
        renew_at: Instant,
    },
}

/// What the machine publishes: the facts `/leader` answers from.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub leading: bool,
    pub term: Option<TermId>,
    /// The live holder as observed (this identity when leading).
    pub holder: Option<String>,
    /// The forced step-down instant while leading.
    pub deadline: Option<Instant>,
    /// The same on the boot clock, as readers judge it.
    pub valid_until: Option<BootInstant>,
    /// Why the last term ended, if one did.
    pub last_stop: Option<StopReason>,
    /// The API server answered at least once.
    pub observed: bool,
    /// The last collector health fed in; `None` when none ever was.
    pub collector_healthy: Option<bool>,
    /// The successor named in the Lease as observed (see [`successor`]).
    pub successor: Option<String>,
    /// The live record is one of this process's own writes: it leads, or
    /// steps down from a term it led, until its release (or the record's
    /// expiry). A record naming this identity that another process wrote —
    /// a previous process of this pod whose term was not resumed, a twin —
    /// is not (see `spread`).
    pub own_record: bool,
}

/// The election of one candidate.
#[derive(Debug)]
pub struct Election {
    settings: Settings,
    rng: fastrand::Rng,
    /// This process's mark on every write (G7): a twin with our identity
    /// cannot forge it.
    writer: WriterMark,
    /// Writer marks of other processes seen writing under our identity
    /// (the last few), and how many distinct ones were seen.
    foreign_writers: VecDeque<String>,
    identity_conflicts: u64,
    /// The foreign mark and `renewTime` of the record under our identity
    /// found at our first observation: a previous incarnation of this pod
    /// (a restart after a crash or an OOM kill), not a twin — unless it
    /// writes again while we run (see `view`).
    /// With the wall-clock instant of that observation: a write of the old
    /// process still in flight then lands later, with an earlier renewTime.
    inherited: Option<(String, i64)>,
    /// The uid and `renewTime` of a previous process's write taken as our
    /// own (`resume`), until the first observation confirms the uid.
    resumed: Option<(String, i64)>,
    /// What the first observation made of the resumed write, until the
    /// driver takes it to say so.
    resumption: Option<Resumption>,
    view: Option<View>,
    role: Role,
    pending: Option<Pending>,
    own_writes: VecDeque<OwnWrite>,
    seen_versions: VecDeque<String>,
    /// The last holder named by any record, for deleted or cleared Leases.
    last_holder: Option<String>,
    /// uids of Leases seen deleted: a late answer about one is stale.
    deleted_uids: VecDeque<String>,
    /// The jittered instant of the next acquisition attempt, chosen once per
    /// expiry so repeated ticks do not re-roll it.
    acquire_at: Option<(Instant, Instant)>,
    /// Not before this instant: backoff after an error, or `Retry-After`.
    not_before: Option<Instant>,
    failures: u32,
    /// A 409 was answered at this instant: wait for the watch, then read.
    conflict_at: Option<Instant>,
    /// The last renew failed because the API server did not answer.
    renew_unreachable: bool,
    /// The watch was interrupted and has not shown the Lease since: the
    /// view may have missed changes (see the module docs, G7 creating).
    watch_interrupted: bool,
    last_stop: Option<StopReason>,
    shutting_down: bool,
    /// The last [`Input::CollectorHealth`]; `None`: never told, healthy.
    collector_healthy: Option<bool>,
    /// The one release of this unhealthy episode was sent: a failed release
    /// is not retried, the Lease then expires.
    released_while_unhealthy: bool,
    /// The named successor and the hand-over (see `successor`).
    successor: successor::Slot,
    /// What this process holds of its group's other Leases.
    spread: Spread,
    /// Standing aside after a step-down request until then
    /// ([`Input::StepAside`]).
    aside_until: Option<Instant>,
}

// === impl Election ===

impl Election {
    pub fn new(settings: Settings, seed: u64) -> Self {
        Self {
            successor: successor::Slot::new(&settings),
            settings,
            rng: fastrand::Rng::with_seed(seed),
            writer: WriterMark::random(),
            foreign_writers: VecDeque::new(),
            identity_conflicts: 0,
            inherited: None,
            resumed: None,
            resumption: None,
            view: None,
            role: Role::Following,
            pending: None,
            own_writes: VecDeque::new(),
            seen_versions: VecDeque::new(),
            last_holder: None,
            deleted_uids: VecDeque::new(),
            acquire_at: None,
            not_before: None,
            failures: 0,
            conflict_at: None,
            renew_unreachable: false,
            watch_interrupted: false,
            last_stop: None,
            shutting_down: false,
            collector_healthy: None,
            released_while_unhealthy: false,
            spread: Spread::default(),
            aside_until: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// This process's writer mark.
    pub fn writer(&self) -> &WriterMark {
        &self.writer
    }

    /// How many other processes (distinct writer marks) were seen writing
    /// the Lease under this identity; the last one's mark.
    pub fn identity_conflicts(&self) -> (u64, Option<&str>) {
        (
            self.identity_conflicts,
            self.foreign_writers.back().map(String::as_str),
        )
    }

    pub fn is_leading(&self) -> bool {
        matches!(self.role, Role::Leading { .. })
    }

    /// The forced step-down instant while leading.
    pub fn lead_deadline(&self) -> Option<Instant> {
        match self.role {
            Role::Leading { deadline, .. } => Some(deadline),
            Role::Following => None,
        }
    }

    /// Feeds one input and returns what to do now.
    pub fn handle(&mut self, input: Input, now: Now) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::Observed(lease) => {
                // The watch shows the Lease again: the view is whole again.
                // The first observation after an interruption is the fresh
                // watch's list (or the driver's GET while it fails): a read.
                let resumed = std::mem::take(&mut self.watch_interrupted);
                let source = if resumed { Source::Read } else { Source::Event };
                self.observe(lease, now, resumed, source);
            }
            Input::Written(result) => self.written(result, now, &mut actions),
            Input::Read(result) => {
                // Only the answer to our read in flight counts.
                if let Some(Pending::Read { issued_on }) = &self.pending {
                    let issued_on = issued_on.clone();
                    self.pending = None;
                    self.read(result, issued_on, now, &mut actions);
                }
            }
            Input::Tick => {}
            Input::WatchInterrupted => self.watch_interrupted = true,
            Input::Shutdown => self.shut_down(),
            Input::Release { timeout } => {
                self.shut_down();
                if let Some(release) = self.release(now, timeout) {
                    actions.push(Action::Write(release));
                }
            }
            Input::CollectorHealth(healthy) => {
                self.collector_healthy = Some(healthy);
                if healthy {
                    self.released_while_unhealthy = false;
                } else {
                    self.step_down(StopReason::CollectorUnhealthy);
                    self.acquire_at = None;
                }
            }
            Input::CollectorNotRunning => {
                self.collector_healthy = Some(false);
                self.step_down(StopReason::CollectorNotRunning);
                self.acquire_at = None;
            }
            Input::Spread(spread) => self.set_spread(spread),
            Input::StepAside { stand_aside } => {
                self.aside_until = Some(now.instant + stand_aside);
                self.step_down(StopReason::HandoverRequested);
                self.acquire_at = None;
            }
        }
        if self.aside_until.is_some_and(|until| now.instant >= until) {
            // The stand-aside is over: the next attempt is computed afresh.
            self.aside_until = None;
            self.acquire_at = None;
        }
        self.enforce_deadline(now);
        self.successor_turn(now, &mut actions);
        self.next_request(now, &mut actions);
        actions
    }

    /// The facts to publish, as of `now`.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let (leading, term, deadline, valid_until) = match &self.role {
            Role::Leading {
                term,
                deadline,
                valid_until,
                ..
            } => (
                true,
                Some(term.clone()),
                Some(*deadline),
                Some(*valid_until),
            ),
            Role::Following => (false, None, None, None),
        };
        let holder = if leading {
            Some(self.settings.identity.clone())
        } else {
            self.view.as_ref().and_then(|view| view.live_holder(now))
        };
        let own_record = leading
            || (holder.as_deref() == Some(self.settings.identity.as_str())
                && self
                    .view
                    .as_ref()
                    .and_then(|view| view.lease.as_ref())
                    .is_some_and(|lease| self.is_own(&lease.record())));
        Snapshot {
            leading,
            term,
            holder,
            deadline,
            valid_until,
            last_stop: self.last_stop,
            observed: self.view.is_some(),
            collector_healthy: self.collector_healthy,
            successor: self
                .view
                .as_ref()
                .and_then(|view| view.lease.as_ref())
                .and_then(successor::successor_of),
            own_record,
        }
    }

    /// Standing aside after a step-down request ([`Input::StepAside`]).
    fn standing_aside(&self, now: Instant) -> bool {
        self.aside_until.is_some_and(|until| now < until)
    }

    /// Whether the collector may be led for: healthy, or never checked.
    fn collector_healthy(&self) -> bool {
        self.collector_healthy != Some(false)
    }

    // --- role changes ---

    fn start_leading(&mut self, term: TermId, sent_at: Instant, sent_boot: BootInstant) {
        // A rebalance of an earlier term is over.
        self.successor.rebalance_to = None;
        self.role = Role::Leading {
            term,
            deadline: sent_at + self.settings.renew_deadline,
            valid_until: sent_boot.plus(self.settings.renew_deadline),
            renew_at: sent_at + self.settings.retry_period,
        };
        self.acquire_at = None;
    }

    fn shut_down(&mut self) {
        self.shutting_down = true;
        self.step_down(StopReason::Shutdown);
    }

    fn step_down(&mut self, reason: StopReason) {
        if self.is_leading() {
            // The term is over here: no later sight of its acquisition
            // starts it again (its gates may have said it ended).
            for write in &mut self.own_writes {
                write.overtaken = true;
            }
            self.role = Role::Following;
            self.last_stop = Some(reason);
            self.conflict_at = None;
        }
    }

    fn enforce_deadline(&mut self, now: Now) {
        // Either clock may be the first to pass: the boot clock after a
        // suspend, which the monotonic one did not count.
        if let Role::Leading {
            deadline,
            valid_until,
            ..
        } = self.role
            && (now.instant >= deadline || now.boot >= valid_until)
        {
            let reason = if self.renew_unreachable {
                StopReason::ApiUnreachable
            } else {
                StopReason::RenewDeadline
            };
            self.step_down(reason);
        }
    }
}

#[cfg(test)]
mod tests;
