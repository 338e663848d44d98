//! The sidecar (`leader-gate serve`) as one function: binds the listeners,
//! starts each Lease ([`LeaseStack`]) and, for several, their spreading,
//! then the HTTP servers, and runs the shutdown sequence on SIGTERM/SIGINT
//! (every Lease steps down, waits its gate lag or every gate's
//! acknowledgement, releases; then serving stops; a second signal exits at
//! once). Kept in the library so the binary stays thin and the demo can run
//! real sidecars.

use std::process::ExitCode;
use std::sync::Arc;

use axum::Extension;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::args::resolve_namespace;
use crate::elector::lease_client::{self, KubeLeaseStore};
use crate::elector::machine::Spread;
use crate::exit;
use crate::serve::app_state::{AppState, StreamSlots};
use crate::serve::config::ServeConfig;
use crate::serve::gate_channel::{self, GateChannel};
use crate::serve::lease_stack::{LeaseStack, Process};
use crate::serve::metrics::MetricsRegistry;
use crate::serve::published::LeaderState;
use crate::serve::routes;
use crate::serve::server::{self, Limits, Routes};
use crate::serve::spreading;

/// Binds the listener of `flag`, or says why not (and, for a port in use,
/// the way out: under `hostNetwork` every workload of a node shares its
/// ports, so a second one running leader-gate needs ports of its own).
async fn bind(flag: &str, address: std::net::SocketAddr) -> Option<TcpListener> {
    match TcpListener::bind(address).await {
        Ok(listener) => Some(listener),
        Err(error) => {
            let way_out = if error.kind() == std::io::ErrorKind::AddrInUse {
                // What else names the port: the gates and the hook reach the
                // gate listener; the probes and the containerPort the admin one.
                let to_match = if flag == "--admin-listen" {
                    "the probes' port and the containerPort"
                } else {
                    "the gates' and the preStop hook's --url"
                };
                format!(
                    "another process of this pod's network holds {address}; with hostNetwork, another \
                     workload on this node may run leader-gate: give each workload on a node ports of \
                     its own ({flag}, with {to_match} to match; a pod gated by `leader-gate inject`: \
                     run it again with --host-port-base)"
                )
            } else {
                String::new()
            };
            tracing::error!(%error, flag, %address, way_out, "cannot bind a listener");
            None
        }
    }
}

/// Runs the sidecar until SIGTERM or SIGINT and the hand-over that follows;
/// the exit code says how it ended (see [`crate::exit`]).
pub async fn run(config: ServeConfig) -> ExitCode {
    let mut signals = Signals::new();
    // Listen first: /leader answers 503 even before the API server does (G8).
    let (gate, admin) = match (
        bind("--listen", config.listen).await,
        bind("--admin-listen", config.admin_listen).await,
    ) {
        (Some(gate), Some(admin)) => (gate, admin),
        _ => return ExitCode::from(exit::OSERR),
    };
    // With port 0 the kernel picks: say what was bound.
    if let (Ok(gate), Ok(admin)) = (gate.local_addr(), admin.local_addr()) {
        tracing::info!(gate = %gate, admin = %admin, "listening");
    }
    let gate_socket = match &config.gate_channel {
        GateChannel::Socket(path) => match gate_channel::bind_socket(path).await {
            Ok(socket) => Some(socket),
            Err(error) => {
                tracing::error!(%error, socket = %path.display(), "cannot bind the gate socket");
                return ExitCode::from(exit::OSERR);
            }
        },
        _ => None,
    };
    config.gate_channel.log();
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
    let Some(first_lease) = config.leases.first() else {
        eprintln!("leader-gate: invalid --lease-name: at least one is needed");
        return ExitCode::from(exit::USAGE);
    };
    let store = match KubeLeaseStore::new(kube_config, &namespace, first_lease) {
        Ok(store) => store,
        Err(error) => {
            tracing::error!(%error, "cannot build a Kubernetes client");
            return ExitCode::from(exit::CONFIG);
        }
    };
    tracing::info!(
        version = %env!("CARGO_PKG_VERSION"), api_server = %store.server(),
        identity = %config.identity, namespace = %namespace, lease = %config.leases.join(","),
        lease_duration = ?config.lease_duration, renew_deadline = ?config.renew_deadline,
        retry_period = ?config.retry_period, listen = %config.listen,
        admin_listen = %config.admin_listen, gate_lag = ?config.shutdown.gate_lag,
        shutdown_timeout = ?config.shutdown.timeout, "leader-gate starting"
    );
    let stop_election = CancellationToken::new();
    let stop_serving = CancellationToken::new();
    let subscribers = StreamSlots::new(config.max_subscribers);
    let metrics = MetricsRegistry::new(config.collector_health.is_some());
    let process = Process {
        config: &config,
        namespace: &namespace,
        store: &store,
        subscribers: &subscribers,
        metrics: &metrics,
        stop_election: &stop_election,
        stop_serving: &stop_serving,
    };
    // Several Leases: each election hears what this process holds of the
    // others, from a coordinator that follows them all.
    let several = config.leases.len() > 1;
    let (spread_senders, spread_inputs): (Vec<_>, Vec<_>) = config
        .leases
        .iter()
        .map(|_| watch::channel(Spread::default()))
        .unzip();
    let mut leases = Vec::with_capacity(config.leases.len());
    for (shard, (name, spread)) in config.leases.iter().zip(spread_inputs).enumerate() {
        // One state directory per Lease (each locked on its own): the
        // directory itself for a Lease alone, a subdirectory for several.
        let state_dir = config
            .state_dir
            .as_ref()
            .map(|dir| if several { dir.join(name) } else { dir.clone() });
        match LeaseStack::start(&process, name, shard, state_dir, several.then_some(spread)) {
            Ok(lease) => leases.push(lease),
            Err(error) => {
                eprintln!("leader-gate: {error}");
                return ExitCode::from(exit::USAGE);
            }
        }
    }
    let _spreading = several.then(|| {
        spreading::spawn(
            config.identity.clone(),
            leases.iter().map(LeaseStack::state).collect(),
            spread_senders,
        )
    });
    let apps: Vec<AppState> = leases.iter().map(|lease| lease.app.clone()).collect();

    spawn_heap_trim();
    let gate_routes = Routes {
        router: routes::gate_router(&apps).layer(Extension(Arc::new(config.gate_channel.clone()))),
        shortcut: routes::shortcut(&apps),
    };
    let admin_routes = Routes {
        router: routes::admin_router(&apps),
        shortcut: routes::shortcut(&apps),
    };
    let mut servers = vec![
        tokio::spawn(server::serve(
            gate,
            gate_routes.clone(),
            stop_serving.clone(),
            Limits::for_gate(config.max_subscribers),
        )),
        tokio::spawn(server::serve(
            admin,
            admin_routes,
            stop_serving.clone(),
            Limits::default(),
        )),
    ];
    // The same routes on the gate socket; its connections count apart.
    if let Some(socket) = gate_socket {
        servers.push(tokio::spawn(server::serve(
            socket,
            gate_routes,
            stop_serving.clone(),
            Limits::for_gate(config.max_subscribers),
        )));
    }

    let first = match signal_or_end(signals.next(), &mut leases).await {
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
    // Per Lease, what the shutdown does with it: a pod that does not lead
    // (it handed over a moment ago, say) has nothing to step down from.
    for lease in &leases {
        let plan = shutdown_plan(&lease.app.state.borrow(), config.shutdown.release);
        tracing::info!(signal = first.name, lease = %lease.app.lease_name, "shutting down: {plan}");
    }
    tokio::spawn(async move {
        let second = signals.next().await;
        tracing::warn!(signal = second.name, "second signal: exiting at once");
        std::process::exit(128 + second.number);
    });
    let deadline = tokio::time::Instant::now() + config.shutdown.timeout;
    stop_election.cancel();
    // Each driver bounds its own hand-over by the shutdown timeout (counted
    // from a moment later than ours: allow a grace), and only then do the
    // event streams end, after the hand-over's events. The Leases hand over
    // side by side.
    futures::future::join_all(
        leases
            .into_iter()
            .map(|lease| lease.finish(deadline + SERVER_GRACE)),
    )
    .await;
    stop_serving.cancel();
    for server in servers {
        let _ = tokio::time::timeout_at(deadline + 2 * SERVER_GRACE, server).await;
    }
    if let GateChannel::Socket(path) = &config.gate_channel {
        let _ = std::fs::remove_file(path); // a restart binds it anew anyway
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// The first signal, or why an election task ended before one came.
async fn signal_or_end<T>(
    signal: impl Future<Output = T>,
    leases: &mut [LeaseStack],
) -> Result<T, String> {
    let tasks: Vec<_> = leases.iter_mut().map(LeaseStack::driver).collect();
    signal_or_first_end(signal, tasks).await
}

async fn signal_or_first_end<T>(
    signal: impl Future<Output = T>,
    tasks: Vec<&mut tokio::task::JoinHandle<()>>,
) -> Result<T, String> {
    tokio::select! {
        first = signal => Ok(first),
        (ended, _, _) = futures::future::select_all(tasks) => Err(match ended {
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

/// What the shutdown does with a Lease, as its published state shows it
/// when the signal arrives.
fn shutdown_plan(state: &LeaderState, release: bool) -> &'static str {
    match (state.leading, state.own_record, release) {
        (true, _, true) => "stepping down, then releasing the lease",
        (true, _, false) => {
            "stepping down; not releasing the lease (--release-on-shutdown=false): peers take it once it expires"
        }
        (false, true, true) => "not leading; releasing this pod's record of the lease",
        (false, true, false) => {
            "not leading; this pod's record of the lease is left to expire (--release-on-shutdown=false)"
        }
        (false, false, _) => "not leading: nothing to step down from or release",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shutdown_line_says_what_a_pod_that_does_not_lead_does() {
        let follower = LeaderState::initial();
        assert_eq!(
            shutdown_plan(&follower, true),
            "not leading: nothing to step down from or release"
        );
        let stepped_down = LeaderState {
            own_record: true,
            ..LeaderState::initial()
        };
        assert_eq!(
            shutdown_plan(&stepped_down, true),
            "not leading; releasing this pod's record of the lease"
        );
        let leader = LeaderState {
            leading: true,
            own_record: true,
            ..LeaderState::initial()
        };
        assert_eq!(
            shutdown_plan(&leader, true),
            "stepping down, then releasing the lease"
        );
        assert!(shutdown_plan(&leader, false).contains("not releasing"));
        assert!(shutdown_plan(&stepped_down, false).contains("left to expire"));
    }

    #[tokio::test]
    async fn a_panicking_election_task_is_noticed_before_any_signal() {
        let mut task = tokio::spawn(async { panic!("boom") });
        let never = std::future::pending::<()>();
        let mut running = tokio::spawn(std::future::pending::<()>());
        let why = signal_or_first_end(never, vec![&mut running, &mut task])
            .await
            .unwrap_err();
        assert!(why.contains("panicked"), "{why}");
        let mut running = tokio::spawn(std::future::pending::<()>());
        assert_eq!(
            signal_or_first_end(async { 15 }, vec![&mut running]).await,
            Ok(15)
        );
    }
}
