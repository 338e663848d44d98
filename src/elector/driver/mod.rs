//! The election driver: the one task that owns the Lease.
//!
//! It waits on whichever comes first — a change of the Lease from the watch,
//! the answer to the one request in flight, a change of the collector's
//! health, the machine's next deadline, or shutdown — feeds it to the
//! [`Election`], publishes the new state, and only then carries out the
//! actions (so "not leading" is out before any retry or release, G2). Nothing
//! else mutates election state. A release, on shutdown or for an unhealthy
//! collector, goes out only once the gates had their lag, or all said they
//! are closed (G6).
//!
//! A watch that fails is not left to resume quietly: the machine is told
//! ([`Input::WatchInterrupted`]) and a fresh watch, which lists first, is
//! started within a retry period, so the machine sees the Lease again as a
//! whole before it creates anything (G7). While the API server itself fails
//! (5xx, 429, no answer), the restarts back off instead ([`outage`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::clock::{BootInstant, wall_micros};
use crate::elector::api_error::ApiError;
use crate::elector::incarnation::Recorded;
use crate::elector::lease::Lease;
use crate::elector::lease_client::LeaseStore;
use crate::elector::machine::{
    Action, CollectorVerdict, Election, Input, Now, Purpose, Resumption, Snapshot, Spread,
    StopReason, Write, WriteOp,
};
use outage::{Outage, Tally};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

mod outage;

/// Restarts of the watch stream after a 401 or its end, in a row.
const WATCH_RESTART: Backoff = Backoff {
    first: Duration::from_secs(1),
    max: Duration::from_secs(30),
    jitter: 0.2,
};

/// How the driver shuts down (G6).
#[derive(Clone, Debug)]
pub struct ShutdownOptions {
    /// Release the Lease with a marked CAS write once the gates are closed.
    pub release: bool,
    /// Time the gates need to close after "not leading" is published.
    pub gate_lag: Duration,
    /// Bound on the whole sequence: lag, the request in flight, the release.
    pub timeout: Duration,
}

/// Where the driver reports, after every input and for every request; the
/// serving side implements it ([`crate::serve::published::Publisher`]), so
/// the elector never names what is built on it.
pub trait Outlet: Send + Sync + 'static {
    /// The machine's state after an input, before its actions are carried out.
    fn publish(&self, snapshot: &Snapshot);
    /// A request's outcome, by verb (`get`, `create`, `update`, `watch`).
    fn api_request(&self, verb: &'static str, result: Result<(), &ApiError>);
    /// A renew (an acquisition included) landed: sent at `sent`, answered
    /// after `latency`.
    fn renewed(&self, sent: BootInstant, latency: Duration);
    /// A renew lost its compare-and-swap (409).
    fn renew_conflict(&self);
    /// `new` more writes of another process under our identity were seen.
    fn identity_conflicts(&self, new: u64);
    /// The stored write a restarted process of this pod may resume
    /// ([`Election::resumable`]), each time it changes; `None` once there is
    /// nothing to resume (the term ended).
    fn resumable(&self, _write: Option<&Recorded>) {}
    /// Resolves once every gate registered for the term that just ended has
    /// acknowledged that it is closed; never, when no gate can say so (the
    /// gate lag then runs in full).
    fn gates_closed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
    /// The gates registered for the last term that have not acknowledged it.
    fn gates_still_open(&self) -> Vec<String> {
        Vec::new()
    }

    /// Why the release of the term that just ended waits the whole gate lag
    /// whatever its gates say (a term resumed after a restart), once per
    /// term; `None` otherwise.
    fn whole_gate_lag_reason(&self) -> Option<&'static str> {
        None
    }

    /// The release of the term that just ended may not go out before this
    /// instant, whatever its gates say (a term resumed after a restart,
    /// while gates of the previous process may still run it); `None`:
    /// only the gate lag or the gates' word.
    fn release_not_before(&self) -> Option<std::time::Instant> {
        None
    }
}

/// Liveness of the election task: it beats on every turn of its loop (at
/// least once per retry period) and flags its own end.
#[derive(Debug, Default)]
pub struct Heartbeat {
    last_beat_ms: AtomicU64,
    ended: AtomicBool,
}

impl Heartbeat {
    pub fn new() -> Arc<Self> {
        let heartbeat = Arc::new(Self::default());
        heartbeat.beat();
        heartbeat
    }

    pub fn beat(&self) {
        self.last_beat_ms
            .store(BootInstant::now().as_millis(), Ordering::Relaxed);
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Alive: not ended, and beat within `max_silence`.
    pub fn is_alive(&self, max_silence: Duration) -> bool {
        let silence = BootInstant::now()
            .as_millis()
            .saturating_sub(self.last_beat_ms.load(Ordering::Relaxed));
        !self.ended.load(Ordering::Relaxed) && silence <= max_silence.as_millis() as u64
    }
}

/// What the election hears besides the Lease, each `None` when not used.
#[derive(Default)]
pub struct Inputs {
    /// The collector's health (see [`crate::serve::collector_health`]): it
    /// gates contention; without it the collector counts as healthy.
    pub collector_health: Option<watch::Receiver<CollectorVerdict>>,
    /// What this process holds of the other Leases of its group, for a
    /// sidecar elected for several ([`Spread`]).
    pub spread: Option<watch::Receiver<Spread>>,
    /// Step-down requests from this pod (`POST /handover` on the gate
    /// channel): each one becomes [`Input::StepAside`] for one lease
    /// duration. The route notifies at most once per two lease durations
    /// (`serve::step_aside`), which bounds how long requests can keep a
    /// group leaderless.
    pub step_aside: Option<Arc<tokio::sync::Notify>>,
}

/// Runs the election until `shutdown` is cancelled, then hands over.
pub async fn run(
    store: Arc<dyn LeaseStore>,
    election: Election,
    publisher: impl Outlet,
    heartbeat: Arc<Heartbeat>,
    shutdown: CancellationToken,
    options: ShutdownOptions,
    inputs: Inputs,
) {
    let Inputs {
        collector_health,
        spread,
        step_aside,
    } = inputs;
    let _ended = EndOnDrop(heartbeat.clone());
    let settings = election.settings();
    let outage = Outage::new(settings.retry_period, settings.lease_duration);
    let mut driver = Driver {
        store,
        election,
        publisher: Arc::new(Tally::new(publisher, outage)),
        inflight: None,
        handled: Instant::now(),
        stepped_down_at: None,
        gate_lag: options.gate_lag,
        collector_health,
        spread,
        step_aside,
        resumable: None,
    };
    if let Some(health) = &mut driver.collector_health {
        // Part of the very first published state: nothing has happened yet,
        // so this input can produce no action.
        let verdict = *health.borrow_and_update();
        let actions = driver.election.handle(verdict.input(), now());
        debug_assert!(actions.is_empty());
    }
    if let Some(spread) = &mut driver.spread {
        // Likewise: holding nothing yet, the first spread asks for nothing.
        let spread = *spread.borrow_and_update();
        let actions = driver.election.handle(Input::Spread(spread), now());
        debug_assert!(actions.is_empty());
    }
    driver.publish_now();
    driver.contend(&heartbeat, &shutdown).await;
    driver.hand_over(options).await;
}

struct Driver {
    store: Arc<dyn LeaseStore>,
    election: Election,
    /// The outlet, which also judges whether the API server is failing.
    publisher: Arc<Tally>,
    /// The one request in flight, resolving to its input.
    inflight: Option<BoxFuture<'static, Input>>,
    /// The instant of the last input fed to the machine.
    handled: Instant,
    /// When "not leading" was last published after leading: the gates count
    /// their lag from here (G6). `None` once they are known to be closed.
    stepped_down_at: Option<Instant>,
    gate_lag: Duration,
    /// The collector's health; `None` when not checked (or the check ended).
    collector_health: Option<watch::Receiver<CollectorVerdict>>,
    /// What this process holds of its group's other Leases; `None` alone.
    spread: Option<watch::Receiver<Spread>>,
    /// Step-down requests from this pod; `None` when not taken.
    step_aside: Option<Arc<tokio::sync::Notify>>,
    /// What the outlet was last told a restart may resume.
    resumable: Option<Recorded>,
}

// === impl Driver ===

impl Driver {
    async fn contend(&mut self, heartbeat: &Heartbeat, shutdown: &CancellationToken) {
        let mut watch = self.store.watch();
        // Restarts of the watch stream after a 401 or its end, in a row.
        let mut restarts = 0u32;
        // Watch errors in a row.
        let mut errors = 0u32;
        // Wake at least once per retry period so the heartbeat shows a live loop.
        let max_sleep = self.election.settings().retry_period;
        let mut silence = WatchSilence::default();
        // The watch is being restarted after a wait (not yet listing).
        let mut restarting = false;
        loop {
            heartbeat.beat();
            if let Some(floor) = self.publisher.recovered()
                && restarting
            {
                // The first answer after an outage: watch again now (or
                // once a Retry-After passed) rather than at the end of a
                // wait of up to a lease duration.
                watch = self.restart_watch(floor);
                restarting = false;
            }
            // Fallback reads pause while the API server fails: the watch's
            // restarts find out when it is back.
            let read_at = silence
                .read_due(max_sleep)
                .filter(|_| self.inflight.is_none() && !self.publisher.outage_on());
            let cap = Instant::now() + max_sleep;
            let wake = self
                .election
                .next_wakeup(self.handled)
                .map_or(cap, |w| w.min(cap));
            let input = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                input = in_flight(&mut self.inflight) => {
                    self.inflight = None;
                    input
                }
                healthy = health_change(&mut self.collector_health) => match healthy {
                    Some(verdict) => verdict.input(),
                    None => {
                        // The check ended (it panicked): fail closed.
                        tracing::error!("the collector health check stopped; counting the collector as unhealthy");
                        self.collector_health = None;
                        Input::CollectorHealth(false)
                    }
                },
                () = step_aside_asked(&self.step_aside) => {
                    tracing::info!("this pod asked to hand over: stepping down and standing aside for a lease duration");
                    Input::StepAside { stand_aside: self.election.settings().lease_duration }
                }
                spread = spread_change(&mut self.spread) => match spread {
                    Some(spread) => Input::Spread(spread),
                    None => {
                        // The group's coordinator ended (shutdown is under
                        // way, or it panicked): count nothing held elsewhere.
                        self.spread = None;
                        Input::Spread(Spread::default())
                    }
                },
                item = watch.next() => match item {
                    Some(Ok(lease)) => {
                        restarts = 0;
                        errors = 0;
                        restarting = false;
                        silence.heard();
                        self.publisher.heard();
                        Input::Observed(lease)
                    }
                    Some(Err(ApiError::Unauthorized)) => {
                        self.publisher.api_request("watch", Err(&ApiError::Unauthorized));
                        self.reload_credentials().await;
                        restarts += 1;
                        watch = self.restart_watch(auth_backoff(restarts));
                        restarting = true;
                        Input::WatchInterrupted
                    }
                    Some(Err(error)) => {
                        self.publisher.api_request("watch", Err(&error));
                        tracing::debug!(%error, "lease watch failed; a fresh one lists again");
                        silence.failed(&error);
                        errors += 1;
                        let wait = if error.is_outage() {
                            self.publisher.wait()
                        } else {
                            self.error_backoff(errors)
                        };
                        watch = self.restart_watch(wait);
                        restarting = true;
                        Input::WatchInterrupted
                    }
                    None => {
                        restarts += 1;
                        watch = self.restart_watch(auth_backoff(restarts));
                        restarting = true;
                        Input::WatchInterrupted
                    }
                },
                () = sleep_until(read_at.unwrap_or(wake)), if read_at.is_some() => {
                    self.inflight = Some(self.read_for(silence.read()));
                    continue;
                }
                () = sleep_until(wake) => Input::Tick,
            };
            self.step(input).await;
        }
    }

    /// A GET in place of a watch that keeps failing: what it finds is an
    /// observation like the watch's (`why` is the watch's last error).
    fn read_for(&self, why: Option<ApiError>) -> BoxFuture<'static, Input> {
        match why {
            Some(error @ ApiError::Forbidden(_)) => tracing::warn!(
                %error,
                "the lease watch is denied: reading the lease every retry period instead (grant list and watch on the lease to go back to watching)"
            ),
            Some(error) => tracing::warn!(
                %error,
                "the lease watch keeps failing: reading the lease every retry period instead until it works again"
            ),
            None => {}
        }
        let get = self.store.get();
        let timeout = self.election.settings().renew_deadline / 2;
        let publisher = self.publisher.clone();
        Box::pin(async move {
            let result = with_timeout(timeout, get).await;
            publisher.api_request("get", result.as_ref().map(|_| ()));
            match result {
                Ok(lease) => Input::Observed(lease),
                // Said by the store once per episode; nothing learnt.
                Err(_) => Input::Tick,
            }
        })
    }

    /// Re-reads credentials, bounded by a retry period: an exec plugin that
    /// hangs must not stall the loop (its deadlines, its shutdown).
    fn reload_credentials(&self) -> impl Future<Output = ()> + Send + 'static {
        let (store, limit) = (self.store.clone(), self.election.settings().retry_period);
        async move {
            if tokio::time::timeout(limit, store.reload_credentials())
                .await
                .is_err()
            {
                tracing::warn!(
                    ?limit,
                    "reloading API credentials took too long; using the old ones"
                );
            }
        }
    }

    /// After `errors` watch errors in a row: a quarter of the retry period,
    /// doubling up to one retry period, jittered. kube-runtime's own backoff
    /// (up to 30 s) would leave the view unconfirmed, and an absent Lease
    /// uncreated, long after the API server is back; this is at most as
    /// many requests as client-go's candidates make anyway (a GET per retry
    /// period each).
    fn error_backoff(&self, errors: u32) -> Duration {
        // (While the API server itself fails, the outage's wait applies.)
        let retry = self.election.settings().retry_period;
        (retry / 4)
            .saturating_mul(1 << errors.clamp(1, 3).saturating_sub(1))
            .min(retry)
            .mul_f64(0.8 + fastrand::f64() * 0.2)
    }

    /// A new watch stream (a fresh watcher lists first) started after
    /// `backoff`.
    fn restart_watch(
        &self,
        backoff: Duration,
    ) -> BoxStream<'static, Result<Option<Lease>, ApiError>> {
        let delay =
            futures::stream::once(tokio::time::sleep(backoff)).filter_map(|()| async { None });
        // Made once the backoff is over, so it starts from what is true then.
        let store = self.store.clone();
        let fresh = futures::stream::once(async move { store.watch() }).flatten();
        delay.chain(fresh).boxed()
    }

    /// One turn: feed the input, publish, then act.
    async fn step(&mut self, input: Input) {
        let shutdown_release = matches!(input, Input::Release { .. });
        let gone = holder_gone(&input);
        let now = now();
        let before = self.election.snapshot(now.instant);
        let (conflicts_before, _) = self.election.identity_conflicts();
        let actions = self.election.handle(input, now);
        self.handled = now.instant;
        self.report_identity_conflict(conflicts_before);
        self.report_resumption();
        let resumable = self.election.resumable();
        if resumable != self.resumable {
            self.publisher.resumable(resumable.as_ref());
            self.resumable = resumable;
        }
        let after = self.publish_now();
        let why = release_reason(shutdown_release, &after);
        if before.leading && !after.leading {
            self.stepped_down_at = Some(Instant::now());
        }
        log_transition(&before, &after, &self.election.settings().identity, gone);
        for action in actions {
            match action {
                Action::Write(write) if write.purpose == Purpose::Release => {
                    // On shutdown or for an unhealthy collector: not before
                    // the gates closed (G6).
                    let gates_closed = self.gates_closed();
                    let release = self.send(write);
                    self.inflight = Some(Box::pin(async move {
                        gates_closed.await;
                        let input = release.await;
                        match &input {
                            Input::Written(Ok(_)) => {
                                tracing::info!(why, "released the lease for a peer to take at once")
                            }
                            // On shutdown the hand-over says what happens next.
                            Input::Written(Err(_)) if shutdown_release => {}
                            // The machine asks for a hand-over's release again
                            // after its backoff; an unhealthy collector's is
                            // sent once.
                            Input::Written(Err(error)) if why == HANDOVER || why == REBALANCE => {
                                tracing::warn!(
                                    why,
                                    %error,
                                    "could not release the lease for the hand-over; trying again after a backoff"
                                )
                            }
                            Input::Written(Err(error)) => tracing::warn!(
                                why,
                                %error,
                                "could not release the lease; peers take it after it expires"
                            ),
                            _ => {}
                        }
                        input
                    }));
                }
                Action::Write(write) => self.inflight = Some(self.send(write)),
                Action::Read { timeout } => {
                    let get = self.store.get();
                    let publisher = self.publisher.clone();
                    self.inflight = Some(Box::pin(async move {
                        let result = with_timeout(timeout, get).await;
                        publisher.api_request("get", result.as_ref().map(|_| ()));
                        Input::Read(result)
                    }));
                }
                Action::ReloadCredentials => self.reload_credentials().await,
            }
        }
    }

    /// Says loudly, once per other process, that someone else writes the
    /// Lease under our identity (G7: it is never taken for ours).
    fn report_identity_conflict(&self, before: u64) {
        let (conflicts, other) = self.election.identity_conflicts();
        if conflicts <= before {
            return;
        }
        self.publisher.identity_conflicts(conflicts - before);
        let identity = &self.election.settings().identity;
        tracing::error!(
            identity = identity.as_str(),
            other_writer = other,
            own_writer = self.election.writer().as_str(),
            "another process is writing the Lease under this pod's identity {identity:?}; its writes are never taken for ours, but the two cannot share work: give each candidate a unique --identity (LEADER_GATE_IDENTITY), e.g. the pod name"
        );
    }

    /// Says what the first observation made of the write resumed from the
    /// previous process of this pod (`--state-dir`), if one was.
    fn report_resumption(&mut self) {
        match self.election.take_resumption() {
            None => {}
            Some(Resumption::Resumed(term)) => tracing::info!(
                term = term.as_str(),
                "the lease still shows the previous process's last write: its term resumed"
            ),
            Some(Resumption::Dropped(why)) => {
                tracing::info!("not resuming the previous process's term: {why}")
            }
        }
    }

    /// Resolves once the gates are closed after the last step-down (G6):
    /// every gate registered for the term has acknowledged its end, or the
    /// gate lag, counted from the publication, ran out. At once if this
    /// process never led, or the gates are known to be closed.
    fn gates_closed(&self) -> BoxFuture<'static, ()> {
        let Some(stepped_down) = self.stepped_down_at else {
            return Box::pin(std::future::ready(()));
        };
        let mut lag_over = stepped_down + self.gate_lag;
        if let Some(at) = self.publisher.release_not_before() {
            lag_over = lag_over.max(Instant::from_std(at));
        }
        let acknowledged = self.publisher.gates_closed();
        let publisher = self.publisher.clone();
        let gate_lag = self.gate_lag;
        Box::pin(async move {
            if Instant::now() < lag_over
                && let Some(why) = publisher.whole_gate_lag_reason()
            {
                tracing::info!(
                    gate_lag_ms = gate_lag.as_millis() as u64,
                    "the release waits at least the whole gate lag: {why}"
                );
            }
            tokio::select! {
                biased;
                () = acknowledged => {
                    let after = stepped_down.elapsed();
                    if Instant::now() < lag_over {
                        tracing::info!(
                            after_ms = after.as_millis() as u64,
                            "every gate registered for the term acknowledged its end: not waiting out the gate lag"
                        );
                    }
                }
                () = sleep_until(lag_over) => {
                    let open = publisher.gates_still_open();
                    if !open.is_empty() {
                        tracing::warn!(
                            gates = ?open,
                            "the gate lag ran out before these registered gates acknowledged the end of the term (gone, stuck or slow to stop)"
                        );
                    }
                }
            }
        })
    }

    fn publish_now(&self) -> Snapshot {
        let snapshot = self.election.snapshot(Instant::now());
        self.publisher.publish(&snapshot);
        snapshot
    }

    fn send(&self, write: Write) -> BoxFuture<'static, Input> {
        // An acquisition is the first renew of a term.
        let renew = matches!(write.purpose, Purpose::Renew | Purpose::Acquire);
        let renewing = write.purpose == Purpose::Renew;
        let (verb, request) = match write.op {
            WriteOp::Create(object) => ("create", self.store.create(*object)),
            WriteOp::Replace(object) => ("update", self.store.replace(*object)),
        };
        let publisher = self.publisher.clone();
        Box::pin(async move {
            let sent = (BootInstant::now(), Instant::now());
            let result = with_timeout(write.timeout, request).await;
            publisher.api_request(verb, result.as_ref().map(|_| ()));
            if renew && result.is_ok() {
                publisher.renewed(sent.0, sent.1.elapsed());
            }
            if renewing && matches!(result, Err(ApiError::Conflict(_))) {
                publisher.renew_conflict();
            }
            Input::Written(result)
        })
    }

    /// G6: not leading → gate lag (or every registered gate's
    /// acknowledgement) → the request in flight → marked release, all
    /// within the shutdown timeout.
    async fn hand_over(&mut self, options: ShutdownOptions) {
        let deadline = Instant::now() + options.timeout;
        let settings = self.election.settings();
        // Our last renew was sent a renew deadline before the step-down
        // deadline; peers count a lease duration from about then.
        let expires = self.election.lead_deadline().map(|at| {
            at.checked_sub(settings.renew_deadline).unwrap_or(at) + settings.lease_duration
        });
        self.step(Input::Shutdown).await;
        if self.stepped_down_at.is_some() {
            // The gates close on "not leading"; give them their lag, counted
            // from when it was published, or until they all said they are
            // closed, before anyone may take over.
            if timeout_at(deadline, self.gates_closed()).await.is_err() {
                tracing::warn!(
                    "the gate lag outlasts the shutdown timeout: not releasing; peers take over after expiry"
                );
                return;
            }
            // Closed: the release below need not wait (nor say so) again.
            self.stepped_down_at = None;
        }
        if let Some(inflight) = self.inflight.take() {
            match timeout_at(deadline, inflight).await {
                Ok(input) => self.step(input).await,
                Err(_) => {
                    // Its outcome is unknown, so a release could not be a CAS
                    // on the record it wrote: leave the Lease to expire.
                    tracing::warn!(
                        "shutdown timeout while a lease request was in flight: not releasing"
                    );
                    return;
                }
            }
        }
        if !options.release {
            return;
        }
        self.release_until(deadline, expires).await;
    }

    /// Nothing is in flight now: the machine releases the Lease if it is
    /// still ours, and the answer goes back to it like any other. A release
    /// that failed for a reason that may pass — another write first (409),
    /// throttling, a server error, no answer — is sent again from a fresh
    /// read (the machine judges whether the record is still ours) while the
    /// shutdown timeout allows: else the group would wait a whole expiry
    /// for its next leader. `expires`: when peers see our record expire.
    async fn release_until(&mut self, deadline: Instant, expires: Option<Instant>) {
        // A request's own timeout, so a hung one leaves time for another.
        let request_timeout = self.election.settings().renew_deadline / 2;
        let mut failures = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            self.step(Input::Release {
                timeout: left.min(request_timeout),
            })
            .await;
            let Some(release) = self.inflight.take() else {
                return;
            };
            let input = release.await;
            let error = match &input {
                Input::Written(Err(error)) => Some(error.clone()),
                _ => None,
            };
            self.step(input).await;
            let Some(error) = error else { return };
            if matches!(error, ApiError::NotFound) {
                tracing::info!("the lease was deleted before it could be released");
                return;
            }
            if !matches!(error, ApiError::Conflict(_)) && !error.is_outage() {
                tracing::warn!(%error, "could not release the lease on shutdown; {}", left_to_expire(expires));
                return;
            }
            failures += 1;
            let wait = release_retry_wait(&error, failures);
            if Instant::now() + wait >= deadline {
                tracing::warn!(
                    "could not release the lease on shutdown: {}, and the shutdown timeout leaves no time to try again; {}",
                    release_failure(&error),
                    left_to_expire(expires)
                );
                return;
            }
            if wait.is_zero() {
                tracing::info!(
                    "could not release the lease on shutdown: {}; retrying at once from a fresh read",
                    release_failure(&error)
                );
            } else {
                tracing::warn!(
                    "could not release the lease on shutdown: {}, retrying after {:.1}s from a fresh read",
                    release_failure(&error),
                    wait.as_secs_f64()
                );
            }
            sleep_until(Instant::now() + wait).await;
            // The watch is no longer read here: read the record.
            let left = deadline.saturating_duration_since(Instant::now());
            match with_timeout(left.min(request_timeout), self.store.get()).await {
                Ok(lease) => {
                    self.publisher.api_request("get", Ok(()));
                    // Not a watch event but a read of the server as it is
                    // (taken even at an older resourceVersion, as after a
                    // restore of etcd): the watch is not followed here.
                    self.step(Input::WatchInterrupted).await;
                    self.step(Input::Observed(lease)).await;
                }
                Err(error) => {
                    self.publisher.api_request("get", Err(&error));
                    // Released on the record as last seen instead: the
                    // compare-and-swap refuses it if that moved on.
                    failures += 1;
                    let wait = release_retry_wait(&error, failures);
                    if Instant::now() + wait >= deadline {
                        tracing::warn!(%error, "could not read the lease again on shutdown; {}", left_to_expire(expires));
                        return;
                    }
                    sleep_until(Instant::now() + wait).await;
                }
            }
        }
    }
}

/// Before the next attempt to release on shutdown, after `failures` in a
/// row: at once after a first 409 (another write landed first — a
/// follower's claim of the successor slot, a hand-over request, an
/// annotation edit), else the `Retry-After`, else a short backoff.
fn release_retry_wait(error: &ApiError, failures: u32) -> Duration {
    match error {
        ApiError::Conflict(_) if failures == 1 => Duration::ZERO,
        _ => error
            .retry_after()
            .unwrap_or_else(|| RELEASE_RETRY.delay(failures, fastrand::f64())),
    }
}

/// A failed release in the words of the log.
fn release_failure(error: &ApiError) -> String {
    match error {
        ApiError::TooManyRequests { .. } => "throttled (429)".to_owned(),
        ApiError::Conflict(_) => "another write landed first (409)".to_owned(),
        other => other.to_string(),
    }
}

/// Between attempts to release on shutdown, when the server named no wait:
/// a quarter of a retry period doubling, within the few seconds the
/// shutdown timeout leaves.
const RELEASE_RETRY: Backoff = Backoff {
    first: Duration::from_millis(250),
    max: Duration::from_secs(2),
    jitter: 0.2,
};

/// What the group waits for when our record stays: `expires` is when peers
/// see it expire (a lease duration after our last renew), if we led.
fn left_to_expire(expires: Option<Instant>) -> String {
    match expires {
        Some(at) => format!(
            "the lease is left to expire: peers take over in about {:.1}s",
            at.saturating_duration_since(Instant::now()).as_secs_f64()
        ),
        None => "the lease is left to expire: peers take over within a lease duration".to_owned(),
    }
}

/// Why the machine asked for a release in a turn. It asks in three places
/// only: on [`Input::Release`] (shutdown), for an unhealthy collector (only
/// while it is unhealthy), and when asked to hand over (a hand-over
/// request, or another identity in `spec.preferredHolder`; also after a
/// term ended otherwise, e.g. at its renew deadline), a rebalance of its
/// group's Leases being one such hand-over. How the last term
/// ended is no guide by itself.
fn release_reason(shutdown: bool, after: &Snapshot) -> &'static str {
    if shutdown {
        "shutdown"
    } else if after.last_stop == Some(StopReason::CollectorNotRunning) {
        "collector not running"
    } else if after.collector_healthy == Some(false)
        && after.last_stop != Some(StopReason::HandoverRequested)
    {
        "collector unhealthy"
    } else if after.last_stop == Some(StopReason::Rebalance) {
        REBALANCE
    } else {
        HANDOVER
    }
}

const HANDOVER: &str = "handover requested";
const REBALANCE: &str = "rebalancing: a pod that holds no other Lease was named successor";

/// After `restarts` 401s or ends of the stream in a row: 1 s doubling to
/// 30 s, jittered, so a persistent 401 cannot turn into a stream of LISTs.
fn auth_backoff(restarts: u32) -> Duration {
    WATCH_RESTART.delay(restarts, fastrand::f64())
}

/// The machine's clock readings, now.
pub fn now() -> Now {
    Now {
        instant: Instant::now(),
        boot: BootInstant::now(),
        wall_micros: wall_micros(),
    }
}

/// Resolves with the collector's health when it changes (`None`: the check
/// ended), or never when it is not checked.
async fn health_change(
    health: &mut Option<watch::Receiver<CollectorVerdict>>,
) -> Option<CollectorVerdict> {
    match health {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// Resolves when this pod asks for a step-down, or never when it cannot.
async fn step_aside_asked(asked: &Option<Arc<tokio::sync::Notify>>) {
    match asked {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Resolves with the group's spread when it changes (`None`: its
/// coordinator ended), or never for a Lease alone.
async fn spread_change(spread: &mut Option<watch::Receiver<Spread>>) -> Option<Spread> {
    match spread {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// Resolves with the request in flight, or never when there is none.
async fn in_flight(inflight: &mut Option<BoxFuture<'static, Input>>) -> Input {
    match inflight {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

async fn with_timeout<T>(
    limit: Duration,
    request: BoxFuture<'static, Result<T, ApiError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout(limit, request)
        .await
        .unwrap_or(Err(ApiError::Timeout(limit)))
}

/// How a live holder would have gone at this input: the Lease as read
/// shows a marked release or no Lease; otherwise its record ran out.
fn holder_gone(input: &Input) -> HolderGone {
    let lease = match input {
        Input::Observed(lease) | Input::Read(Ok(lease)) => lease.as_ref(),
        Input::Written(Ok(lease)) => Some(lease),
        _ => return HolderGone::Expired,
    };
    match lease {
        None => HolderGone::Deleted,
        Some(lease) if lease.is_marked_released() => HolderGone::Released,
        Some(_) => HolderGone::Expired,
    }
}

#[derive(Clone, Copy)]
enum HolderGone {
    Released,
    Deleted,
    Expired,
}

fn log_transition(before: &Snapshot, after: &Snapshot, identity: &str, gone: HolderGone) {
    if !before.leading && after.leading {
        let term = after.term.as_ref().map(ToString::to_string);
        tracing::info!(identity, term, "started leading");
    }
    if before.leading && !after.leading {
        let term = before.term.as_ref().map(ToString::to_string);
        // A stop that was asked for (a shutdown, a hand-over, a rebalance)
        // is routine; one the Lease or the API server forced is a warning.
        let graceful = matches!(
            after.last_stop,
            Some(StopReason::Shutdown | StopReason::HandoverRequested | StopReason::Rebalance)
        );
        let reason = after.last_stop.map(|r| r.as_str());
        if graceful {
            tracing::info!(identity, term, reason, "stopped leading");
        } else {
            tracing::warn!(identity, term, reason, "stopped leading");
        }
    }
    if before.holder != after.holder && !after.leading {
        match (before.holder.as_deref(), after.holder.as_deref()) {
            // Nobody holds it now: say how the last holder went, not "changed".
            (Some(previous), None) => match gone {
                HolderGone::Released => {
                    tracing::info!(previous, "the Lease was released by {previous}: no holder");
                }
                HolderGone::Deleted => {
                    tracing::info!(
                        previous,
                        "the Lease was deleted: no holder (it was {previous}'s)"
                    );
                }
                HolderGone::Expired => {
                    tracing::info!(previous, "the record of {previous} expired: no holder");
                }
            },
            (previous, holder) => {
                tracing::info!(holder, previous, "observed leader changed");
            }
        }
    }
}

/// How long the watch has failed without a word: after [`SILENT_PERIODS`]
/// retry periods (list or watch denied while get and update are allowed, a
/// proxy that breaks watches) the election reads the Lease every retry
/// period instead, so it keeps contending.
#[derive(Debug, Default)]
struct WatchSilence {
    failing_since: Option<Instant>,
    last_error: Option<ApiError>,
    /// When the last fallback read went out.
    read_at: Option<Instant>,
    /// The fallback was announced in this episode.
    announced: bool,
}

/// Retry periods of a failing watch before reads take its place.
const SILENT_PERIODS: u32 = 3;

impl WatchSilence {
    fn heard(&mut self) {
        if self.announced {
            tracing::info!("the lease watch works again; no more fallback reads");
        }
        *self = Self::default();
    }

    fn failed(&mut self, error: &ApiError) {
        self.failing_since.get_or_insert_with(Instant::now);
        self.last_error = Some(error.clone());
    }

    /// When the next fallback read is due, if the watch is failing.
    fn read_due(&self, retry: Duration) -> Option<Instant> {
        let since = self.failing_since?;
        Some(match self.read_at {
            Some(last) => last + retry,
            None => since + retry * SILENT_PERIODS,
        })
    }

    /// A read goes out now; the first of an episode says why.
    fn read(&mut self) -> Option<ApiError> {
        self.read_at = Some(Instant::now());
        (!std::mem::replace(&mut self.announced, true))
            .then(|| self.last_error.clone())
            .flatten()
    }
}

/// Flags the heartbeat as ended however the task ends, panics included.
struct EndOnDrop(Arc<Heartbeat>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

#[cfg(test)]
mod tests;
