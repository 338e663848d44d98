//! The sidecar (`leader-gate serve`) as one function: binds the listeners,
//! starts the election driver, the collector health check and the HTTP
//! servers, and runs the shutdown sequence on SIGTERM/SIGINT (step down,
//! gate lag or every gate's acknowledgement, release, stop serving; a second signal exits at once). Kept in
//! the library so the binary stays thin and the demo can run real sidecars.

use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{ServeConfig, resolve_namespace};
use crate::elector::driver;
use crate::elector::driver::Heartbeat;
use crate::elector::incarnation::StateDir;
use crate::elector::lease_client::{self, KubeLeaseStore};
use crate::elector::machine::{Election, Settings};
use crate::exit;
use crate::serve::collector_health;
use crate::serve::gate_acks::GateAcks;
use crate::serve::kube_events::{self, Recorder};
use crate::serve::metrics::Metrics;
use crate::serve::published::Publisher;
use crate::serve::routes::{self, AppState};
use crate::serve::routing;
use crate::serve::server::{self, Limits};
use crate::serve::transitions::EventLog;

/// Events kept for `Last-Event-ID` resumption.
const EVENT_HISTORY: usize = 1024;
/// Events a subscriber may fall behind before it is told it lagged.
const EVENT_BUFFER: usize = 256;

/// Runs the sidecar until SIGTERM or SIGINT and the hand-over that follows;
/// the exit code says how it ended (see [`crate::exit`]).
pub async fn run(config: ServeConfig) -> ExitCode {
    let mut signals = Signals::new();
    // Listen first: /leader answers 503 even before the API server does (G8).
    let (gate, admin) = match (
        TcpListener::bind(config.listen).await,
        TcpListener::bind(config.admin_listen).await,
    ) {
        (Ok(gate), Ok(admin)) => (gate, admin),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, listen = %config.listen, admin_listen = %config.admin_listen, "cannot bind a listener");
            return ExitCode::from(exit::OSERR);
        }
    };
    // With port 0 the kernel picks: say what was bound.
    if let (Ok(gate), Ok(admin)) = (gate.local_addr(), admin.local_addr()) {
        tracing::info!(gate = %gate, admin = %admin, "listening");
    }
    let kube_config = match lease_client::infer_config().await {
        Ok(kube_config) => kube_config,
        Err(error) => {
            tracing::error!(%error, "no kube configuration: set KUBECONFIG or run in a pod with a service account");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let namespace = match resolve_namespace(
        config.lease_namespace.as_deref(),
        &kube_config.default_namespace,
    ) {
        Ok(namespace) => namespace,
        Err(error) => {
            eprintln!("leader-gate: {error}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let store = match KubeLeaseStore::new(kube_config, &namespace, &config.lease_name) {
        Ok(store) => store,
        Err(error) => {
            tracing::error!(%error, "cannot build a Kubernetes client");
            return ExitCode::from(exit::CONFIG);
        }
    };

    let settings = Settings {
        identity: config.identity.clone(),
        namespace: namespace.clone(),
        lease_name: config.lease_name.clone(),
        lease_duration: config.lease_duration,
        renew_deadline: config.renew_deadline,
        retry_period: config.retry_period,
    };
    tracing::info!(
        version = %env!("CARGO_PKG_VERSION"), api_server = %store.server(),
        identity = %settings.identity, namespace = %namespace, lease = %settings.lease_name,
        lease_duration = ?settings.lease_duration, renew_deadline = ?settings.renew_deadline,
        retry_period = ?settings.retry_period, listen = %config.listen,
        admin_listen = %config.admin_listen, gate_lag = ?config.shutdown.gate_lag,
        shutdown_timeout = ?config.shutdown.timeout, "leader-gate starting"
    );
    let events = EventLog::new(&config.identity, EVENT_HISTORY, EVENT_BUFFER);
    let mut metrics = Metrics::new(&namespace, &config.lease_name);
    if config.collector_health.is_some() {
        metrics = metrics.with_collector_health();
    }
    let metrics = Arc::new(metrics);
    // --state-dir: locked for this process; what a previous process of this
    // pod left there is read before anything is written.
    let (state_dir, previous) = match &config.state_dir {
        None => (None, None),
        Some(dir) => match StateDir::open(dir, &namespace, &config.lease_name) {
            Ok(state_dir) => {
                let previous = state_dir.previous(&config.identity, &namespace, &config.lease_name);
                (Some(state_dir), previous)
            }
            Err(error) => {
                eprintln!("leader-gate: invalid --state-dir: {error}");
                return ExitCode::from(exit::USAGE);
            }
        },
    };
    let (mut publisher, state) = Publisher::new(events.clone(), metrics.clone());
    // Gates register here; with --gate-acks their acknowledgements may end
    // the gate lag before a release.
    let gate_acks = GateAcks::for_sidecar(
        config.max_subscribers,
        config.gate_acks,
        config.renew_deadline,
    );
    if config.gate_acks {
        publisher = publisher.with_gate_acks(gate_acks.clone());
    }
    if let Some(state_dir) = state_dir {
        publisher = publisher.with_state_dir(state_dir);
    }
    let role = state.clone();
    // Kubernetes Events (--record-events): queued by the publisher, sent by a
    // task of their own on the Lease's client.
    let mut recorder_task = None;
    if config.record_events {
        let subject = kube_events::Subject {
            namespace: namespace.clone(),
            lease_name: config.lease_name.clone(),
            identity: config.identity.clone(),
        };
        let (recorder, task) = Recorder::spawn(subject, Arc::new(store.clone()));
        publisher = publisher.with_recorder(recorder);
        recorder_task = Some(task);
    }
    // Leader routing (--route-service): a task of its own on the Lease's
    // client, following the published state like the HTTP gates.
    let routing_task = config.route.clone().map(|options| {
        routing::spawn(
            store.clone(),
            namespace.clone(),
            options,
            state.clone(),
            config.retry_period,
            config.lease_duration,
            &gate_acks,
        )
    });
    let heartbeat = Heartbeat::new();
    let stop_election = CancellationToken::new();
    let stop_serving = CancellationToken::new();
    let app = AppState {
        state,
        identity: config.identity.as_str().into(),
        namespace: namespace.as_str().into(),
        lease_name: config.lease_name.as_str().into(),
        heartbeat: heartbeat.clone(),
        stuck_after: config.lease_duration,
        events,
        metrics,
        subscribers: Arc::new(Semaphore::new(config.max_subscribers)),
        keep_alive: config.events_keep_alive,
        shutdown: stop_serving.clone(),
        gate_acks,
    };

    spawn_heap_trim();
    let servers = [
        tokio::spawn(server::serve(
            gate,
            routes::gate_router(app.clone()),
            stop_serving.clone(),
            Limits::for_gate(config.max_subscribers),
        )),
        tokio::spawn(server::serve(
            admin,
            routes::admin_router(app),
            stop_serving.clone(),
            Limits::default(),
        )),
    ];
    let mut election = Election::new(settings, fastrand::u64(..));
    election.set_successor_claim_window(config.successor_claim_window);
    if let Some(previous) = &previous {
        let term = format!("{}/{}", previous.uid, previous.transitions);
        match election.resume(previous, driver::now()) {
            Ok(()) => {
                tracing::info!(%term, "found the last write of this pod's previous process: its term resumes if the lease still shows that write")
            }
            Err(why) => tracing::info!(%term, "not resuming the previous process's term: {why}"),
        }
    }
    let collector_health = config
        .collector_health
        .clone()
        .map(|options| collector_health::spawn(options, role, stop_election.clone()));
    let driver = tokio::spawn(driver::run(
        Arc::new(store),
        election,
        publisher,
        heartbeat,
        stop_election.clone(),
        config.shutdown.clone(),
        collector_health,
    ));

    let mut driver = driver;
    let first = match signal_or_end(signals.next(), &mut driver).await {
        Ok(first) => first,
        Err(why) => {
            // The election can only end on cancellation: anything else (a
            // panic) leaves a process that can never lead again. Say so and
            // exit non-zero, so the kubelet restarts it and counts it.
            tracing::error!("BUG: the election task ended ({why}); exiting");
            stop_serving.cancel();
            for server in servers {
                let _ = tokio::time::timeout(SERVER_GRACE, server).await;
            }
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    tracing::info!(
        signal = first.name,
        "shutting down: stepping down, then releasing the lease"
    );
    tokio::spawn(async move {
        let second = signals.next().await;
        tracing::warn!(signal = second.name, "second signal: exiting at once");
        std::process::exit(128 + second.number);
    });
    let deadline = tokio::time::Instant::now() + config.shutdown.timeout;
    stop_election.cancel();
    // The driver bounds its own hand-over by the shutdown timeout (counted
    // from a moment later than ours: allow a grace), and only then do the
    // event streams end, after the hand-over's events.
    let _ = tokio::time::timeout_at(deadline + SERVER_GRACE, driver).await;
    // The driver is done with the publisher, so the recorder's queue ends:
    // give the last Events (the stop) their one attempt, within the bound.
    if let Some(task) = recorder_task {
        let _ = tokio::time::timeout_at(deadline + SERVER_GRACE, task).await;
    }
    // The slice no longer names this pod (it was taken out when the step-down
    // was published, during the gate lag), or that could not be done in time.
    if let Some(mut task) = routing_task
        && tokio::time::timeout_at(deadline + SERVER_GRACE, &mut task)
            .await
            .is_err()
    {
        tracing::warn!(
            "routing: the EndpointSlice could not be updated before the shutdown timeout"
        );
        task.abort();
    }
    stop_serving.cancel();
    for server in servers {
        let _ = tokio::time::timeout_at(deadline + 2 * SERVER_GRACE, server).await;
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// The first signal, or why the election task ended before one came.
async fn signal_or_end<T>(
    signal: impl Future<Output = T>,
    task: &mut tokio::task::JoinHandle<()>,
) -> Result<T, String> {
    tokio::select! {
        first = signal => Ok(first),
        ended = task => Err(match ended {
            Err(error) if error.is_panic() => format!("it panicked: {error}"),
            Err(error) => error.to_string(),
            Ok(()) => "it returned".to_owned(),
        }),
    }
}

/// How often freed heap memory is handed back to the system.
const HEAP_TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Hands freed heap memory back to the system every [`HEAP_TRIM_PERIOD`]:
/// glibc's malloc keeps what a burst of connections or subscribers used
/// (freed, but between live allocations), so the resident memory would stay
/// at its peak. On a heap this small a trim takes microseconds.
fn spawn_heap_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async {
        let mut every = tokio::time::interval(HEAP_TRIM_PERIOD);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // SAFETY: malloc_trim only returns the allocator's free pages.
            unsafe { libc::malloc_trim(0) };
        }
    });
}

/// Time the HTTP servers get to finish answering after the hand-over.
const SERVER_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// SIGTERM and SIGINT, registered once at start so that a second signal
/// during shutdown is never missed.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

struct Received {
    name: &'static str,
    number: i32,
}

impl Signals {
    fn new() -> Self {
        Self {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        }
    }

    async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.term.recv() => Received { name: "SIGTERM", number: libc::SIGTERM },
            _ = self.int.recv() => Received { name: "SIGINT", number: libc::SIGINT },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_election_task_is_noticed_before_any_signal() {
        let mut task = tokio::spawn(async { panic!("boom") });
        let never = std::future::pending::<()>();
        let why = signal_or_end(never, &mut task).await.unwrap_err();
        assert!(why.contains("panicked"), "{why}");
        let mut running = tokio::spawn(std::future::pending::<()>());
        assert_eq!(signal_or_end(async { 15 }, &mut running).await, Ok(15));
    }
}
