//! Resuming the term of a previous process of this pod (`--state-dir`): its
//! last stored write, proven by the state directory
//! ([`crate::elector::incarnation`]), is taken as our own — as if this
//! process had sent it and lost the answer. The record must still show that
//! very write (identity, `renewTime`, writer mark) for it to count, and
//! leadership from it ends at its own renew deadline (sent + renew deadline,
//! on the boot clock it was sent on), so nothing is trusted that a renew of
//! the old process could not have claimed.
//!
//! The first observation decides, and what it decided is kept for the
//! driver to say ([`Election::take_resumption`]): the term resumed, or why
//! the write was not taken ([`Dropped`]).

use super::view::OwnWrite;
use super::{Election, Now, Purpose, Role};
use crate::elector::incarnation::Recorded;
use crate::elector::lease::{Lease, TermId, WriterMark};

/// Why a recorded write was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotResumed {
    /// Its renew deadline passed before this process started.
    TooOld,
    /// The record's writer mark is not one (a damaged file).
    BadMark,
}

impl std::fmt::Display for NotResumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TooOld => "its renew deadline has passed",
            Self::BadMark => "its writer mark is unreadable",
        })
    }
}

/// What the first observation made of a resumed write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resumption {
    /// The Lease shows the write: its term resumed here.
    Resumed(TermId),
    /// The write was not taken.
    Dropped(Dropped),
}

/// Why the first observation did not take a resumed write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// The Lease no longer exists.
    Deleted,
    /// The Lease was deleted and created again since (another uid).
    Recreated,
    /// Another holder, or none (released, or cleared).
    OtherHolder(Option<String>),
    /// This identity, but another `renewTime`: a later write (one the
    /// previous process made after its last record, or a twin's) or an edit.
    OtherRenewTime,
    /// This identity and that `renewTime`, under another writer mark.
    OtherWriter,
    /// The Lease shows the write, but its renew deadline passed before the
    /// Lease was first seen.
    TooOld,
    /// The Lease shows the write, but this process may not lead (shutting
    /// down, or its collector is unhealthy).
    MayNotLead,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Deleted => f.write_str("the lease no longer exists"),
            Self::Recreated => f.write_str("the lease was deleted and created again (another uid)"),
            Self::OtherHolder(Some(holder)) => {
                write!(f, "the lease shows another holder ({holder:?})")
            }
            Self::OtherHolder(None) => {
                f.write_str("the lease shows no holder (released or cleared)")
            }
            Self::OtherRenewTime => f.write_str(
                "the lease shows another renewTime under this identity (a later write, or an edit)",
            ),
            Self::OtherWriter => {
                f.write_str("the lease shows that write under another process's writer mark")
            }
            Self::TooOld => {
                f.write_str("its renew deadline passed before the lease was first seen")
            }
            Self::MayNotLead => f.write_str(
                "this process may not lead now (shutting down, or its collector is unhealthy)",
            ),
        }
    }
}

impl Election {
    /// Takes `previous` as our own write, with its writer mark, unless it
    /// is too old to lead from (its renew deadline passed). Call before the
    /// first input: the first observation drops it again unless the Lease
    /// has the recorded uid (a Lease recreated since is another one).
    pub fn resume(&mut self, previous: &Recorded, now: Now) -> Result<(), NotResumed> {
        let writer = WriterMark::parse(&previous.writer).ok_or(NotResumed::BadMark)?;
        let age = now.boot.saturating_since(previous.sent_boot());
        if age >= self.settings.renew_deadline {
            return Err(NotResumed::TooOld);
        }
        let sent_at = now.instant.checked_sub(age).ok_or(NotResumed::TooOld)?;
        self.writer = writer;
        self.resumed = Some((previous.uid.clone(), previous.renew_micros));
        self.remember_own_write(OwnWrite {
            renew_micros: previous.renew_micros,
            sent_at,
            sent_boot: previous.sent_boot(),
            purpose: Purpose::Acquire,
            transitions: previous.transitions,
            overtaken: false,
            confirmed: true,
        });
        Ok(())
    }

    /// At the first observation: a resumed write counts only on the Lease
    /// it was written to. What the record shows of it, if one was resumed
    /// (`Ok`: the write itself); see [`Self::resumed_outcome`].
    pub(super) fn confirm_resumed(&mut self, lease: Option<&Lease>) -> Option<Result<(), Dropped>> {
        let (uid, renew) = self.resumed.take()?;
        let dropped = match lease {
            None => Some(Dropped::Deleted),
            Some(lease) if lease.uid() != Some(uid.as_str()) => Some(Dropped::Recreated),
            Some(_) => None,
        };
        if let Some(dropped) = dropped {
            self.own_writes.retain(|w| w.renew_micros != renew);
            return Some(Err(dropped));
        }
        let record = lease?.record();
        Some(
            if record.holder.as_deref() != Some(self.settings.identity.as_str()) {
                Err(Dropped::OtherHolder(record.holder))
            } else if record.renew_micros != Some(renew) {
                Err(Dropped::OtherRenewTime)
            } else if record
                .writer
                .is_some_and(|mark| mark != self.writer.as_str())
            {
                Err(Dropped::OtherWriter)
            } else {
                Ok(())
            },
        )
    }

    /// Once the first observation was judged: what became of the resumed
    /// write, kept for the driver to say.
    pub(super) fn resumed_outcome(&mut self, shown: Result<(), Dropped>) {
        self.resumption = Some(match (shown, &self.role) {
            (Err(dropped), _) => Resumption::Dropped(dropped),
            (Ok(()), Role::Leading { term, .. }) => Resumption::Resumed(term.clone()),
            (Ok(()), Role::Following) if self.shutting_down || !self.collector_healthy() => {
                Resumption::Dropped(Dropped::MayNotLead)
            }
            (Ok(()), Role::Following) => Resumption::Dropped(Dropped::TooOld),
        });
    }

    /// What the first observation made of the write resumed (if one was),
    /// once: for the driver to say (the machine does no I/O).
    pub fn take_resumption(&mut self) -> Option<Resumption> {
        self.resumption.take()
    }

    /// While leading: the stored write the Lease shows, for the state
    /// directory (what a restarted process of this pod may resume).
    pub fn resumable(&self) -> Option<Recorded> {
        let Role::Leading { term, .. } = &self.role else {
            return None;
        };
        let lease: &Lease = self.view.as_ref()?.lease.as_ref()?;
        let write = self.own_write_of(&lease.record())?;
        // The term the write belongs to is the one we lead.
        if write.term(lease) != *term {
            return None;
        }
        Some(Recorded {
            identity: self.settings.identity.clone(),
            namespace: self.settings.namespace.clone(),
            lease: self.settings.lease_name.clone(),
            uid: lease.uid()?.to_owned(),
            writer: self.writer.as_str().to_owned(),
            renew_micros: write.renew_micros,
            transitions: write.transitions,
            sent_boot_ms: write.sent_boot.as_millis(),
        })
    }
}
