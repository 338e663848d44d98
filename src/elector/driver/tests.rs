//! Driver tests on paused time (DESIGN.md pyramid, level 2): drivers run
//! against an in-memory [`LeaseStore`] seam, so tokio's auto-advancing clock
//! gives exact instants — no sockets here, which paused time cannot wait on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::api::DynamicObject;
use tokio::sync::watch;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::elector::lease::Lease;
use crate::elector::machine::Settings;

/// One Lease in memory, shared by all candidates, with a watch of its states.
struct Memory {
    object: Mutex<(Option<DynamicObject>, u64)>,
    changes: watch::Sender<Option<Lease>>,
    /// Successful writes: (client, instant).
    writes: Mutex<Vec<(String, Instant)>>,
}

/// One candidate's connection to [`Memory`]; `hang` makes its writes hang,
/// `unauthorized` makes every watch fail with a 401 at once, `watch_fails`
/// every new watch with a transport error, and `cut` the open one.
#[derive(Clone)]
struct Client {
    name: String,
    memory: Arc<Memory>,
    hang: Arc<AtomicBool>,
    unauthorized: Arc<AtomicBool>,
    watch_fails: Arc<AtomicBool>,
    cut: Arc<watch::Sender<u64>>,
    watches_started: Arc<AtomicUsize>,
    reload_hangs: Arc<AtomicBool>,
    /// The next write of this client lands just after someone else's edit
    /// of an annotation (as a follower's claim of the successor slot would).
    edited_first: Arc<AtomicBool>,
    /// The next writes of this client fail with these, in order.
    write_errors: Arc<Mutex<Vec<ApiError>>>,
    /// Every new watch (and GET) fails with this, as a failing server's would.
    failing: Arc<Mutex<Option<ApiError>>>,
    /// Writes are answered although `failing` is set (a server that
    /// recovers for writes first).
    writes_answered: Arc<AtomicBool>,
    /// When each watch, each GET and each write was started.
    watch_starts: Arc<Mutex<Vec<Instant>>>,
    gets: Arc<Mutex<Vec<Instant>>>,
    write_attempts: Arc<Mutex<Vec<Instant>>>,
}

impl Memory {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            object: Mutex::new((None, 1)),
            changes: watch::channel(None).0,
            writes: Mutex::default(),
        })
    }

    fn client(self: &Arc<Self>, name: &str) -> Client {
        Client {
            name: name.into(),
            memory: self.clone(),
            hang: Arc::default(),
            unauthorized: Arc::default(),
            watch_fails: Arc::default(),
            cut: Arc::new(watch::channel(0).0),
            watches_started: Arc::default(),
            reload_hangs: Arc::default(),
            edited_first: Arc::default(),
            write_errors: Arc::default(),
            failing: Arc::default(),
            writes_answered: Arc::default(),
            watch_starts: Arc::default(),
            gets: Arc::default(),
            write_attempts: Arc::default(),
        }
    }

    fn write(
        &self,
        client: &str,
        mut object: DynamicObject,
        create: bool,
    ) -> Result<Lease, ApiError> {
        let mut guard = self.object.lock().unwrap();
        let (stored, rv) = &mut *guard;
        match (create, stored.as_ref()) {
            (true, Some(_)) => return Err(ApiError::Conflict("AlreadyExists".into())),
            (false, None) => return Err(ApiError::NotFound),
            (false, Some(current))
                if current.metadata.resource_version != object.metadata.resource_version =>
            {
                return Err(ApiError::Conflict("Conflict".into()));
            }
            _ => {}
        }
        *rv += 1;
        object.metadata.resource_version = Some(rv.to_string());
        object.metadata.uid.get_or_insert_with(|| "uid-1".into());
        *stored = Some(object.clone());
        let lease = Lease::new(object);
        self.changes.send_replace(Some(lease.clone()));
        self.writes
            .lock()
            .unwrap()
            .push((client.into(), Instant::now()));
        Ok(lease)
    }

    /// Someone else changes an annotation only: a new resourceVersion, the
    /// same record.
    fn annotate(&self) {
        let mut guard = self.object.lock().unwrap();
        let (stored, rv) = &mut *guard;
        let object = stored.as_mut().expect("a Lease to annotate");
        *rv += 1;
        object.metadata.resource_version = Some(rv.to_string());
        object
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("example.com/note".into(), rv.to_string());
        self.changes.send_replace(Some(Lease::new(object.clone())));
    }

    /// An operator deletes the Lease.
    fn delete(&self) {
        self.object.lock().unwrap().0 = None;
        self.changes.send_replace(None);
    }

    fn writes_by(&self, client: &str) -> Vec<Instant> {
        let writes = self.writes.lock().unwrap();
        writes
            .iter()
            .filter(|(c, _)| c == client)
            .map(|(_, at)| *at)
            .collect()
    }

    /// etcd restored from a snapshot without `--bump-revision`: the same
    /// record at an older resourceVersion (what a GET answers; the test
    /// using it reads no watch then).
    fn restore_older(&self) {
        let mut guard = self.object.lock().unwrap();
        let (stored, _) = &mut *guard;
        let object = stored.as_mut().expect("a Lease to restore");
        let rv: u64 = object
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        object.metadata.resource_version = Some((rv - 1).to_string());
        self.changes.send_replace(Some(Lease::new(object.clone())));
    }

    /// The holder stored now.
    fn holder(&self) -> Option<String> {
        let guard = self.object.lock().unwrap();
        let lease = Lease::new(guard.0.clone().expect("a Lease"));
        lease.record().holder
    }

    fn last_write_by(&self, client: &str) -> Instant {
        self.writes
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(c, _)| c == client)
            .unwrap()
            .1
    }
}

impl Client {
    fn write(
        &self,
        object: DynamicObject,
        create: bool,
    ) -> BoxFuture<'static, Result<Lease, ApiError>> {
        let this = self.clone();
        async move {
            if this.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if this.edited_first.swap(false, Ordering::SeqCst) {
                this.memory.annotate();
            }
            this.write_attempts.lock().unwrap().push(Instant::now());
            let injected = {
                let mut errors = this.write_errors.lock().unwrap();
                (!errors.is_empty()).then(|| errors.remove(0))
            };
            let failing = (!this.writes_answered.load(Ordering::SeqCst))
                .then(|| this.failing.lock().unwrap().clone())
                .flatten();
            if let Some(error) = injected.or(failing) {
                return Err(error);
            }
            this.memory.write(&this.name, object, create)
        }
        .boxed()
    }
}

impl LeaseStore for Client {
    fn create(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
        self.write(object, true)
    }

    fn replace(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
        self.write(object, false)
    }

    fn get(&self) -> BoxFuture<'static, Result<Option<Lease>, ApiError>> {
        self.gets.lock().unwrap().push(Instant::now());
        let current = match self.failing.lock().unwrap().clone() {
            Some(error) => Err(error),
            None => Ok(self.memory.changes.borrow().clone()),
        };
        async move { current }.boxed()
    }

    fn watch(&self) -> BoxStream<'static, Result<Option<Lease>, ApiError>> {
        self.watches_started.fetch_add(1, Ordering::SeqCst);
        self.watch_starts.lock().unwrap().push(Instant::now());
        if let Some(error) = self.failing.lock().unwrap().clone() {
            return futures::stream::once(async { Err(error) })
                .chain(futures::stream::pending())
                .boxed();
        }
        if self.unauthorized.load(Ordering::SeqCst) {
            let refused = futures::stream::once(async { Err(ApiError::Unauthorized) });
            return refused.chain(futures::stream::pending()).boxed();
        }
        if self.watch_fails.load(Ordering::SeqCst) {
            let refused =
                futures::stream::once(async { Err(ApiError::Transport("refused".into())) });
            return refused.chain(futures::stream::pending()).boxed();
        }
        let rx = self.memory.changes.subscribe();
        let mut cut = self.cut.subscribe();
        cut.mark_unchanged();
        futures::stream::unfold((rx, cut, true), |(mut rx, mut cut, first)| async move {
            if !first {
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    _ = cut.changed() => {
                        let error = Err(ApiError::Transport("connection reset".into()));
                        return Some((error, (rx, cut, false)));
                    }
                }
            }
            let current = rx.borrow_and_update().clone();
            Some((Ok(current), (rx, cut, false)))
        })
        .boxed()
    }

    fn reload_credentials(&self) -> BoxFuture<'static, ()> {
        let hangs = self.reload_hangs.load(Ordering::SeqCst);
        async move {
            if hangs {
                std::future::pending::<()>().await;
            }
        }
        .boxed()
    }
}

/// A running driver and the instants at which its published `leading` flipped.
struct Candidate {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    flips: Arc<Mutex<Vec<(Instant, bool)>>>,
}

/// What a candidate published: its flips between leading and not; and its
/// gate's acknowledgement, if it has a gate.
struct Flips {
    flips: Arc<Mutex<Vec<(Instant, bool)>>>,
    gate: Option<watch::Receiver<bool>>,
}

impl Outlet for Flips {
    fn publish(&self, snapshot: &Snapshot) {
        let mut flips = self.flips.lock().unwrap();
        let last = flips.last().is_some_and(|(_, leading)| *leading);
        if snapshot.leading != last {
            flips.push((Instant::now(), snapshot.leading));
        }
    }
    fn api_request(&self, _verb: &'static str, _result: Result<(), &ApiError>) {}
    fn renewed(&self, _sent: crate::clock::BootInstant, _latency: Duration) {}
    fn renew_conflict(&self) {}
    fn identity_conflicts(&self, _new: u64) {}
    fn gates_closed(&self) -> BoxFuture<'static, ()> {
        match self.gate.clone() {
            Some(mut gate) => Box::pin(async move {
                if gate.wait_for(|closed| *closed).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }),
            None => Box::pin(std::future::pending()),
        }
    }
}

impl Candidate {
    fn start(client: Client) -> Self {
        Self::start_with(client, Duration::ZERO)
    }

    fn start_with(client: Client, gate_lag: Duration) -> Self {
        Self::start_checked(client, gate_lag, None)
    }

    /// A candidate whose collector's health comes from `health`.
    fn start_checked(
        client: Client,
        gate_lag: Duration,
        health: Option<watch::Receiver<CollectorVerdict>>,
    ) -> Self {
        Self::start_full(client, gate_lag, health, None)
    }

    /// A candidate whose releases may be cut short by its gate: the release
    /// may go out before the gate lag once `gate` says true.
    fn start_gated(client: Client, gate_lag: Duration, gate: watch::Receiver<bool>) -> Self {
        Self::start_full(client, gate_lag, None, Some(gate))
    }

    fn start_full(
        client: Client,
        gate_lag: Duration,
        health: Option<watch::Receiver<CollectorVerdict>>,
        gate: Option<watch::Receiver<bool>>,
    ) -> Self {
        let settings = Settings {
            identity: client.name.clone(),
            namespace: "ns".into(),
            lease_name: "demo".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            holder_labels: Vec::new(),
        };
        let flips = Arc::new(Mutex::new(Vec::new()));
        let outlet = Flips {
            flips: flips.clone(),
            gate,
        };
        let stop = CancellationToken::new();
        let options = ShutdownOptions {
            release: true,
            gate_lag,
            timeout: Duration::from_secs(5),
        };
        // Claims of the successor slot within [2 s, 2.5 s] of seeing a
        // leader: a peer started 3 s before a hand-over is its successor.
        let mut election = Election::new(settings, 42);
        election.set_successor_claim_window(Duration::from_millis(2500));
        let task = tokio::spawn(run(
            Arc::new(client),
            election,
            outlet,
            Heartbeat::new(),
            stop.clone(),
            options,
            Inputs {
                collector_health: health,
                spread: None,
                step_aside: None,
            },
        ));
        Self { stop, task, flips }
    }

    fn flips(&self) -> Vec<(Instant, bool)> {
        self.flips.lock().unwrap().clone()
    }

    fn started_at(&self) -> Option<Instant> {
        self.flips()
            .iter()
            .find(|(_, leading)| *leading)
            .map(|(at, _)| *at)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_leader_steps_down_at_its_renew_deadline_and_the_peer_waits_for_expiry() {
    let memory = Memory::new();
    let a = memory.client("a");
    let hang_a = a.hang.clone();
    let leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    assert!(leader.started_at().is_some(), "a leads a fresh Lease");
    let follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(2)).await;

    // From now on every request of `a` hangs: no answer, no error.
    hang_a.store(true, Ordering::SeqCst);
    let last_renew = memory.last_write_by("a");
    sleep(Duration::from_secs(30)).await;

    let flips = leader.flips();
    let (stepped_down, leading) = flips[1];
    assert!(!leading);
    // Exactly last successful renew sent + renew_deadline, by the timer alone.
    assert_eq!(stepped_down - last_renew, Duration::from_secs(10));
    // The peer takes over one lease duration after it last saw a change,
    // plus at most half a retry period of spread — never before.
    let taken = follower.started_at().expect("b takes over");
    let after = taken - last_renew;
    assert!(
        after >= Duration::from_secs(15),
        "b took over {after:?} after a's last renew"
    );
    assert!(
        after <= Duration::from_secs(16),
        "b took over {after:?} after a's last renew"
    );
    assert!(stepped_down < taken);
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_and_a_watching_peer_takes_over_without_waiting_for_expiry() {
    let memory = Memory::new();
    let mut leader = Candidate::start(memory.client("a"));
    sleep(Duration::from_secs(3)).await;
    let follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(3)).await;
    assert!(follower.started_at().is_none());

    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    let flips = leader.flips();
    assert_eq!(
        flips.last().unwrap(),
        &(signalled, false),
        "not leading at once"
    );
    let released = memory.last_write_by("a");
    sleep(Duration::from_secs(5)).await;
    let taken = follower.started_at().expect("b takes the marked release");
    assert!(taken >= released);
    assert!(
        taken - released <= Duration::from_millis(100),
        "at once: a marked release is free, no acquisition spread"
    );
}

/// A write that lands just before the release (a follower claiming the
/// successor slot, an annotation edit) makes it a 409: the release is sent
/// again from a fresh read, so the successor takes over at once rather than
/// after a whole expiry.
#[tokio::test(start_paused = true)]
async fn a_release_answered_409_by_an_annotation_edit_is_sent_again() {
    let memory = Memory::new();
    let a = memory.client("a");
    let edited_first = a.edited_first.clone();
    let mut leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    let follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(3)).await;

    edited_first.store(true, Ordering::SeqCst);
    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    let released = memory.last_write_by("a");
    assert!(released >= signalled, "a released after the edit");
    sleep(Duration::from_secs(5)).await;
    let taken = follower.started_at().expect("b takes the release");
    assert!(
        taken - released <= Duration::from_millis(100),
        "taken {:?} after the release",
        taken - released
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_request_during_shutdown_is_bounded_by_the_shutdown_timeout() {
    let memory = Memory::new();
    let a = memory.client("a");
    let hang_a = a.hang.clone();
    let mut leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    hang_a.store(true, Ordering::SeqCst);
    sleep(Duration::from_secs(2)).await; // a renew is now in flight, hanging
    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    assert!(Instant::now() - signalled <= Duration::from_secs(5));
    assert_eq!(leader.flips().last().unwrap(), &(signalled, false));
}

/// A leader with a gate that can acknowledge, stopped by SIGTERM; `gate`
/// gets the sender of the gate's "closed" once "not leading" is published,
/// and acts on it. Returns how long after the step-down the release went out.
async fn release_with_one_gate(gate: impl AsyncFnOnce(watch::Sender<bool>)) -> Duration {
    let memory = Memory::new();
    let (closed, gate_says) = watch::channel(false);
    let mut leader = Candidate::start_gated(memory.client("a"), Duration::from_secs(3), gate_says);
    sleep(Duration::from_secs(3)).await;
    assert!(leader.started_at().is_some());
    leader.stop.cancel();
    while leader.flips().len() < 2 {
        sleep(Duration::from_millis(10)).await;
    }
    let stepped_down = leader.flips()[1].0;
    gate(closed).await;
    (&mut leader.task).await.unwrap();
    memory.last_write_by("a") - stepped_down
}

#[tokio::test(start_paused = true)]
async fn the_release_goes_out_once_every_registered_gate_acknowledged() {
    let after = release_with_one_gate(async |closed: watch::Sender<bool>| {
        sleep(Duration::from_millis(500)).await;
        closed.send_replace(true);
    })
    .await;
    assert!(
        after >= Duration::from_millis(500),
        "not before the acknowledgement: {after:?}"
    );
    assert!(
        after < Duration::from_millis(600),
        "not the whole gate lag: {after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_registered_gate_that_never_acknowledges_holds_the_release_for_the_gate_lag() {
    // It dies without a word: the sender goes, "closed" never comes. (Which
    // acknowledgements count is the gate registry's: serve::gate_acks.)
    let after = release_with_one_gate(async |closed: watch::Sender<bool>| drop(closed)).await;
    assert!(after >= Duration::from_secs(3), "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn the_release_waits_for_the_gate_lag_counted_from_the_step_down() {
    let memory = Memory::new();
    let a = memory.client("a");
    let hang_a = a.hang.clone();
    let mut leader = Candidate::start_with(a, Duration::from_secs(3));
    sleep(Duration::from_secs(3)).await;
    let follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(1)).await;

    // a's renews hang: it steps down at its deadline; SIGTERM comes 1 s later.
    hang_a.store(true, Ordering::SeqCst);
    while leader.flips().len() < 2 {
        sleep(Duration::from_millis(100)).await;
    }
    let stepped_down = leader.flips()[1].0;
    sleep(Duration::from_secs(1)).await;
    hang_a.store(false, Ordering::SeqCst);
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    // The release goes out only once the gates had their lag after the
    // step-down: never earlier, so no peer starts while the collector may run.
    let released = memory.last_write_by("a");
    assert!(
        released >= stepped_down + Duration::from_secs(3),
        "{:?}",
        released - stepped_down
    );
    sleep(Duration::from_secs(2)).await;
    assert!(follower.started_at().unwrap() >= released);
}

#[tokio::test(start_paused = true)]
async fn a_watch_refused_with_401_is_restarted_with_backoff_not_in_a_loop() {
    let memory = Memory::new();
    let a = memory.client("a");
    a.unauthorized.store(true, Ordering::SeqCst);
    let started = a.watches_started.clone();
    let _candidate = Candidate::start(a);
    sleep(Duration::from_secs(60)).await;
    // 1, 2, 4, 8, 16, 30 s (+ jitter): about seven in a minute, not thousands.
    let n = started.load(Ordering::SeqCst);
    assert!((3..=9).contains(&n), "{n} watches in a minute");
}

/// The chaos test's overlap (seed 1890576493116111142), on paused time: b
/// saw the Lease deleted, then its watch failed; a created the Lease and an
/// operator deleted it again, unseen by b. A create retried from b's old view
/// would succeed on that second absence while a may still lead.
#[tokio::test(start_paused = true)]
async fn a_failed_watch_is_listed_afresh_and_no_create_goes_out_from_the_stale_view() {
    let memory = Memory::new();
    let t0 = Instant::now();
    let created = |identity: &str| {
        crate::elector::lease::created(
            "ns",
            "demo",
            identity,
            crate::clock::wall_micros(),
            Duration::from_secs(15),
        )
    };
    memory.write("a", created("a"), true).unwrap();
    let b = memory.client("b");
    let (fails, cut, started) = (
        b.watch_fails.clone(),
        b.cut.clone(),
        b.watches_started.clone(),
    );
    let _b = Candidate::start(b);
    sleep(Duration::from_secs(1)).await;
    memory.delete();
    sleep(Duration::from_secs(1)).await;
    fails.store(true, Ordering::SeqCst);
    cut.send_modify(|n| *n += 1);
    sleep(Duration::from_secs(3)).await;
    memory.write("a", created("a"), true).unwrap();
    sleep(Duration::from_secs(1)).await;
    memory.delete();
    // b's old view expires at 1 + 15 s; its watch stays down until 40 s.
    sleep_until(t0 + Duration::from_secs(40)).await;
    assert_eq!(memory.writes_by("b"), [], "no create from a stale view");
    let restarts = started.load(Ordering::SeqCst);
    // 38 s of a refused connection: fresh watches back off, waits drawn
    // up to a doubling ceiling of 0.5 s .. 15 s (about 8 s on average).
    assert!((3..=30).contains(&restarts), "{restarts} watches");
    fails.store(false, Ordering::SeqCst);
    sleep(Duration::from_secs(40)).await;
    let writes = memory.writes_by("b");
    // Listed at the next restart, within a lease duration; the absence it
    // shows counts as a deletion seen then: a duration later, and a
    // spread, b creates.
    assert!(!writes.is_empty(), "b creates once the watch lists again");
    let after = writes[0] - t0;
    assert!(
        after >= Duration::from_secs(55) && after <= Duration::from_secs(40 + 15 + 15 + 2),
        "{after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_credential_reload_stalls_neither_the_loop_nor_shutdown() {
    let memory = Memory::new();
    let a = memory.client("a");
    a.unauthorized.store(true, Ordering::SeqCst);
    a.reload_hangs.store(true, Ordering::SeqCst);
    let started = a.watches_started.clone();
    let mut candidate = Candidate::start(a);
    sleep(Duration::from_secs(30)).await;
    assert!(
        started.load(Ordering::SeqCst) >= 2,
        "the watch was restarted after the reload gave up"
    );
    let signalled = Instant::now();
    candidate.stop.cancel();
    (&mut candidate.task).await.unwrap();
    assert!(Instant::now() - signalled <= Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_collector_ends_the_term_at_once_releases_after_the_gate_lag_and_contends_again_once_healthy()
 {
    let memory = Memory::new();
    let (health, rx) = watch::channel(CollectorVerdict::Fit);
    let gate_lag = Duration::from_secs(3);
    let leader = Candidate::start_checked(memory.client("a"), gate_lag, Some(rx));
    sleep(Duration::from_secs(3)).await;
    assert!(leader.started_at().is_some(), "a leads a fresh Lease");
    let mut follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(3)).await;

    let failed = Instant::now();
    health.send_replace(CollectorVerdict::Unhealthy);
    sleep(Duration::from_secs(5)).await;
    assert_eq!(leader.flips()[1], (failed, false), "not leading at once");
    // The release waits for the gate lag, counted from the step-down, and
    // the watching peer takes it at once, long before any expiry.
    let released = memory.last_write_by("a");
    assert!(released >= failed + gate_lag, "{:?}", released - failed);
    assert!(released - failed <= gate_lag + Duration::from_millis(100));
    let taken = follower.started_at().expect("b takes the marked release");
    // A marked release is free: taken without the acquisition spread.
    assert!(
        taken >= released && taken - released <= Duration::from_millis(100),
        "{:?}",
        taken - released
    );

    // b leaves with a release: the Lease is free, but a does not contend.
    follower.stop.cancel();
    (&mut follower.task).await.unwrap();
    let freed = Instant::now();
    sleep(Duration::from_secs(40)).await;
    assert_eq!(
        memory.last_write_by("a"),
        released,
        "no write while unhealthy"
    );

    health.send_replace(CollectorVerdict::Fit);
    sleep(Duration::from_secs(2)).await;
    let flips = leader.flips();
    let (again, leading) = *flips.last().unwrap();
    assert!(leading, "a leads again once its collector is healthy");
    // Only once healthy, and then within the spread (retry/2): b's release
    // left it free, naming no successor (a, unhealthy, claimed nothing).
    assert!(again >= freed + Duration::from_secs(40));
    assert!(again <= freed + Duration::from_secs(41) + Duration::from_millis(100));
}

/// What the driver logs while a test runs (paused-time tests run on one
/// thread, so a thread-local subscriber sees every task).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn unavailable() -> ApiError {
    ApiError::Server {
        code: 503,
        message: "the server is currently unable to handle the request".into(),
    }
}

/// A rolling update under API Priority and Fairness: the release on
/// shutdown is throttled once. It is sent again after the Retry-After,
/// from a fresh read, so the watching peer takes over then, not after an
/// expiry; the log says throttled and when it retries.
#[tokio::test(start_paused = true)]
async fn a_release_throttled_on_shutdown_is_sent_again_after_its_retry_after() {
    let (logs, _guard) = Logs::capture();
    let memory = Memory::new();
    let a = memory.client("a");
    let write_errors = a.write_errors.clone();
    let gets = a.gets.clone();
    let mut leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    let follower = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(3)).await;

    write_errors
        .lock()
        .unwrap()
        .push(ApiError::TooManyRequests {
            retry_after: Some(Duration::from_secs(1)),
        });
    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    let released = memory.last_write_by("a");
    assert!(
        released >= signalled + Duration::from_secs(1),
        "not before the Retry-After: {:?}",
        released - signalled
    );
    assert!(
        released <= signalled + Duration::from_millis(1100),
        "{:?}",
        released - signalled
    );
    assert!(
        gets.lock().unwrap().iter().any(|&at| at >= signalled),
        "from a fresh read"
    );
    sleep(Duration::from_secs(2)).await;
    let taken = follower.started_at().expect("b takes the release");
    assert!(taken - released <= Duration::from_millis(100));
    let text = logs.text();
    assert!(
        text.contains("throttled (429), retrying after 1.0s"),
        "{text}"
    );
    assert!(!text.contains("retrying with backoff"), "{text}");
}

/// The shutdown release meets a Lease restored at an older resourceVersion:
/// its 409 is followed by a read, which is the server's truth even though
/// its version is older than the one we hold, so the next release lands
/// (taken as a late watch event, it was dropped: 409 until the timeout).
#[tokio::test(start_paused = true)]
async fn a_shutdown_release_after_a_restore_to_an_older_version_lands_from_the_read() {
    let (logs, _guard) = Logs::capture();
    let memory = Memory::new();
    let mut leader = Candidate::start(memory.client("a"));
    sleep(Duration::from_secs(3)).await;
    assert_eq!(memory.holder().as_deref(), Some("a"));
    memory.restore_older();
    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    assert!(
        memory.last_write_by("a") >= signalled,
        "released\n{}",
        logs.text()
    );
    assert_eq!(memory.holder(), None, "the holder is cleared");
}

/// A server failing for longer than the shutdown timeout: the release is
/// tried while time is left, then the log says the lease is left to
/// expire, and when peers take over.
#[tokio::test(start_paused = true)]
async fn a_release_failing_past_the_shutdown_timeout_says_the_lease_is_left_to_expire() {
    let (logs, _guard) = Logs::capture();
    let memory = Memory::new();
    let a = memory.client("a");
    let failing = a.failing.clone();
    let mut leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    *failing.lock().unwrap() = Some(unavailable());
    let signalled = Instant::now();
    leader.stop.cancel();
    (&mut leader.task).await.unwrap();
    assert!(Instant::now() - signalled <= Duration::from_secs(5));
    let text = logs.text();
    let retries = text.matches("retrying after").count();
    assert!(retries >= 2, "retried while time was left: {text}");
    assert!(
        text.contains("the lease is left to expire: peers take over in about"),
        "{text}"
    );
}

/// The release log names why it was released: a leader whose term ended
/// at its renew deadline, then asked to hand over, releases for the
/// hand-over — with a healthy collector, never "collector unhealthy".
#[tokio::test(start_paused = true)]
async fn a_handover_release_after_the_term_ended_otherwise_is_logged_as_the_handover() {
    let (logs, _guard) = Logs::capture();
    let memory = Memory::new();
    let a = memory.client("a");
    let hang_a = a.hang.clone();
    let (_health, rx) = watch::channel(CollectorVerdict::Fit);
    let leader = Candidate::start_checked(a, Duration::ZERO, Some(rx));
    sleep(Duration::from_secs(3)).await;
    assert!(leader.started_at().is_some());
    hang_a.store(true, Ordering::SeqCst);
    while leader.flips().len() < 2 {
        sleep(Duration::from_millis(100)).await;
    }
    // The record is still a's; a hand-over to b is asked for.
    hang_a.store(false, Ordering::SeqCst);
    sleep(Duration::from_secs(3)).await;
    let current = memory.changes.borrow().clone().expect("a Lease");
    let mut object = current.object().clone();
    crate::elector::lease::set_annotation(
        &mut object,
        crate::elector::machine::HANDOVER_ANNOTATION,
        Some("b"),
    );
    memory.write("tool", object, false).unwrap();
    sleep(Duration::from_secs(3)).await;
    let text = logs.text();
    let released = text
        .lines()
        .find(|l| l.contains("released the lease"))
        .unwrap_or_else(|| panic!("a released: {text}"));
    assert!(
        released.contains("why=\"handover requested\""),
        "{released}"
    );
}

/// A follower against a server answering 503 to everything: its watch
/// restarts back off up to a lease duration and it reads nothing
/// meanwhile, rather than a request every second.
#[tokio::test(start_paused = true)]
async fn a_follower_backs_off_while_the_api_server_fails() {
    let memory = Memory::new();
    let a = memory.client("a");
    let _leader = Candidate::start(a);
    sleep(Duration::from_secs(3)).await;
    let b = memory.client("b");
    let (failing, watch_starts, gets, cut) = (
        b.failing.clone(),
        b.watch_starts.clone(),
        b.gets.clone(),
        b.cut.clone(),
    );
    let _follower = Candidate::start(b);
    sleep(Duration::from_secs(3)).await;
    *failing.lock().unwrap() = Some(unavailable());
    cut.send_modify(|n| *n += 1); // the open watch breaks; restarts fail
    sleep(Duration::from_millis(10)).await;
    let from = Instant::now();
    sleep(Duration::from_secs(60)).await;
    let in_minute = |at: &Vec<Instant>| at.iter().filter(|&&t| t >= from).count();
    let (watches, reads) = (
        in_minute(&watch_starts.lock().unwrap()),
        in_minute(&gets.lock().unwrap()),
    );
    let writes = memory.writes_by("b").iter().filter(|&&t| t >= from).count();
    // Before: a relist every ~1.8 s and a read every 2 s, ~60 a minute.
    assert!(watches <= 20, "{watches} watches in a minute");
    assert_eq!(reads, 0, "no fallback reads during the outage");
    assert_eq!(writes, 0);

    // The server is back: the follower watches again within a lease duration.
    *failing.lock().unwrap() = None;
    let back = Instant::now();
    sleep(Duration::from_secs(16)).await;
    let relisted = watch_starts.lock().unwrap().iter().any(|&t| t >= back);
    assert!(
        relisted,
        "watching again: {:?} back {back:?}",
        watch_starts.lock().unwrap()
    );
}

/// A relist answered 429 with Retry-After is not sent again before it.
#[tokio::test(start_paused = true)]
async fn a_relist_throttled_with_retry_after_waits_at_least_that_long() {
    let memory = Memory::new();
    let b = memory.client("b");
    let watch_starts = b.watch_starts.clone();
    *b.failing.lock().unwrap() = Some(ApiError::TooManyRequests {
        retry_after: Some(Duration::from_secs(3)),
    });
    let _follower = Candidate::start(b);
    sleep(Duration::from_secs(30)).await;
    let starts = watch_starts.lock().unwrap().clone();
    assert!(starts.len() >= 3, "{starts:?}");
    for pair in starts.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(3),
            "{:?}",
            pair[1] - pair[0]
        );
    }
}

/// The first request the server answers after an outage returns to the
/// watch at once, not at the end of a wait of up to a lease duration.
#[tokio::test(start_paused = true)]
async fn the_first_answer_after_an_outage_restarts_the_watch_at_once() {
    let memory = Memory::new();
    let _leader = Candidate::start(memory.client("a"));
    sleep(Duration::from_secs(3)).await;
    let b = memory.client("b");
    let (failing, answered, watch_starts, writes, cut) = (
        b.failing.clone(),
        b.writes_answered.clone(),
        b.watch_starts.clone(),
        b.write_attempts.clone(),
        b.cut.clone(),
    );
    let _follower = Candidate::start(b);
    sleep(Duration::from_secs(3)).await;
    *failing.lock().unwrap() = Some(unavailable());
    cut.send_modify(|n| *n += 1);
    // Long enough for the watch's waits to reach their ceiling and for b's
    // view to expire, so it tries to acquire.
    sleep(Duration::from_secs(60)).await;
    // Writes are answered again (409: a renewed meanwhile); the watch
    // still fails, so only a write can end the outage.
    answered.store(true, Ordering::SeqCst);
    let healed = Instant::now();
    sleep(Duration::from_secs(20)).await;
    let first_write = *writes
        .lock()
        .unwrap()
        .iter()
        .find(|&&at| at >= healed)
        .expect("b tries to acquire within a lease duration");
    let restarted = watch_starts
        .lock()
        .unwrap()
        .iter()
        .any(|&at| at >= first_write && at - first_write <= Duration::from_millis(10));
    assert!(
        restarted,
        "no watch right after the answer at {first_write:?}"
    );
}

/// A holder that releases the Lease is said to have released it — by the
/// releasing pod and by its peer — never as a "changed" leader with no
/// holder.
#[tokio::test(start_paused = true)]
async fn a_released_lease_is_logged_as_released_not_as_a_change() {
    let (logs, _guard) = Logs::capture();
    let memory = Memory::new();
    let mut a = Candidate::start(memory.client("a"));
    sleep(Duration::from_secs(3)).await;
    let b = Candidate::start(memory.client("b"));
    sleep(Duration::from_secs(3)).await;
    a.stop.cancel();
    (&mut a.task).await.unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(b.started_at().is_some(), "b took the release");
    let text = logs.text();
    assert!(
        text.contains("the Lease was released by a: no holder"),
        "{text}"
    );
    assert!(!text.contains("expired: no holder"), "{text}");

    for line in text
        .lines()
        .filter(|l| l.contains("observed leader changed"))
    {
        assert!(
            line.contains("holder="),
            "a change names its new holder: {line}"
        );
    }
}
