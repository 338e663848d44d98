//! The `leader-gate` binary: parses flags, wires the election driver to the
//! HTTP listeners (`serve`) or runs a client (`watch`, `exec`, `file-gate`,
//! `status`, `wait`), and owns signals and exit codes (sysexits):
//!
//! - 0: clean shutdown after SIGTERM/SIGINT
//! - 64 (EX_USAGE): an invalid flag, named in one line
//! - 70 (EX_SOFTWARE): the election task ended unexpectedly (a bug)
//! - 71 (EX_OSERR): a listener could not be bound
//! - 73 (EX_CANTCREAT): `install` could not write its copy
//! - 78 (EX_CONFIG): no usable kube configuration (kubeconfig / in-cluster)
//! - 128 + signal: a second signal during shutdown exits at once

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use leader_gate::client::{exec, file_gate, status, watch};
use leader_gate::collector_health;
use leader_gate::config::{
    Cli, ClientArgs, Command, ExecArgs, FileGateArgs, InstallArgs, LogFormat, ServeConfig,
    WaitArgs, WatchArgs, resolve_namespace,
};
use leader_gate::driver;
use leader_gate::election::{Election, Settings};
use leader_gate::events::EventLog;
use leader_gate::http::{self, AppState};
use leader_gate::lease_client::{self, KubeLeaseStore};
use leader_gate::metrics::Metrics;
use leader_gate::server::{self, Limits};
use leader_gate::state::{Heartbeat, Publisher};

const EX_USAGE: u8 = 64;
/// Events kept for `Last-Event-ID` resumption.
const EVENT_HISTORY: usize = 1024;
/// Events a subscriber may fall behind before it is told it lagged.
const EVENT_BUFFER: usize = 256;
const EX_OSERR: u8 = 71;
const EX_SOFTWARE: u8 = 70;
const EX_CANTCREAT: u8 = 73;
const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            // --help, --version
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            // One line: clap's message up to its usage block.
            let rendered = error.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .take_while(|line| !line.starts_with("Usage:"))
                .filter(|line| !line.is_empty())
                .collect();
            eprintln!(
                "leader-gate: {}",
                message.join(" ").trim_start_matches("error: ")
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let args = match cli.command {
        Command::Serve(args) => args,
        client => return runtime.block_on(run_client(client)),
    };
    let config = match args.validate(|name| std::env::var(name).ok(), hostname) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("leader-gate: {error}");
            return ExitCode::from(EX_USAGE);
        }
    };
    init_logging(config.log_format);
    runtime.block_on(serve(config))
}

async fn serve(config: ServeConfig) -> ExitCode {
    let mut signals = Signals::new();
    // Listen first: /leader answers 503 even before the API server does (G8).
    let (gate, admin) = match (
        TcpListener::bind(config.listen).await,
        TcpListener::bind(config.admin_listen).await,
    ) {
        (Ok(gate), Ok(admin)) => (gate, admin),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, listen = %config.listen, admin_listen = %config.admin_listen, "cannot bind a listener");
            return ExitCode::from(EX_OSERR);
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
            return ExitCode::from(EX_CONFIG);
        }
    };
    let namespace = match resolve_namespace(
        config.lease_namespace.as_deref(),
        &kube_config.default_namespace,
    ) {
        Ok(namespace) => namespace,
        Err(error) => {
            eprintln!("leader-gate: {error}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let store = match KubeLeaseStore::new(kube_config, &namespace, &config.lease_name) {
        Ok(store) => store,
        Err(error) => {
            tracing::error!(%error, "cannot build a Kubernetes client");
            return ExitCode::from(EX_CONFIG);
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
        identity = %settings.identity, namespace = %namespace, lease = %settings.lease_name,
        lease_duration = ?settings.lease_duration, renew_deadline = ?settings.renew_deadline,
        retry_period = ?settings.retry_period, listen = %config.listen,
        admin_listen = %config.admin_listen, "leader-gate starting"
    );
    let events = EventLog::new(&config.identity, EVENT_HISTORY, EVENT_BUFFER);
    let mut metrics = Metrics::new(&namespace, &config.lease_name);
    if config.collector_health.is_some() {
        metrics = metrics.with_collector_health();
    }
    let metrics = Arc::new(metrics);
    let (publisher, state) = Publisher::new(events.clone(), metrics.clone());
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
    };

    let servers = [
        tokio::spawn(server::serve(
            gate,
            http::gate_router(app.clone()),
            stop_serving.clone(),
            Limits::for_gate(config.max_subscribers),
        )),
        tokio::spawn(server::serve(
            admin,
            http::admin_router(app),
            stop_serving.clone(),
            Limits::default(),
        )),
    ];
    let election = Election::new(settings, fastrand::u64(..));
    let collector_health = config
        .collector_health
        .clone()
        .map(|options| collector_health::spawn(options, stop_election.clone()));
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
            return ExitCode::from(EX_SOFTWARE);
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

/// The client subcommands: they know the sidecar only through its gate listener.
async fn run_client(command: Command) -> ExitCode {
    match command {
        Command::Serve(_) => unreachable!("serve is not a client"),
        Command::Watch(WatchArgs { client, json }) => {
            // Returns only when the output closed (the reader of a pipe exited).
            let _closed = watch::run(client.url, json, std::io::stdout()).await;
            ExitCode::SUCCESS
        }
        Command::Exec(ExecArgs {
            client,
            grace,
            command,
        }) => {
            let options = exec::ExecOptions {
                url: client.url,
                grace,
                command,
            };
            match exec::run(options).await {
                Ok(code) => ExitCode::from(code),
                Err(error) => {
                    eprintln!("leader-gate exec: {error}");
                    ExitCode::from(error.exit_code())
                }
            }
        }
        Command::FileGate(FileGateArgs {
            client,
            reload_url,
            mode,
            mappings,
        }) => {
            let options = file_gate::FileGateOptions {
                url: client.url,
                reload: reload_url,
                mode,
                mappings,
            };
            file_gate::run(options).await;
            ExitCode::SUCCESS
        }
        Command::Status(ClientArgs { url }) => {
            let (verdict, text) = status::status(&url).await;
            match verdict {
                status::Status::Unknown => eprintln!("leader-gate status: {text}"),
                _ => println!("{text}"),
            }
            ExitCode::from(verdict as u8)
        }
        Command::Install(InstallArgs { dest }) => match install(&dest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!(
                    "leader-gate install: cannot copy to {}: {error}",
                    dest.display()
                );
                ExitCode::from(EX_CANTCREAT)
            }
        },
        Command::Wait(WaitArgs { client, timeout }) => {
            if status::wait(client.url, timeout).await {
                ExitCode::SUCCESS
            } else {
                eprintln!("leader-gate wait: not leading after {timeout:?}");
                ExitCode::FAILURE
            }
        }
    }
}

/// Copies the running executable to `dest` (through a temporary file and a
/// rename, so a container never starts a half-copied binary).
fn install(dest: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe()?;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let temporary = dest.with_file_name(format!(".{name}.tmp"));
    std::fs::copy(&me, &temporary)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&temporary, dest)
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

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname writes a
    // NUL-terminated name into it (truncated if longer).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube's own crates repeat every failed request (a watch refused
        // every 1.5 s, a refused connection every few seconds); leader-gate
        // says each once per episode in its own words. RUST_LOG overrides.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,kube_client=off,kube_runtime=off")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
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
