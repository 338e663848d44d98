//! Whether the API server is failing, judged from every request the driver
//! makes, and how long the driver's own requests (restarts of the watch,
//! fallback reads) wait while it is.
//!
//! An outage starts with a failure of the server itself — a 5xx, a 429, no
//! answer in time, no connection — and ends with the first answer of any
//! other kind (a success, a 409, a 403: the server is up again). While it
//! lasts, the watch is restarted after a wait drawn with full jitter,
//! doubling from a quarter of the retry period up to one lease duration;
//! fallback reads pause. A recovered server is watched again at once. A
//! `Retry-After` holds either way until it has passed: a server that
//! throttles lists may well answer reads. The machine's own writes
//! keep their own rules: a leader renews every retry period until its
//! renew deadline, so it never steps down later than it would otherwise.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::elector::api_error::ApiError;
use crate::elector::driver::Outlet;
use crate::elector::machine::Snapshot;

/// The outage as the requests showed it.
#[derive(Debug)]
pub(super) struct Outage {
    backoff: Backoff,
    /// Server failures in a row.
    failures: u32,
    /// When the first of them was answered.
    since: Option<Instant>,
    /// Not before this instant: the last `Retry-After`, kept until it passed.
    floor: Option<Instant>,
    /// An outage ended since [`Outage::take_recovered`] was last asked.
    recovered: bool,
}

/// What one outcome changed.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Change {
    None,
    Started,
    /// It ended after this long.
    Ended(Duration),
}

impl Outage {
    pub(super) fn new(retry_period: Duration, lease_duration: Duration) -> Self {
        Self {
            backoff: Backoff {
                first: retry_period / 4,
                max: lease_duration,
                jitter: 0.0,
            },
            failures: 0,
            since: None,
            floor: None,
            recovered: false,
        }
    }

    /// One request's outcome, answered at `now`.
    pub(super) fn note(&mut self, result: Result<(), &ApiError>, now: Instant) -> Change {
        match result {
            Err(error) if error.is_outage() => {
                self.failures = self.failures.saturating_add(1);
                if let Some(wait) = error.retry_after() {
                    let until = now + wait.min(self.backoff.max);
                    self.floor = Some(self.floor.map_or(until, |f| f.max(until)));
                }
                if self.since.is_none() {
                    self.since = Some(now);
                    return Change::Started;
                }
                Change::None
            }
            _ => {
                self.failures = 0;
                match self.since.take() {
                    Some(since) => {
                        self.recovered = true;
                        Change::Ended(now.saturating_duration_since(since))
                    }
                    None => Change::None,
                }
            }
        }
    }

    pub(super) fn is_on(&self) -> bool {
        self.since.is_some()
    }

    /// The wait before the next request of the driver's own, for a
    /// `random` number in `[0, 1)`: full jitter over the doubled wait,
    /// but never before what a `Retry-After` asked for.
    pub(super) fn wait(&self, now: Instant, random: f64) -> Duration {
        let drawn = self.backoff.full_jitter(self.failures, random);
        drawn.max(self.floor(now))
    }

    /// What is left of the last `Retry-After` at `now`.
    pub(super) fn floor(&self, now: Instant) -> Duration {
        self.floor
            .map_or(Duration::ZERO, |f| f.saturating_duration_since(now))
    }

    /// Whether an outage ended since the last call.
    pub(super) fn take_recovered(&mut self) -> bool {
        std::mem::take(&mut self.recovered)
    }
}

/// The driver's [`Outlet`], which also keeps the [`Outage`] up to date
/// from every request outcome it counts, and says when one starts and ends.
pub(super) struct Tally {
    outlet: Box<dyn Outlet>,
    outage: Mutex<Outage>,
    /// Said when the last outage ended, and whether its start was said:
    /// a server that fails only some requests (lists throttled, reads
    /// answered) starts and ends outages every retry period, which the
    /// log tells once a lease duration.
    said: Mutex<(Option<Instant>, bool)>,
}

impl Tally {
    pub(super) fn new(outlet: impl Outlet, outage: Outage) -> Self {
        Self {
            outlet: Box::new(outlet),
            outage: Mutex::new(outage),
            said: Mutex::new((None, false)),
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watch delivered: the server answers (not a counted request).
    pub(super) fn heard(&self) {
        self.note(Ok(()));
    }

    pub(super) fn outage_on(&self) -> bool {
        self.outage().is_on()
    }

    pub(super) fn wait(&self) -> Duration {
        self.outage().wait(Instant::now(), fastrand::f64())
    }

    /// The wait before watching again once the server answers: what is
    /// left of a `Retry-After`, if the server recovered; `None` otherwise.
    pub(super) fn recovered(&self) -> Option<Duration> {
        let mut outage = self.outage();
        outage
            .take_recovered()
            .then(|| outage.floor(Instant::now()))
    }

    fn note(&self, result: Result<(), &ApiError>) {
        let now = Instant::now();
        let (change, quiet_for) = {
            let mut outage = self.outage();
            (outage.note(result, now), outage.backoff.max)
        };
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        match (change, result) {
            (Change::Started, Err(error)) => {
                let recent = said.0.is_some_and(|ended| now < ended + quiet_for);
                said.1 = !recent;
                if recent {
                    tracing::debug!(%error, "the API server is failing again");
                } else {
                    tracing::warn!(
                        %error,
                        "the API server is failing: until it answers again, this candidate waits longer between requests (up to a lease duration); a leader keeps renewing until its renew deadline"
                    );
                }
            }
            (Change::Ended(after), _) => {
                said.0 = Some(now);
                if std::mem::take(&mut said.1) {
                    tracing::info!(
                        ?after,
                        "the API server answers again; watching the lease again"
                    );
                } else {
                    tracing::debug!(?after, "the API server answers again");
                }
            }
            _ => {}
        }
    }
}

impl Outlet for Tally {
    fn publish(&self, snapshot: &Snapshot) {
        self.outlet.publish(snapshot);
    }

    fn api_request(&self, verb: &'static str, result: Result<(), &ApiError>) {
        self.outlet.api_request(verb, result);
        self.note(result);
    }

    fn renewed(&self, sent: crate::clock::BootInstant, latency: Duration) {
        self.outlet.renewed(sent, latency);
    }

    fn renew_conflict(&self) {
        self.outlet.renew_conflict();
    }

    fn identity_conflicts(&self, new: u64) {
        self.outlet.identity_conflicts(new);
    }

    fn resumable(&self, write: Option<&crate::elector::incarnation::Recorded>) {
        self.outlet.resumable(write);
    }

    fn gates_closed(&self) -> futures::future::BoxFuture<'static, ()> {
        self.outlet.gates_closed()
    }

    fn gates_still_open(&self) -> Vec<String> {
        self.outlet.gates_still_open()
    }

    fn whole_gate_lag_reason(&self) -> Option<&'static str> {
        self.outlet.whole_gate_lag_reason()
    }

    fn release_not_before(&self) -> Option<std::time::Instant> {
        self.outlet.release_not_before()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY: Duration = Duration::from_secs(2);
    const LEASE: Duration = Duration::from_secs(15);

    fn unavailable() -> ApiError {
        ApiError::Server {
            code: 503,
            message: "unavailable".into(),
        }
    }

    #[test]
    fn server_failures_double_the_ceiling_from_a_quarter_retry_to_a_lease_duration() {
        let now = Instant::now();
        let mut outage = Outage::new(RETRY, LEASE);
        assert_eq!(outage.note(Err(&unavailable()), now), Change::Started);
        let mut ceilings = vec![outage.wait(now, 1.0)];
        for _ in 0..7 {
            outage.note(Err(&ApiError::Timeout(RETRY)), now);
            ceilings.push(outage.wait(now, 1.0));
        }
        let millis: Vec<u128> = ceilings.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [500, 1000, 2000, 4000, 8000, 15000, 15000, 15000]);
        assert_eq!(outage.wait(now, 0.0), Duration::ZERO, "full jitter");
    }

    #[test]
    fn retry_after_is_a_floor_and_any_other_answer_ends_the_outage() {
        let now = Instant::now();
        let mut outage = Outage::new(RETRY, LEASE);
        let throttled = ApiError::TooManyRequests {
            retry_after: Some(Duration::from_secs(3)),
        };
        outage.note(Err(&throttled), now);
        assert_eq!(outage.wait(now, 0.0), Duration::from_secs(3));
        assert_eq!(
            outage.wait(now + Duration::from_secs(1), 0.0),
            Duration::from_secs(2)
        );
        assert!(!outage.take_recovered());
        // A 409 is an answer: the server is up.
        let ended = outage.note(
            Err(&ApiError::Conflict("Conflict".into())),
            now + Duration::from_secs(4),
        );
        assert_eq!(ended, Change::Ended(Duration::from_secs(4)));
        assert!(!outage.is_on());
        assert!(outage.take_recovered());
        assert!(!outage.take_recovered(), "said once");
        let later = now + Duration::from_secs(4);
        assert_eq!(outage.wait(later, 1.0), Duration::from_millis(500));
        // The Retry-After still holds until it passed.
        assert_eq!(
            outage.floor(now + Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        assert_eq!(outage.floor(now + Duration::from_secs(4)), Duration::ZERO);
    }

    #[test]
    fn answers_about_the_lease_or_the_request_are_no_outage() {
        let now = Instant::now();
        let mut outage = Outage::new(RETRY, LEASE);
        for error in [
            ApiError::Unauthorized,
            ApiError::NotFound,
            ApiError::Gone,
            ApiError::Conflict("Conflict".into()),
        ] {
            assert_eq!(outage.note(Err(&error), now), Change::None);
        }
        assert!(!outage.is_on());
    }
}
