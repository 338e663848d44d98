//! Exponential backoff, capped and jittered: the one rule the retry loops
//! that repeat the same request share (a follower's failed acquisitions, a
//! watch restarted after a 401 or its end, a client gate reconnecting to
//! `/events`, a follower's requests while the API server fails).
//!
//! It owns only the arithmetic. The caller counts failures, draws the
//! random number (the election from its seeded generator, so tests are
//! reproducible) and decides what resets the count. Rules that are not
//! "double until a cap" stay with their loops: a leader retries a failed
//! renew every retry period until its deadline, a 429 waits for its
//! `Retry-After`, and the collector's health check keeps its fixed period.

use std::time::Duration;

/// The first delay doubles at most this many times (×128): beyond it the
/// cap decides anyway for every caller, and the shift cannot overflow.
const MAX_DOUBLINGS: u32 = 7;

/// `first`, doubled after every further failure in a row, plus a random
/// extra of up to `jitter` (a fraction) of that so candidates that failed
/// together do not retry together — and never more than `max`, jitter
/// included: callers promise a bound (a follower tries again within a
/// lease duration, so a healed cluster has a leader in time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub jitter: f64,
}

// === impl Backoff ===

impl Backoff {
    /// The wait after `failures` failures in a row (0 counts as 1), for a
    /// `random` number in `[0, 1)`.
    pub fn delay(&self, failures: u32, random: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(MAX_DOUBLINGS);
        let exponential = self.first.saturating_mul(1 << doublings).min(self.max);
        let random = if random.is_finite() {
            random.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let jitter = exponential.mul_f64(random * self.jitter);
        exponential.saturating_add(jitter).min(self.max)
    }

    /// "Full jitter": anywhere from zero up to the capped exponential wait
    /// (`jitter` is not used). Many clients failing together then spread
    /// over the whole wait instead of coming back in one burst, as a
    /// server that is recovering needs.
    pub fn full_jitter(&self, failures: u32, random: f64) -> Duration {
        let ceiling = Self {
            jitter: 0.0,
            ..*self
        }
        .delay(failures, 0.0);
        let random = if random.is_finite() {
            random.clamp(0.0, 1.0)
        } else {
            0.0
        };
        ceiling.mul_f64(random)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_from_the_first_delay_up_to_the_cap() {
        let backoff = Backoff {
            first: SECOND,
            max: 30 * SECOND,
            jitter: 0.0,
        };
        let delays: Vec<u64> = (1..=8).map(|n| backoff.delay(n, 0.9).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff.delay(0, 0.0), SECOND, "no failure counts as one");
    }

    #[test]
    fn jitter_adds_at_most_its_fraction_and_never_passes_the_cap() {
        let backoff = Backoff {
            first: 2 * SECOND,
            max: 15 * SECOND,
            jitter: 0.2,
        };
        assert_eq!(backoff.delay(1, 0.0), 2 * SECOND);
        assert_eq!(backoff.delay(1, 0.5), Duration::from_millis(2200));
        assert_eq!(backoff.delay(3, 0.25), Duration::from_millis(8400));
        assert_eq!(backoff.delay(4, 0.5), 15 * SECOND, "16 s + jitter, capped");
        assert_eq!(backoff.delay(9, 0.99), 15 * SECOND);
        // Out-of-range randomness cannot exceed the bound either.
        assert_eq!(backoff.delay(1, 7.0), Duration::from_millis(2400));
        assert_eq!(backoff.delay(1, f64::NAN), 2 * SECOND);
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_capped_wait() {
        let backoff = Backoff {
            first: Duration::from_millis(500),
            max: 15 * SECOND,
            jitter: 0.2,
        };
        assert_eq!(backoff.full_jitter(1, 0.0), Duration::ZERO);
        assert_eq!(backoff.full_jitter(1, 0.5), Duration::from_millis(250));
        assert_eq!(backoff.full_jitter(3, 1.0), 2 * SECOND);
        assert_eq!(backoff.full_jitter(9, 0.5), Duration::from_millis(7500));
        assert_eq!(
            backoff.full_jitter(9, 3.0),
            15 * SECOND,
            "never past the cap"
        );
        assert_eq!(backoff.full_jitter(9, f64::NAN), Duration::ZERO);
    }

    #[test]
    fn growth_stops_at_128_times_the_first_delay_and_never_overflows() {
        let backoff = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(86_400),
            jitter: 0.2,
        };
        assert_eq!(backoff.delay(u32::MAX, 0.0), Duration::from_millis(12_800));
        assert!(backoff.delay(u32::MAX, 0.99) <= Duration::from_millis(15_360));
        let huge = Backoff {
            first: Duration::MAX,
            max: Duration::MAX,
            jitter: 0.0,
        };
        assert_eq!(huge.delay(u32::MAX, 0.0), Duration::MAX);
    }
}
