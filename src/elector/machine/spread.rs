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
//! - **when a Lease is given up**: a pod leading a Lease it need not keep
//!   ([`Spread::surplus`]) hands it over gracefully (gates closed first, as
//!   for a hand-over request) to the successor named in it, who by the first
//!   rule held nothing when it claimed.
//!
//! Every rebalancing step moves one surplus Lease to a pod that held none,
//! with the successor's claim, the release and the acquisition: O(1)
//! writes, and never a herd.

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

/// What each Lease of a group is told, given which of them this process
/// leads (`leading[i]` for Lease `i`): every Lease held counts for the
/// others, and the first one led is kept, the rest are surplus.
pub fn spread_of(leading: &[bool]) -> Vec<Spread> {
    let held = leading.iter().filter(|l| **l).count();
    let kept = leading.iter().position(|l| *l);
    leading
        .iter()
        .enumerate()
        .map(|(i, leads)| Spread {
            held_elsewhere: held - usize::from(*leads),
            surplus: *leads && kept != Some(i),
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

    #[test]
    fn the_first_lease_led_is_kept_and_every_lease_held_counts_for_the_others() {
        assert_eq!(spread_of(&[false, false]), vec![Spread::default(); 2]);
        let spread = spread_of(&[false, true, false, true]);
        let held: Vec<usize> = spread.iter().map(|s| s.held_elsewhere).collect();
        let surplus: Vec<bool> = spread.iter().map(|s| s.surplus).collect();
        assert_eq!(held, [2, 1, 2, 1]);
        assert_eq!(surplus, [false, false, false, true]);
        assert_eq!(
            spread_of(&[true]),
            vec![Spread {
                held_elsewhere: 0,
                surplus: false
            }]
        );
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
