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
//! - G7: a record is ours only with our identity *and* the `renewTime` of one
//!   of our own writes; a deleted Lease or an unmarked cleared holder counts
//!   as held by the last holder for one more duration.
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

use std::collections::VecDeque;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::time::Instant;

use crate::api_error::ApiError;
use crate::clock::BootInstant;
use crate::lease::{self, Lease, TermId};

/// Static settings of one candidate.
#[derive(Clone, Debug)]
pub struct Settings {
    pub identity: String,
    pub namespace: String,
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
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
    /// The collector passes (`true`) or fails its health check. Before the
    /// first of these the collector counts as healthy (no check configured).
    CollectorHealth(bool),
}

/// What the driver must do.
#[derive(Debug, PartialEq)]
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
#[derive(Debug, PartialEq)]
pub struct Write {
    pub purpose: Purpose,
    /// `Create` when the Lease is absent (POST), else a PUT of this object,
    /// which carries the resourceVersion it was built from.
    pub op: WriteOp,
    pub timeout: Duration,
}

#[derive(Debug, PartialEq)]
pub enum WriteOp {
    Create(Box<DynamicObject>),
    Replace(Box<DynamicObject>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Acquire,
    Renew,
    Release,
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
}

/// Who the Lease belongs to, as judged here.
#[derive(Clone, Debug, PartialEq)]
enum Standing {
    /// Absent since we first looked, or released with the mark of G6.
    Free,
    /// Claimed by `holder` (possibly only the last one seen, after a delete or
    /// unmarked clear) until `observed_at + duration` — or ours.
    Held {
        holder: Option<String>,
        renew_micros: Option<i64>,
        duration: Duration,
    },
}

/// The last observation of the Lease.
#[derive(Clone, Debug)]
struct View {
    lease: Option<Lease>,
    standing: Standing,
    /// When the record content last changed, on our clock (G3).
    observed_at: Instant,
}

/// A write of ours, remembered to recognise our own records (G7).
#[derive(Clone, Copy, Debug)]
struct OwnWrite {
    renew_micros: i64,
    sent_at: Instant,
    sent_boot: BootInstant,
    purpose: Purpose,
}

/// The request in flight, at most one.
#[derive(Clone, Debug)]
enum Pending {
    Write {
        purpose: Purpose,
        sent_at: Instant,
        sent_boot: BootInstant,
        base_rv: Option<String>,
    },
    Read {
        /// The resourceVersion known when the read was sent.
        issued_on: Option<String>,
    },
}

/// How many own writes to remember: enough to recognise a renew whose
/// response was lost even after a few retries.
const OWN_WRITES: usize = 16;
/// How many recent resourceVersions to remember, to skip a watch event that
/// repeats what a write response already told us.
const SEEN_VERSIONS: usize = 16;

/// The election of one candidate.
#[derive(Debug)]
pub struct Election {
    settings: Settings,
    rng: fastrand::Rng,
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
}

// === impl Election ===

impl Election {
    pub fn new(settings: Settings, seed: u64) -> Self {
        Self {
            settings,
            rng: fastrand::Rng::with_seed(seed),
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
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
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
                let resumed = std::mem::take(&mut self.watch_interrupted);
                self.observe(lease, now, resumed);
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
            Input::Shutdown => {
                self.shutting_down = true;
                self.step_down(StopReason::Shutdown);
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
        }
        self.enforce_deadline(now);
        self.next_request(now, &mut actions);
        actions
    }

    /// The release write of G6, if the Lease is still ours; `None` otherwise.
    /// Call after [`Input::Shutdown`] once nothing is in flight. (While the
    /// collector is unhealthy the machine asks for it itself.)
    pub fn release(&mut self, now: Now, timeout: Duration) -> Option<Write> {
        if self.is_leading() || self.pending.is_some() {
            return None;
        }
        let lease = self.view.as_ref()?.lease.as_ref()?;
        if !self.is_own(&lease.record()) {
            return None;
        }
        let object = lease.released();
        self.pending = Some(Pending::Write {
            purpose: Purpose::Release,
            sent_at: now.instant,
            sent_boot: now.boot,
            base_rv: lease.resource_version().map(str::to_owned),
        });
        Some(Write {
            purpose: Purpose::Release,
            op: WriteOp::Replace(Box::new(object)),
            timeout,
        })
    }

    /// The earliest instant after `handled` (the instant of the last input)
    /// at which a [`Input::Tick`] may change something. Whatever was due at
    /// `handled` has been done then, or waits for the request in flight.
    pub fn next_wakeup(&self, handled: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        let mut at = |i: Instant| {
            if i > handled {
                wake = Some(wake.map_or(i, |w| w.min(i)));
            }
        };
        if let Role::Leading {
            deadline, renew_at, ..
        } = self.role
        {
            at(deadline);
            if self.pending.is_none() && self.conflict_at.is_none() {
                at(self.not_before.map_or(renew_at, |nb| nb.max(renew_at)));
            }
        }
        if let Some(conflict_at) = self.conflict_at {
            at(conflict_at + self.settings.retry_period);
        }
        if let Some(not_before) = self.not_before {
            at(not_before);
        }
        if let Some((_, attempt)) = self.acquire_at {
            at(self.not_before.map_or(attempt, |nb| nb.max(attempt)));
        }
        if let Some(view) = &self.view {
            // The holder shown to readers changes at expiry.
            if let Standing::Held { duration, .. } = view.standing {
                at(view.observed_at + duration);
            }
        }
        wake
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
            self.view.as_ref().and_then(|view| match &view.standing {
                Standing::Held {
                    holder, duration, ..
                } if now < view.observed_at + *duration => holder.clone(),
                _ => None,
            })
        };
        Snapshot {
            leading,
            term,
            holder,
            deadline,
            valid_until,
            last_stop: self.last_stop,
            observed: self.view.is_some(),
            collector_healthy: self.collector_healthy,
        }
    }

    /// Whether the collector may be led for: healthy, or never checked.
    fn collector_healthy(&self) -> bool {
        self.collector_healthy != Some(false)
    }

    // --- observations ---

    /// A new view of the Lease. `after_gap`: changes may have been missed
    /// since the last one (the watch was interrupted), so an absence seen
    /// again may be a new one (G7 creating).
    fn observe(&mut self, lease: Option<Lease>, now: Now, after_gap: bool) {
        if let Some(lease) = &lease
            && self.is_stale(lease)
        {
            return;
        }
        // Anything fresh answers a pending 409: the next write builds on it.
        self.conflict_at = None;
        if let Some(rv) = lease.as_ref().and_then(Lease::resource_version) {
            self.remember_version(rv);
        }
        if lease.is_none()
            && let Some(uid) = self.view.as_ref().and_then(|v| v.lease.as_ref()?.uid())
        {
            if self.deleted_uids.len() == SEEN_VERSIONS {
                self.deleted_uids.pop_front();
            }
            self.deleted_uids.push_back(uid.to_owned());
        }
        let changed = match (&self.view, &lease) {
            (None, _) => true,
            (Some(view), Some(new)) => {
                view.lease.as_ref().map(Lease::content) != Some(new.content())
            }
            (Some(view), None) => view.lease.is_some() || after_gap,
        };
        if !changed {
            // Same record (a label edit, a repeated event): keep the newer
            // object to write from, but not a new expiry clock (G3).
            if let (Some(view), Some(new)) = (&mut self.view, lease) {
                view.lease = Some(new);
            }
            return;
        }
        let standing = self.standing_of(lease.as_ref(), after_gap);
        if let Standing::Held {
            holder: Some(holder),
            ..
        } = &standing
        {
            self.last_holder = Some(holder.clone());
        }
        if standing == Standing::Free {
            self.last_holder = None;
        }
        self.view = Some(View {
            lease,
            standing,
            observed_at: now.instant,
        });
        self.acquire_at = None;
        self.judge_ownership(now);
    }

    /// How a newly observed record stands (G7).
    fn standing_of(&self, lease: Option<&Lease>, after_gap: bool) -> Standing {
        let local = self.settings.lease_duration;
        match lease {
            Some(lease) if lease.is_marked_released() => Standing::Free,
            Some(lease) => {
                let record = lease.record();
                Standing::Held {
                    holder: record.holder.clone().or_else(|| self.last_holder.clone()),
                    renew_micros: record.renew_micros,
                    duration: record.duration.map_or(local, |d| d.max(local)),
                }
            }
            // Absent: free if it never existed as far as we know, else held by
            // the last holder for one more duration — also when we cannot
            // know, because changes may have been missed meanwhile.
            None => match &self.view {
                None => Standing::Free,
                Some(view) => match &view.standing {
                    Standing::Free if !after_gap => Standing::Free,
                    Standing::Free => Standing::Held {
                        holder: self.last_holder.clone(),
                        renew_micros: None,
                        duration: local,
                    },
                    Standing::Held { duration, .. } => Standing::Held {
                        holder: self.last_holder.clone(),
                        renew_micros: None,
                        duration: *duration,
                    },
                },
            },
        }
    }

    /// After an observation: step down if the record is no longer ours, take
    /// credit for an own write whose response was lost.
    fn judge_ownership(&mut self, now: Now) {
        let Some(view) = &self.view else { return };
        let record = view.lease.as_ref().map(Lease::record);
        let own = record.as_ref().and_then(|r| self.own_write_of(r));
        let may_lead = !self.shutting_down && self.collector_healthy();
        match (&mut self.role, own) {
            (
                Role::Leading {
                    deadline,
                    valid_until,
                    renew_at,
                    ..
                },
                Some(write),
            ) => {
                // Still ours; a write we had no answer for counts from when it was sent.
                *deadline = (*deadline).max(write.sent_at + self.settings.renew_deadline);
                *valid_until =
                    (*valid_until).max(write.sent_boot.plus(self.settings.renew_deadline));
                *renew_at = (*renew_at).max(write.sent_at + self.settings.retry_period);
                if write.purpose == Purpose::Renew {
                    self.not_before = None;
                }
            }
            (Role::Leading { .. }, None) => {
                let reason = match record {
                    None => StopReason::LeaseDeleted,
                    Some(r) if r.holder.is_none() => StopReason::HolderCleared,
                    Some(_) => StopReason::LostToOtherHolder,
                };
                self.step_down(reason);
            }
            (Role::Following, Some(write))
                if write.purpose == Purpose::Acquire
                    && may_lead
                    && now.instant < write.sent_at + self.settings.renew_deadline =>
            {
                // Our acquisition committed though its response was lost.
                let lease = view.lease.as_ref().expect("an own record has a lease");
                self.start_leading(lease.term_id(), write.sent_at, write.sent_boot);
            }
            (Role::Following, _) => {}
        }
    }

    fn is_own(&self, record: &lease::Record) -> bool {
        self.own_write_of(record).is_some()
    }

    fn own_write_of(&self, record: &lease::Record) -> Option<OwnWrite> {
        if record.holder.as_deref() != Some(self.settings.identity.as_str()) {
            return None;
        }
        let renew = record.renew_micros?;
        self.own_writes
            .iter()
            .rev()
            .find(|w| w.renew_micros == renew && w.purpose != Purpose::Release)
            .copied()
    }

    /// A watch event older than what a write response already showed.
    fn is_stale(&self, lease: &Lease) -> bool {
        let Some(rv) = lease.resource_version() else {
            return false;
        };
        if self.seen_versions.iter().any(|seen| seen == rv) {
            return true;
        }
        if lease
            .uid()
            .is_some_and(|uid| self.deleted_uids.iter().any(|d| d == uid))
        {
            return true;
        }
        // resourceVersions are opaque, but within one object they only grow;
        // compare them when both are numbers (they are, on etcd).
        let current = self.view.as_ref().and_then(|v| v.lease.as_ref());
        match current {
            Some(current) if current.uid() == lease.uid() => {
                match (
                    current.resource_version().map(str::parse::<u64>),
                    rv.parse::<u64>(),
                ) {
                    (Some(Ok(current)), Ok(new)) => new < current,
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// The answer to a fallback read sent when the version was `issued_on`.
    fn read(
        &mut self,
        result: Result<Option<Lease>, ApiError>,
        issued_on: Option<String>,
        now: Now,
        actions: &mut Vec<Action>,
    ) {
        match result {
            // The watch showed something newer while the read was in flight
            // (e.g. a recreated Lease): the answer is older than what we
            // know, and a 404 in it would mark the live Lease as deleted (G1).
            Ok(_) if self.current_version() != issued_on => self.conflict_at = None,
            Ok(lease) => {
                self.conflict_at = None;
                self.observe(lease, now, self.watch_interrupted);
            }
            Err(error) => self.failed(&error, now, actions),
        }
    }

    /// The resourceVersion of the Lease as last seen (`None`: absent).
    fn current_version(&self) -> Option<String> {
        let lease = self.view.as_ref()?.lease.as_ref()?;
        lease.resource_version().map(str::to_owned)
    }

    fn remember_version(&mut self, rv: &str) {
        if self.seen_versions.len() == SEEN_VERSIONS {
            self.seen_versions.pop_front();
        }
        self.seen_versions.push_back(rv.to_owned());
    }

    // --- write and read results ---

    fn written(&mut self, result: Result<Lease, ApiError>, now: Now, actions: &mut Vec<Action>) {
        let Some(Pending::Write {
            purpose,
            sent_at,
            sent_boot,
            base_rv,
        }) = self.pending.take()
        else {
            return;
        };
        match result {
            // A PUT that changed nothing keeps the resourceVersion: it proves
            // nothing about our claim (G4).
            Ok(lease) if base_rv.is_some() && lease.resource_version() == base_rv.as_deref() => {
                self.failures += 1;
                self.not_before = Some(now.instant + self.settings.retry_period);
            }
            Ok(lease) => {
                self.failures = 0;
                self.not_before = None;
                self.renew_unreachable = false;
                self.observe(Some(lease), now, false);
                // The response may be older than what the watch already showed
                // (another holder, a deletion): it counts only if the record
                // we now hold is still this very write.
                let current = self.view.as_ref().and_then(|v| v.lease.as_ref());
                let this_write = current
                    .and_then(|lease| self.own_write_of(&lease.record()))
                    .is_some_and(|w| w.sent_at == sent_at);
                if !this_write {
                    return;
                }
                let term = current
                    .map(Lease::term_id)
                    .expect("an own record has a lease");
                match purpose {
                    Purpose::Acquire
                        if !self.shutting_down
                            && self.collector_healthy()
                            && !self.is_leading() =>
                    {
                        self.start_leading(term, sent_at, sent_boot);
                    }
                    Purpose::Renew => {
                        if let Role::Leading {
                            deadline,
                            valid_until,
                            renew_at,
                            ..
                        } = &mut self.role
                        {
                            *deadline = (*deadline).max(sent_at + self.settings.renew_deadline);
                            *valid_until =
                                (*valid_until).max(sent_boot.plus(self.settings.renew_deadline));
                            *renew_at = sent_at + self.settings.retry_period;
                        }
                    }
                    _ => {}
                }
            }
            Err(error) => {
                match (&error, purpose) {
                    (ApiError::Forbidden(_), Purpose::Renew) => {
                        self.step_down(StopReason::Forbidden);
                    }
                    (ApiError::NotFound, Purpose::Renew) => {
                        self.step_down(StopReason::LeaseDeleted);
                    }
                    _ => {}
                }
                if purpose == Purpose::Renew {
                    self.renew_unreachable = error.is_unreachable();
                }
                let current_rv = self
                    .view
                    .as_ref()
                    .and_then(|v| v.lease.as_ref())
                    .and_then(Lease::resource_version);
                let explained = matches!(error, ApiError::Conflict(_) | ApiError::NotFound)
                    && current_rv != base_rv.as_deref();
                if !explained {
                    // Otherwise the watch already showed what changed: act on it now.
                    self.failed(&error, now, actions);
                }
            }
        }
    }

    /// What an error means for the next attempt.
    fn failed(&mut self, error: &ApiError, now: Now, actions: &mut Vec<Action>) {
        let retry = self.settings.retry_period;
        match error {
            // Someone else wrote: the watch will say what (DESIGN "Contention").
            ApiError::Conflict(_) | ApiError::NotFound => {
                self.conflict_at = Some(now.instant);
            }
            ApiError::TooManyRequests { retry_after } => {
                // A server may ask for anything; a candidate that waited
                // longer than a lease duration would miss whole terms.
                let wait = retry_after
                    .unwrap_or(retry)
                    .min(self.settings.lease_duration);
                let mut at = now.instant + wait;
                if let Some(deadline) = self.lead_deadline() {
                    // Honour Retry-After, but keep one last try before the
                    // deadline — one, not one per 429 once it has come.
                    let last_chance = deadline.checked_sub(retry / 2).unwrap_or(now.instant);
                    if now.instant < last_chance {
                        at = at.min(last_chance);
                    }
                }
                self.not_before = Some(at);
            }
            ApiError::Unauthorized => {
                actions.push(Action::ReloadCredentials);
                self.backoff(now);
            }
            _ => self.backoff(now),
        }
    }

    /// Exponential backoff from the retry period up to the lease duration,
    /// with jitter so candidates spread out.
    fn backoff(&mut self, now: Now) {
        self.failures = self.failures.saturating_add(1);
        if self.is_leading() {
            // A leader retries every retry period until its deadline.
            self.not_before = Some(now.instant + self.settings.retry_period);
            return;
        }
        let base = self.settings.retry_period;
        let exp = base.saturating_mul(1 << self.failures.min(8).saturating_sub(1));
        let capped = exp.min(self.settings.lease_duration);
        let jitter = capped.mul_f64(self.rng.f64() * 0.2);
        self.not_before = Some(now.instant + capped + jitter);
    }

    // --- role changes ---

    fn start_leading(&mut self, term: TermId, sent_at: Instant, sent_boot: BootInstant) {
        self.role = Role::Leading {
            term,
            deadline: sent_at + self.settings.renew_deadline,
            valid_until: sent_boot.plus(self.settings.renew_deadline),
            renew_at: sent_at + self.settings.retry_period,
        };
        self.acquire_at = None;
    }

    fn step_down(&mut self, reason: StopReason) {
        if self.is_leading() {
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

    // --- the next request ---

    fn next_request(&mut self, now: Now, actions: &mut Vec<Action>) {
        if self.pending.is_some() || self.shutting_down || self.view.is_none() {
            return;
        }
        if self.not_before.is_some_and(|nb| now.instant < nb) {
            return;
        }
        if let Some(conflict_at) = self.conflict_at {
            // The watch normally answers a 409 within milliseconds; a read is
            // the fallback for a watch that stays silent.
            if now.instant >= conflict_at + self.settings.retry_period {
                self.conflict_at = Some(now.instant);
                self.pending = Some(Pending::Read {
                    issued_on: self.current_version(),
                });
                actions.push(Action::Read {
                    timeout: self.request_timeout(now.instant),
                });
            }
            return;
        }
        if !self.collector_healthy() {
            // No acquisition for an unhealthy collector; our own record (a
            // term just ended, or an acquisition that landed meanwhile) is
            // released once, with the mark, so a healthy peer takes it now.
            if !self.released_while_unhealthy {
                let timeout = self.request_timeout(now.instant);
                if let Some(release) = self.release(now, timeout) {
                    self.released_while_unhealthy = true;
                    actions.push(Action::Write(release));
                }
            }
            return;
        }
        let Some(view) = &self.view else { return };
        match &self.role {
            Role::Leading { renew_at, .. } => {
                if now.instant >= *renew_at
                    && let Some(lease) = view.lease.clone()
                {
                    let write = self.write(Purpose::Renew, &lease, now);
                    actions.push(Action::Write(write));
                }
            }
            Role::Following => {
                let free_at = match &view.standing {
                    Standing::Free => view.observed_at,
                    Standing::Held { duration, .. } => view.observed_at + *duration,
                };
                let attempt = match self.acquire_at {
                    Some((expiry, attempt)) if expiry == free_at => attempt,
                    _ => {
                        // Spread the herd at each expiry or release.
                        let spread = self.settings.retry_period.mul_f64(self.rng.f64() * 0.5);
                        let attempt = free_at.max(now.instant) + spread;
                        self.acquire_at = Some((free_at, attempt));
                        attempt
                    }
                };
                if now.instant >= attempt {
                    if view.lease.is_none() && self.watch_interrupted {
                        // A POST from a view the watch no longer confirms
                        // could pass on an ABA (G7 creating): wait for it.
                        return;
                    }
                    self.acquire_at = None;
                    let lease = view.lease.clone();
                    let write = match lease {
                        Some(lease) => self.write(Purpose::Acquire, &lease, now),
                        None => self.create(now),
                    };
                    actions.push(Action::Write(write));
                }
            }
        }
    }

    /// A request may take no longer than the time left to the next deadline.
    fn request_timeout(&self, now: Instant) -> Duration {
        let limit = self.settings.renew_deadline / 2;
        match self.lead_deadline() {
            Some(deadline) => limit.min(deadline.saturating_duration_since(now)),
            None => limit,
        }
    }

    fn write(&mut self, purpose: Purpose, lease: &Lease, now: Now) -> Write {
        let micros = self.next_renew_micros(now);
        let object = match purpose {
            Purpose::Acquire => lease.acquired(
                &self.settings.identity,
                micros,
                self.settings.lease_duration,
            ),
            Purpose::Renew => lease.renewed(micros),
            Purpose::Release => lease.released(),
        };
        self.sent(
            purpose,
            micros,
            now,
            lease.resource_version().map(str::to_owned),
        );
        Write {
            purpose,
            op: WriteOp::Replace(Box::new(object)),
            timeout: self.request_timeout(now.instant),
        }
    }

    fn create(&mut self, now: Now) -> Write {
        let micros = self.next_renew_micros(now);
        let s = &self.settings;
        let object = lease::created(
            &s.namespace,
            &s.lease_name,
            &s.identity,
            micros,
            s.lease_duration,
        );
        self.sent(Purpose::Acquire, micros, now, None);
        Write {
            purpose: Purpose::Acquire,
            op: WriteOp::Create(Box::new(object)),
            timeout: self.request_timeout(now.instant),
        }
    }

    fn sent(&mut self, purpose: Purpose, renew_micros: i64, now: Now, base_rv: Option<String>) {
        if self.own_writes.len() == OWN_WRITES {
            self.own_writes.pop_front();
        }
        self.own_writes.push_back(OwnWrite {
            renew_micros,
            sent_at: now.instant,
            sent_boot: now.boot,
            purpose,
        });
        self.pending = Some(Pending::Write {
            purpose,
            sent_at: now.instant,
            sent_boot: now.boot,
            base_rv,
        });
    }

    /// Every write gets a distinct `renewTime`, so each is recognisable (G7).
    fn next_renew_micros(&self, now: Now) -> i64 {
        let last = self.own_writes.back().map_or(i64::MIN, |w| w.renew_micros);
        now.wall_micros.max(last + 1)
    }
}

#[cfg(test)]
mod tests;
