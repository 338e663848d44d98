//! Spreading a group of Leases over its pods: one process elected for
//! several Leases at once, each by its own [`Election`], is told what it
//! holds of the others ([`Spread`]), and that changes three things only —
//! never what makes a write safe:
//!
//! - **who claims**: only a pod that holds none of the other Leases claims a
//!   successor slot, and a named successor that comes to hold one clears its
//!   name, so a crashed holder's Lease goes to a pod that held none;
//! - **how soon a free Lease is taken**: a pod waits one tier
//!   ([`tier_delay`]) more for each other Lease it holds, so pods holding
//!   fewer go first, and with fewer pods than Leases every Lease is still
//!   taken, one tier later per Lease the taker holds;
//! - **when a Lease is given up**: a pod holding more than one hands one
//!   of them over at a time ([`Spread::surplus`]: the last it holds, gates
//!   closed first, as for a hand-over request) to the successor named in
//!   it, who by the first rule held nothing when it claimed — and only
//!   while that successor is not, as this pod observes its group, the
//!   holder of another of its Leases or the successor named in one of them
//!   that is free: a pod holding none may claim the slots of several Leases
//!   of one holder at once, and must get one of them, not all.
//!
//! A Lease counts as held while this process leads it, or steps down from a
//! term it led until its release ([`Held::own_record`]) — never merely
//! because its record names this identity: a previous process of this pod
//! that died wrote that one, and leads nothing now.
//!
//! Every rebalancing step moves one surplus Lease to a pod that held none,
//! with the successor's claim, the release and the acquisition: O(1)
//! writes, and never a herd.
//!
//! `src/serve/spreading.rs` drives it: a coordinator computes [`spread_of`]
//! and tells each [`Election`] (`Input::Spread`) what the process holds and
//! whether this Lease is surplus; a surplus Lease's leader steps down with
//! `StopReason::Rebalance` through the hand-over path. The group simulation
//! (`machine/tests/spread_group.rs`: pods with an [`Election`] per Lease against a
//! CAS model server, gate lags of 0, 1 or 4 s, random crashes and joins)
//! shows no Lease ever with two leaders; within 90 s of the last change
//! every Lease led and, with at least as many pods as Leases, no pod leading
//! two, and staying so; a pod joining one that holds two of three Leases
//! taking one within 4 s (claim window 4 s) with 5 writes beside the
//! renews; one joining a pod holding all three (gate lag 4 s) taking
//! exactly one, for 40 seeds.

use std::time::Duration;

use super::Election;

/// What this process holds of its group's other Leases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spread {
    /// How many of the other Leases this process leads.
    pub held_elsewhere: usize,
    /// This process leads this Lease and another it keeps: it should give
    /// this one to a pod that holds none.
    pub surplus: bool,
}

/// One Lease of a group as this process observes it (its published state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held<'a> {
    /// This process leads it.
    pub leading: bool,
    /// The live holder of its record (this process's identity also while it
    /// steps down, until its release — and when a previous process of this
    /// pod, or a twin, wrote it).
    pub holder: Option<&'a str>,
    /// Its live record is one of this process's own writes: it leads, or
    /// steps down from a term it led, until its release
    /// ([`super::Snapshot::own_record`]).
    pub own_record: bool,
    /// The successor named in it.
    pub successor: Option<&'a str>,
}

/// What each Lease of a group is told, given what this process (`me`)
/// observes of each: every Lease it holds (leads, or whose record is still
/// its own write, stepping down) counts for the others — not one whose
/// record merely names it, written by a process before it that died (its
/// term not resumed: this process leads nothing there); the first one held is
/// kept, and while it holds more, the last one held is surplus once its
/// named successor is free — neither the holder of another of these Leases
/// nor the successor named in one that is free (about to take it).
pub fn spread_of(leases: &[Held<'_>], me: &str) -> Vec<Spread> {
    let holds = |l: &Held<'_>| l.leading || l.own_record;
    let held = leases.iter().filter(|l| holds(l)).count();
    let kept = leases.iter().position(holds);
    let given_up = leases
        .iter()
        .rposition(holds)
        .filter(|&i| held > 1 && kept != Some(i));
    // Whom another Lease has, or is about to have.
    let taken = |i: usize, who: &str| {
        leases.iter().enumerate().any(|(j, l)| {
            j != i && (l.holder == Some(who) || (l.holder.is_none() && l.successor == Some(who)))
        })
    };
    leases
        .iter()
        .enumerate()
        .map(|(i, lease)| Spread {
            held_elsewhere: held - usize::from(holds(lease)),
            surplus: given_up == Some(i)
                && lease.successor.is_some_and(|s| s != me && !taken(i, s)),
        })
        .collect()
}

/// The extra wait before taking a free Lease, per other Lease held: two
/// retry periods, longer than the latest attempt of a pod that holds none
/// (a fallback for a successor that is gone: 1.5 retry periods), so its
/// acquisition reaches the others on the watch before they try.
pub(super) fn tier_delay(retry_period: Duration, held_elsewhere: usize) -> Duration {
    let tiers = u32::try_from(held_elsewhere).unwrap_or(u32::MAX);
    (retry_period * 2).saturating_mul(tiers)
}

// === impl Election ===

impl Election {
    /// [`super::Input::Spread`].
    pub(super) fn set_spread(&mut self, spread: Spread) {
        if spread != self.spread {
            // The attempt's tier may have changed: judge it again.
            self.acquire_at = None;
            self.spread = spread;
        }
    }

    /// Holding another Lease, this pod stands back from the successor slot.
    pub(super) fn holds_elsewhere(&self) -> bool {
        self.spread.held_elsewhere > 0
    }

    /// Leading a surplus Lease: the successor named in it, if any other.
    pub(super) fn rebalance_target(&self, named: Option<&str>) -> Option<String> {
        let me = self.settings.identity.as_str();
        named
            .filter(|s| self.spread.surplus && *s != me)
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(successor: Option<&'static str>) -> Held<'static> {
        Held {
            leading: true,
            holder: Some("me"),
            successor,
            own_record: true,
        }
    }

    fn other(holder: Option<&'static str>, successor: Option<&'static str>) -> Held<'static> {
        Held {
            leading: false,
            holder,
            successor,
            own_record: false,
        }
    }

    fn surplus(spread: &[Spread]) -> Vec<bool> {
        spread.iter().map(|s| s.surplus).collect()
    }

    #[test]
    fn the_first_lease_held_is_kept_and_every_lease_held_counts_for_the_others() {
        assert_eq!(
            spread_of(&[other(None, None), other(Some("b"), None)], "me"),
            vec![Spread::default(); 2]
        );
        let spread = spread_of(
            &[
                other(Some("b"), None),
                led(Some("c")),
                other(None, None),
                led(Some("d")),
            ],
            "me",
        );
        let held: Vec<usize> = spread.iter().map(|s| s.held_elsewhere).collect();
        assert_eq!(held, [2, 1, 2, 1]);
        assert_eq!(surplus(&spread), [false, false, false, true]);
        assert_eq!(spread_of(&[led(Some("c"))], "me"), vec![Spread::default()]);
        // No successor named, or ourselves: nothing to hand it to yet.
        assert_eq!(
            surplus(&spread_of(&[led(None), led(None)], "me")),
            [false, false]
        );
        assert_eq!(
            surplus(&spread_of(&[led(None), led(Some("me"))], "me")),
            [false, false]
        );
    }

    #[test]
    fn one_lease_is_given_up_at_a_time_and_never_to_a_pod_another_has() {
        // Three held, two slots claimed by one pod holding none: only the
        // last Lease goes, to it.
        let spread = spread_of(&[led(Some("b")), led(Some("b")), led(Some("b"))], "me");
        assert_eq!(surplus(&spread), [false, false, true]);
        // Stepping down (not leading, the record still ours): still held, so
        // the next one waits, and no tier is lost.
        let stepping_down = Held {
            leading: false,
            holder: Some("me"),
            successor: Some("b"),
            own_record: true,
        };
        let spread = spread_of(&[led(Some("b")), led(Some("b")), stepping_down], "me");
        assert_eq!(surplus(&spread), [false, false, true]);
        assert_eq!(spread[0].held_elsewhere, 2);
        // Released, b named in it and about to take it: b is not free.
        let released = other(None, Some("b"));
        let spread = spread_of(&[led(Some("b")), led(Some("b")), released], "me");
        assert_eq!(surplus(&spread), [false, false, false]);
        // b took it: still not free; a pod that holds none is.
        let taken = other(Some("b"), Some("c"));
        assert_eq!(
            surplus(&spread_of(&[led(Some("b")), led(Some("b")), taken], "me")),
            [false, false, false]
        );
        assert_eq!(
            surplus(&spread_of(&[led(Some("b")), led(Some("d")), taken], "me")),
            [false, true, false]
        );
    }

    #[test]
    fn a_record_naming_me_that_a_dead_process_wrote_is_not_held() {
        // Restarted without resuming: Lease 0 still names this identity in
        // the record its previous process wrote (live until it expires);
        // this process leads Lease 1.
        let dead = other(Some("me"), Some("c"));
        let spread = spread_of(&[dead, led(Some("c"))], "me");
        // It holds one Lease, the one it leads: nothing to give up (the
        // record of the dead process made it hand over the Lease it leads).
        let held: Vec<usize> = spread.iter().map(|s| s.held_elsewhere).collect();
        assert_eq!(held, [1, 0]);
        assert_eq!(surplus(&spread), [false, false]);
        // Leading nothing, it stands for a successor slot anywhere.
        assert_eq!(
            spread_of(&[dead, other(Some("b"), None)], "me"),
            vec![Spread::default(); 2]
        );
        // Only the term it led itself, stepping down, still counts.
        let stepping_down = Held {
            own_record: true,
            ..dead
        };
        let spread = spread_of(&[stepping_down, led(Some("c"))], "me");
        assert_eq!(surplus(&spread), [false, true]);
        assert_eq!(spread[0].held_elsewhere, 1);
    }

    #[test]
    fn each_lease_held_elsewhere_adds_a_tier_past_a_free_pods_latest_attempt() {
        let retry = Duration::from_secs(2);
        assert_eq!(tier_delay(retry, 0), Duration::ZERO);
        assert!(tier_delay(retry, 1) > retry + retry / 2);
        assert_eq!(tier_delay(retry, 3), Duration::from_secs(12));
        // No overflow, however many.
        assert!(tier_delay(retry, usize::MAX) > Duration::from_secs(100 * 365 * 86_400));
    }
}
