//! The Lease as this candidate sees it: the last observation and when its
//! content last changed here (G3), whether an answer is stale (by its
//! source: a watch event older than the view or about a deleted Lease; a
//! list or a GET never is), the standing of the record —
//! free, or held until `observed_at + duration` — and ownership by content
//! (G7): a record is ours only with our identity *and* the `renewTime` of
//! one of our own writes.

use std::time::Duration;

use tokio::time::Instant;

use super::{Election, Now, Purpose, Role, StopReason};
use crate::clock::BootInstant;
use crate::elector::lease::{self, Lease, TermId};

/// How many own writes to remember: enough to recognise a renew whose
/// response was lost even after a few retries.
const OWN_WRITES: usize = 16;
/// How many recent resourceVersions (and deleted uids) to remember, to skip
/// a watch event that repeats what a write response already told us.
const SEEN_VERSIONS: usize = 16;

/// Where an observation comes from: that, not its resourceVersion alone,
/// decides whether it is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// One event of a stream (the watch, a write's response): dropped when
    /// older than what we already have — a late repeat.
    Event,
    /// A read of the server as it is now: the list a fresh watch starts
    /// with, or a GET. Its truth, adopted even with a lower resourceVersion
    /// or a uid we saw deleted: etcd restored from a snapshot without
    /// `--bump-revision` brings the same Lease back at an older revision,
    /// and a view that skipped it would write on a revision that no longer
    /// exists (409, GET, 409, ...) for the life of the process.
    Read,
}

/// Who the Lease belongs to, as judged here.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Standing {
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
pub(super) struct View {
    pub(super) lease: Option<Lease>,
    standing: Standing,
    /// When the record content last changed, on our clock (G3).
    observed_at: Instant,
}

/// A write of ours, remembered to recognise our own records (G7).
#[derive(Clone, Copy, Debug)]
pub(super) struct OwnWrite {
    pub(super) renew_micros: i64,
    pub(super) sent_at: Instant,
    pub(super) sent_boot: BootInstant,
    pub(super) purpose: Purpose,
    /// The `leaseTransitions` it wrote: an acquisition's term (G5).
    pub(super) transitions: i64,
    /// Someone else held the Lease in a record seen after this was sent. A
    /// PUT cannot land after that (its resourceVersion is gone), but a
    /// create can, once that record is deleted — a deletion its holder may
    /// not have seen yet: such a landing starts no term (G7). Also set
    /// when the term it started stepped down: a term never starts twice.
    pub(super) overtaken: bool,
    /// We saw this write stored with our writer mark: a record showing it
    /// with the mark stripped (by a tool that rewrites annotations) is still
    /// ours; an unmarked one we never saw marked may be a twin's (G7).
    pub(super) confirmed: bool,
}

// === impl OwnWrite ===

impl OwnWrite {
    /// The term this write made `lease` (which shows it): the transitions
    /// it wrote, not what the record says now — an edit since may have set
    /// them to an earlier term's value (G5). The uid cannot be edited.
    pub(super) fn term(&self, lease: &Lease) -> TermId {
        TermId::new(lease.uid(), self.transitions)
    }
}

// === impl View ===

impl View {
    /// Until when the record counts as held by someone (G3, G7): one
    /// duration after its content last changed here. `None`: it is free.
    pub(super) fn held_until(&self) -> Option<Instant> {
        match self.standing {
            Standing::Free => None,
            Standing::Held { duration, .. } => Some(self.observed_at + duration),
        }
    }

    /// Free for the taking: never held, or released with the mark.
    pub(super) fn is_free(&self) -> bool {
        self.standing == Standing::Free
    }

    /// From when an acquisition may be attempted (before the spread).
    pub(super) fn free_at(&self) -> Instant {
        self.held_until().unwrap_or(self.observed_at)
    }

    /// The holder to show readers: the one observed, until it expired here.
    pub(super) fn live_holder(&self, now: Instant) -> Option<String> {
        match &self.standing {
            Standing::Held { holder, .. } if self.held_until().is_some_and(|u| now < u) => {
                holder.clone()
            }
            _ => None,
        }
    }
}

// === impl Election ===

impl Election {
    /// A new view of the Lease. `after_gap`: changes may have been missed
    /// since the last one (the watch was interrupted), so an absence seen
    /// again may be a new one (G7 creating).
    pub(super) fn observe(
        &mut self,
        lease: Option<Lease>,
        now: Now,
        after_gap: bool,
        source: Source,
    ) {
        let resumed = if self.view.is_none() {
            self.confirm_resumed(lease.as_ref())
        } else {
            None
        };
        if let Some(lease) = &lease {
            match source {
                Source::Event if self.is_stale(lease) => return,
                Source::Event => {}
                Source::Read => {
                    if self.went_back(lease) {
                        // The server's history went back: the versions we
                        // remember will be given to new writes again.
                        self.seen_versions.clear();
                    }
                    // It exists, whatever we saw deleted before.
                    self.deleted_uids
                        .retain(|d| Some(d.as_str()) != lease.uid());
                }
            }
        }
        // Anything fresh answers a pending 409: the next write builds on it.
        self.conflict_at = None;
        if let Some(lease) = &lease {
            let first = self.view.is_none();
            self.note_writer(&lease.record(), first, now.wall_micros);
        }
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
                let record = new.record();
                view.lease = Some(new);
                // The same spec under another writer's mark is another
                // process's write (G7): no longer ours.
                if self.is_leading() && !self.is_own(&record) {
                    self.step_down(StopReason::LostToOtherHolder);
                }
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
        if let Some(shown) = resumed {
            self.resumed_outcome(shown);
        }
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
        if own.is_none() && view.held_until().is_some() {
            for write in &mut self.own_writes {
                write.overtaken = true;
            }
        }
        let may_lead =
            !self.shutting_down && self.collector_healthy() && !self.standing_aside(now.instant);
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
                    && !write.overtaken
                    && may_lead
                    && now.instant < write.sent_at + self.settings.renew_deadline =>
            {
                // Our acquisition committed though its response was lost.
                let lease = view.lease.as_ref().expect("an own record has a lease");
                self.start_leading(write.term(lease), write.sent_at, write.sent_boot);
            }
            (Role::Following, _) => {}
        }
    }

    pub(super) fn is_own(&self, record: &lease::Record) -> bool {
        self.own_write_of(record).is_some()
    }

    /// The own write `record` shows (G7): our identity, the exact
    /// `renewTime` of one of our writes, and our writer mark — or no mark at
    /// all, if we saw that very write stored with it (someone stripped it
    /// since). Another mark is a twin's write, however equal the rest.
    pub(super) fn own_write_of(&self, record: &lease::Record) -> Option<OwnWrite> {
        if record.holder.as_deref() != Some(self.settings.identity.as_str()) {
            return None;
        }
        let renew = record.renew_micros?;
        let write = self
            .own_writes
            .iter()
            .rev()
            .find(|w| w.renew_micros == renew && w.purpose != Purpose::Release)
            .copied()?;
        match record.writer.as_deref() {
            Some(mark) => (mark == self.writer.as_str()).then_some(write),
            None => write.confirmed.then_some(write),
        }
    }

    /// A record under our identity: confirms our write it shows with our
    /// mark, or counts another process writing under our identity. A foreign
    /// mark counts only on a record written while we run: the one found at
    /// our `first` observation was written before we started — by a previous
    /// incarnation of this pod, after a restart — and proves no twin, nor
    /// does a write under that mark stamped before that observation (a renew
    /// the old process sent just before it died, stored after we listed); a
    /// twin shows itself with its next write (a renew within a retry period,
    /// stamped while we run).
    fn note_writer(&mut self, record: &lease::Record, first: bool, now_wall: i64) {
        if record.holder.as_deref() != Some(self.settings.identity.as_str()) {
            return;
        }
        match record.writer.as_deref() {
            Some(mark) if mark == self.writer.as_str() => {
                for write in &mut self.own_writes {
                    if Some(write.renew_micros) == record.renew_micros {
                        write.confirmed = true;
                    }
                }
            }
            Some(foreign) if first => {
                self.inherited = Some((foreign.to_owned(), now_wall));
            }
            // The inherited record seen again (a relist, an annotation edit),
            // or the old process's last write landing late.
            Some(foreign)
                if self.inherited.as_ref().is_some_and(|(mark, first_seen)| {
                    mark == foreign && record.renew_micros.is_some_and(|r| r <= *first_seen)
                }) => {}
            // Each other process is counted (and told of) once.
            Some(foreign) if !self.foreign_writers.iter().any(|f| f == foreign) => {
                if self.foreign_writers.len() == SEEN_VERSIONS {
                    self.foreign_writers.pop_front();
                }
                self.foreign_writers.push_back(foreign.to_owned());
                self.identity_conflicts += 1;
            }
            Some(_) | None => {}
        }
    }

    /// Older than the view, on the same Lease (same uid): a read showing
    /// this shows that the server's history went back.
    fn went_back(&self, lease: &Lease) -> bool {
        let current = self.view.as_ref().and_then(|v| v.lease.as_ref());
        let (Some(current), Some(new)) = (current, lease.resource_version()) else {
            return false;
        };
        current.uid() == lease.uid()
            && matches!(
                (current.resource_version().map(str::parse::<u64>), new.parse::<u64>()),
                (Some(Ok(current)), Ok(new)) if new < current
            )
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
        // resourceVersions are opaque, but within one object's stream they
        // only grow; compare them when both are numbers (they are, on etcd).
        self.went_back(lease)
    }

    /// The resourceVersion of the Lease as last seen (`None`: absent).
    pub(super) fn current_version(&self) -> Option<String> {
        let lease = self.view.as_ref()?.lease.as_ref()?;
        lease.resource_version().map(str::to_owned)
    }

    fn remember_version(&mut self, rv: &str) {
        if self.seen_versions.len() == SEEN_VERSIONS {
            self.seen_versions.pop_front();
        }
        self.seen_versions.push_back(rv.to_owned());
    }

    /// Remembers a write we send, to recognise its record later.
    pub(super) fn remember_own_write(&mut self, write: OwnWrite) {
        if self.own_writes.len() == OWN_WRITES {
            self.own_writes.pop_front();
        }
        self.own_writes.push_back(write);
    }
}
