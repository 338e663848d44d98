//! Resuming the term of a previous process of this pod (`--state-dir`): its
//! last stored write, proven by the state directory
//! ([`crate::elector::incarnation`]), is taken as our own — as if this
//! process had sent it and lost the answer. The record must still show that
//! very write (identity, `renewTime`, writer mark) for it to count, and
//! leadership from it ends at its own renew deadline (sent + renew deadline,
//! on the boot clock it was sent on), so nothing is trusted that a renew of
//! the old process could not have claimed.

use super::view::OwnWrite;
use super::{Election, Now, Purpose, Role};
use crate::elector::incarnation::Recorded;
use crate::elector::lease::{Lease, WriterMark};

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
    /// it was written to.
    pub(super) fn confirm_resumed(&mut self, lease: Option<&Lease>) {
        let Some((uid, renew)) = self.resumed.take() else {
            return;
        };
        if lease.and_then(Lease::uid) != Some(uid.as_str()) {
            self.own_writes.retain(|w| w.renew_micros != renew);
        }
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
