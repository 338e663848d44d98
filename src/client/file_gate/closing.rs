//! When `file-gate` may acknowledge the end of a term: the decision alone,
//! pure (no I/O, no clock), so that it can be tested case by case.
//!
//! Every change the collector must hear of gets the next *change number*: a
//! copy landed, a copy removed, the end of a term (even when its removal
//! found nothing to remove: someone else may have deleted the copy, and the
//! collector still runs what it loaded). A reload POST *covers* the number
//! that was current when it was sent, so its 2xx answer proves that the
//! collector reloaded after every change up to that number — and nothing
//! less proves it: a non-2xx answer, a refused connection or a reload that
//! took longer than its timeout covers nothing.
//!
//! A term is acknowledged only when all three hold: every copy was removed
//! (no removal failed, none written since), a reload covering that removal
//! was answered 2xx, and the term is over for good (the sidecar said it
//! stopped, or this process is exiting and writes nothing more).

/// The term whose copies may still be loaded by the collector, and what is
/// proven about their end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Closing {
    /// The term copies were (or may have been) written for, until its end
    /// is acknowledged.
    open: Option<String>,
    /// Every copy of `open` is gone, as of this change number; `None`
    /// while a copy may be there (leading, or a removal failed).
    removed_at: Option<u64>,
}

// === impl Closing ===

impl Closing {
    /// Leading for `term`: copies may be written, so nothing of it is proven.
    pub(super) fn leading(&mut self, term: &str) {
        if self.open.as_deref() != Some(term) {
            self.open = Some(term.to_owned());
        }
        self.removed_at = None;
    }

    /// After a removal of every copy that failed for none: whether the
    /// collector must be told, as a change of its own — something was
    /// removed (`removed_any`), or the end of the open term was not told yet.
    pub(super) fn needs_reload(&self, removed_any: bool) -> bool {
        removed_any || (self.open.is_some() && self.removed_at.is_none())
    }

    /// Every copy is gone as of change number `change` (the last one).
    pub(super) fn removed(&mut self, change: u64) {
        if self.open.is_some() {
            self.removed_at = Some(change);
        }
    }

    /// A removal failed: a copy may still be there.
    pub(super) fn removal_failed(&mut self) {
        self.removed_at = None;
    }

    /// The term to acknowledge now, if any: its copies are all removed, a
    /// reload covering the removal was answered 2xx (`confirmed`: the
    /// highest change number such a reload covers), and the sidecar said
    /// the term `stopped` — or this process is `exiting`.
    pub(super) fn acknowledgement(
        &self,
        confirmed: u64,
        stopped: Option<&str>,
        exiting: bool,
    ) -> Option<&str> {
        let term = self.open.as_deref()?;
        let removed_at = self.removed_at?;
        let over = exiting || stopped == Some(term);
        (confirmed >= removed_at && over).then_some(term)
    }

    /// The open term was acknowledged: nothing more to say about it.
    pub(super) fn acknowledged(&mut self) {
        *self = Self::default();
    }

    /// The change number as of which every copy of the open term is gone.
    pub(super) fn removed_at(&self) -> Option<u64> {
        self.open.as_ref().and(self.removed_at)
    }

    /// The term still owed an acknowledgement, if any.
    pub(super) fn open(&self) -> Option<&str> {
        self.open.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A term that was led (change 1: its copy landed) and ended (change
    /// 2: the copy removed).
    fn ended() -> Closing {
        let mut closing = Closing::default();
        closing.leading("t1");
        assert!(closing.needs_reload(true));
        closing.removed(2);
        closing
    }

    #[test]
    fn only_a_2xx_reload_sent_after_the_removal_acknowledges() {
        let closing = ended();
        let stopped = Some("t1");
        // Nothing answered 2xx, or only a reload sent before the removal
        // (the one that loaded the copy).
        assert_eq!(closing.acknowledgement(0, stopped, false), None);
        assert_eq!(closing.acknowledgement(1, stopped, false), None);
        // A reload sent after the removal, answered 2xx.
        assert_eq!(closing.acknowledgement(2, stopped, false), Some("t1"));
        assert_eq!(closing.acknowledgement(3, stopped, false), Some("t1"));
    }

    #[test]
    fn a_term_is_acknowledged_once_the_sidecar_said_it_stopped_or_on_exit() {
        let closing = ended();
        assert_eq!(
            closing.acknowledgement(2, None, false),
            None,
            "ran out here"
        );
        assert_eq!(closing.acknowledgement(2, Some("t0"), false), None);
        assert_eq!(closing.acknowledgement(2, None, true), Some("t1"));
        let mut closing = closing;
        closing.acknowledged();
        assert_eq!(
            closing.acknowledgement(9, Some("t1"), true),
            None,
            "said once"
        );
        assert!(!closing.needs_reload(false), "nothing open");
    }

    #[test]
    fn a_failed_removal_or_leading_again_withdraws_the_proof() {
        let mut closing = ended();
        closing.removal_failed();
        assert_eq!(closing.acknowledgement(5, Some("t1"), true), None);
        // Removed on a later try, which the collector must hear of too.
        assert!(closing.needs_reload(true));
        closing.removed(3);
        assert_eq!(closing.acknowledgement(2, Some("t1"), true), None);
        assert_eq!(closing.acknowledgement(3, Some("t1"), true), Some("t1"));
        // The term resumed here (it had only run out): copies again.
        closing.leading("t1");
        assert_eq!(closing.acknowledgement(9, Some("t1"), true), None);
        assert_eq!(closing.open(), Some("t1"));
    }

    #[test]
    fn the_end_of_a_term_is_told_even_when_its_copy_was_already_gone() {
        let mut closing = Closing::default();
        closing.leading("t1");
        // Someone else deleted the copy: the removal finds nothing, but
        // the collector still holds what it loaded.
        assert!(closing.needs_reload(false));
        closing.removed(4);
        assert!(!closing.needs_reload(false), "told once");
        assert_eq!(closing.acknowledgement(3, Some("t1"), false), None);
        assert_eq!(closing.acknowledgement(4, Some("t1"), false), Some("t1"));
        // Nothing was ever led: nothing to tell, nothing to acknowledge.
        let idle = Closing::default();
        assert!(!idle.needs_reload(false));
        assert_eq!(idle.acknowledgement(u64::MAX, None, true), None);
    }
}
