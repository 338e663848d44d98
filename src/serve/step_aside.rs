//! What step-down requests (`POST /handover`, [`crate::serve::step_down`])
//! may cost a group: a pod stands aside at most once per two lease
//! durations. A request while it stands aside does not extend it; one
//! within a lease duration after that is refused, so the pod contends (or
//! leads) for at least one lease duration in every two, whatever the rate
//! of requests. Hence the bound: a group with a pod that can lead is
//! without a leader for at most one lease duration plus two retry periods
//! at a time (docs/SECURITY.md, "Hand-over requests").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The step-down requests of one Lease: whether one makes this pod stand
/// aside (at most once per two lease durations, see the module docs), and
/// the election's side of them ([`Self::asked`]).
#[derive(Debug)]
pub struct StepAsideRequests {
    asked: Arc<Notify>,
    /// How long the election stands aside per request: one lease duration.
    stand_aside: Duration,
    /// When the last request that made this pod stand aside came.
    last: Mutex<Option<Instant>>,
    /// A refusal was logged since: a flood of requests is said once per
    /// stand-aside, not once per request.
    refusal_said: AtomicBool,
}

/// What one step-down request comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The election is asked: it steps down (if it leads) and stands aside
    /// for a lease duration.
    StandAside,
    /// It stands aside already, for `left` more: not extended.
    AlreadyAside { left: Duration },
    /// It stood aside less than two lease durations ago: it contends (or
    /// leads) for `retry_after` more before a request counts again.
    Refused { retry_after: Duration },
}

impl Default for StepAsideRequests {
    /// For a lease duration of 15 s (the default `--lease-duration`).
    fn default() -> Self {
        Self::new(Duration::from_secs(15))
    }
}

impl StepAsideRequests {
    pub fn new(lease_duration: Duration) -> Self {
        Self {
            asked: Arc::new(Notify::new()),
            stand_aside: lease_duration,
            last: Mutex::new(None),
            refusal_said: AtomicBool::new(false),
        }
    }

    /// What the election waits on: one notification per request that
    /// counts ([`Verdict::StandAside`]).
    pub fn asked(&self) -> Arc<Notify> {
        self.asked.clone()
    }

    /// Resolves at the next request that counts.
    pub async fn notified(&self) {
        self.asked.notified().await;
    }

    /// Whether a refusal is the first since the last stand-aside (to be
    /// logged at INFO; later ones at DEBUG).
    pub fn first_refusal(&self) -> bool {
        !self.refusal_said.swap(true, Ordering::Relaxed)
    }

    /// Judges a request that came at `now`, and passes it on if it counts.
    pub fn ask(&self, now: Instant) -> Verdict {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = judge(*last, now, self.stand_aside);
        if verdict == Verdict::StandAside {
            *last = Some(now);
            self.refusal_said.store(false, Ordering::Relaxed);
            self.asked.notify_one();
        }
        verdict
    }
}

/// The rule, on explicit instants: a pod that stood aside at `last` stands
/// aside until `last + L`, then contends until `last + 2L` whatever is
/// asked; a request after that counts again.
fn judge(last: Option<Instant>, now: Instant, lease: Duration) -> Verdict {
    let Some(last) = last else {
        return Verdict::StandAside;
    };
    let since = now.saturating_duration_since(last);
    if since < lease {
        Verdict::AlreadyAside {
            left: lease - since,
        }
    } else if since < lease * 2 {
        Verdict::Refused {
            retry_after: lease * 2 - since,
        }
    } else {
        Verdict::StandAside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn a_pod_stands_aside_once_per_two_lease_durations_whatever_is_asked() {
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        assert_eq!(judge(None, t0, LEASE), Verdict::StandAside);
        // Asked again while standing aside: not extended.
        assert_eq!(
            judge(Some(t0), at(14.0), LEASE),
            Verdict::AlreadyAside {
                left: Duration::from_secs(1)
            }
        );
        // Then a lease duration of contention, whatever is asked.
        assert_eq!(
            judge(Some(t0), at(15.0), LEASE),
            Verdict::Refused { retry_after: LEASE }
        );
        assert_eq!(
            judge(Some(t0), at(29.5), LEASE),
            Verdict::Refused {
                retry_after: Duration::from_millis(500)
            }
        );
        assert_eq!(judge(Some(t0), at(30.0), LEASE), Verdict::StandAside);
    }

    #[tokio::test]
    async fn only_a_request_that_counts_reaches_the_election() {
        let requests = StepAsideRequests::new(LEASE);
        let reached = || async {
            tokio::time::timeout(Duration::from_millis(20), requests.notified())
                .await
                .is_ok()
        };
        let t0 = Instant::now();
        assert_eq!(requests.ask(t0), Verdict::StandAside);
        assert!(reached().await);
        for secs in [1, 14, 15, 29] {
            assert_ne!(
                requests.ask(t0 + Duration::from_secs(secs)),
                Verdict::StandAside
            );
            assert!(!reached().await, "asked again at {secs}s");
        }
        assert_eq!(requests.ask(t0 + LEASE * 2), Verdict::StandAside);
        assert!(reached().await);
    }

    #[test]
    fn a_flood_of_refusals_is_said_once_per_stand_aside() {
        let requests = StepAsideRequests::new(LEASE);
        let t0 = Instant::now();
        requests.ask(t0);
        assert!(requests.first_refusal());
        assert!(!requests.first_refusal());
        requests.ask(t0 + LEASE * 2);
        assert!(requests.first_refusal(), "said again after the next one");
    }
}
