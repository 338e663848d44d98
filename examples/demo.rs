//! leader-gate without a cluster, in one command:
//!
//!     cargo run --release --example demo              # until Ctrl-C
//!     cargo run --release --example demo -- --duration 30s
//!
//! It starts the fake Kubernetes Lease API server the tests use (real HTTP on
//! 127.0.0.1, modelled on exchanges recorded from a real kube-apiserver) and
//! three real `leader-gate serve` processes against it, prints every
//! leadership transition as their event streams report it, then stops the
//! leader gracefully (SIGTERM: a marked release, the peer takes over at once)
//! and kills the next one (SIGKILL: the peer waits for the lease to expire),
//! restarting each. Then it says what to try against the sidecars, which stay
//! up until Ctrl-C or `--duration`. It exits non-zero if it saw no hand-over.

#[path = "../tests/support"]
mod support {
    pub mod fake_apiserver;
}

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use leader_gate::client::feed::{Feed, Signal};
use leader_gate::client::url::GateUrl;
use leader_gate::config::parse_duration;
use support::fake_apiserver::FakeApiServer;

const NAMESPACE: &str = "demo";
const LEASE: &str = "demo-leader";
const NAMES: [&str; 3] = ["pod-a", "pod-b", "pod-c"];
/// Short timings so the demo moves: a crashed leader is replaced in ~4 s.
const TIMING: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
];

fn main() -> ExitCode {
    // The sidecars are this very program, run as `demo serve …`: the same
    // code as `leader-gate serve`, as real processes, without a second build.
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return run_sidecar();
    }
    tokio::runtime::Runtime::new()
        .expect("a tokio runtime")
        .block_on(demo())
}

/// `demo serve …`: exactly `leader-gate serve …`.
fn run_sidecar() -> ExitCode {
    use clap::Parser;
    let cli = leader_gate::config::Cli::parse_from(
        std::iter::once("leader-gate".to_owned()).chain(std::env::args().skip(1)),
    );
    let leader_gate::config::Command::Serve(args) = cli.command else {
        unreachable!("only serve is run this way")
    };
    let config = match args.validate(|name| std::env::var(name).ok(), || None) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("leader-gate: {error}");
            return ExitCode::from(leader_gate::exit::USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(leader_gate::sidecar::run(config))
}

async fn demo() -> ExitCode {
    let duration = match parse_args() {
        Ok(duration) => duration,
        Err(message) => {
            eprintln!("demo: {message}\nusage: demo [--duration 30s]");
            return ExitCode::from(64);
        }
    };
    let binary = match sidecar_binary() {
        Ok(binary) => binary,
        Err(message) => {
            eprintln!("demo: {message}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("leader-gate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    say(
        started,
        &format!(
            "fake Kubernetes API server on {} (Lease {NAMESPACE}/{LEASE})",
            api.url()
        ),
    );

    // Terms started anywhere: every one after the first is a hand-over.
    let starts = Arc::new(AtomicUsize::new(0));
    let mut pods: Vec<Pod> = NAMES
        .iter()
        .map(|name| Pod::start(&binary, &api, &dir, name, None, started))
        .collect();
    for pod in &pods {
        follow(pod.name, pod.gate, started, starts.clone());
    }

    // Let an election happen, then a graceful hand-over, then a crash.
    let leader = wait_for_leader(&pods, None, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    say(
        started,
        &format!(
            ">>> SIGTERM to {} (graceful: it releases the Lease)",
            pods[leader].name
        ),
    );
    pods[leader].stop(libc::SIGTERM);
    let next = wait_for_leader(&pods, Some(leader), Duration::from_secs(20)).await;
    pods[leader].restart(&binary, &api, &dir, started);
    tokio::time::sleep(Duration::from_secs(3)).await;
    say(
        started,
        &format!(
            ">>> SIGKILL to {} (a crash: peers wait for the Lease to expire)",
            pods[next].name
        ),
    );
    pods[next].stop(libc::SIGKILL);
    wait_for_leader(&pods, Some(next), Duration::from_secs(20)).await;
    pods[next].restart(&binary, &api, &dir, started);
    tokio::time::sleep(Duration::from_secs(1)).await;

    print_next_steps(&pods);
    match duration {
        Some(duration) => {
            let left = duration.saturating_sub(started.elapsed());
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    for pod in &mut pods {
        pod.stop(libc::SIGTERM);
    }
    // Each hands over and exits within its shutdown timeout (the gate lag,
    // 80% of the 1 s margin, plus 5 s).
    for pod in &mut pods {
        let _ = pod.child.wait();
    }
    let seen = starts.load(Ordering::SeqCst).saturating_sub(1);
    say(started, &format!("done: {seen} hand-overs seen"));
    let _ = std::fs::remove_dir_all(&dir);
    if seen >= 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One candidate: a real `leader-gate serve` process with its own
/// credentials, on a gate port that survives its restarts.
struct Pod {
    name: &'static str,
    gate: SocketAddr,
    admin: SocketAddr,
    child: Child,
}

impl Pod {
    fn start(
        binary: &Path,
        api: &FakeApiServer,
        dir: &Path,
        name: &'static str,
        gate: Option<SocketAddr>,
        started: Instant,
    ) -> Pod {
        let kubeconfig = api.write_kubeconfig(name, dir);
        let gate_arg = gate.map_or("127.0.0.1:0".to_owned(), |g| g.to_string());
        let mut child = Command::new(binary)
            .args(["serve", "--lease-name", LEASE, "--identity", name])
            .args(["--listen", &gate_arg, "--admin-listen", "127.0.0.1:0"])
            .args(TIMING)
            .env("KUBECONFIG", &kubeconfig)
            // The listening line, then warnings only.
            .env("RUST_LOG", "warn,leader_gate::sidecar=info")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start leader-gate serve");
        // Its first lines say where it listens; later ones (warnings) are shown.
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let (gate, admin) = loop {
            let line = lines
                .next()
                .and_then(Result::ok)
                .unwrap_or_else(|| panic!("{name} exited before listening"));
            if let (Some(gate), Some(admin)) = (field(&line, "gate="), field(&line, "admin=")) {
                break (gate, admin);
            }
        };
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                // Transitions are shown from the event streams already.
                let news = !line.contains("stopped leading");
                if news && (line.contains("WARN") || line.contains("ERROR")) {
                    say(started, &format!("    {name} log: {}", line.trim()));
                }
            }
        });
        say(
            started,
            &format!("started {name}: gate http://{gate}  admin http://{admin}"),
        );
        Pod {
            name,
            gate,
            admin,
            child,
        }
    }

    fn restart(&mut self, binary: &Path, api: &FakeApiServer, dir: &Path, started: Instant) {
        let _ = self.child.wait();
        say(started, &format!(">>> restarting {}", self.name));
        *self = Pod::start(binary, api, dir, self.name, Some(self.gate), started);
    }

    fn stop(&mut self, signal: i32) {
        // SAFETY: kill(2) on our own child with a valid signal number.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

/// Prints `name`'s transitions as its event stream reports them, applying
/// the same validity rule the gates apply; counts terms started.
fn follow(name: &'static str, gate: SocketAddr, started: Instant, starts: Arc<AtomicUsize>) {
    let url = GateUrl::parse(&format!("http://{gate}")).expect("a gate URL");
    tokio::spawn(async move {
        let mut feed = Feed::new(url);
        loop {
            match feed.next().await {
                Signal::Event(message) => {
                    let data = &message.data;
                    let text = |key: &str| data[key].as_str().unwrap_or("-").to_owned();
                    match message.sse.event.as_str() {
                        "started-leading" => {
                            starts.fetch_add(1, Ordering::SeqCst);
                            say(
                                started,
                                &format!(
                                    "{name}: started-leading  term {}  valid for {} ms",
                                    text("term"),
                                    data["valid_for_ms"]
                                ),
                            );
                        }
                        "stopped-leading" => say(
                            started,
                            &format!(
                                "{name}: stopped-leading  term {}  reason {}",
                                text("term"),
                                text("reason")
                            ),
                        ),
                        "new-leader" => {
                            say(started, &format!("{name}: sees leader {}", text("holder")))
                        }
                        _ => {}
                    }
                }
                Signal::Expired { term, reason } => say(
                    started,
                    &format!(
                        "{name}: (local) leadership of {term} ended: {}",
                        reason.as_str()
                    ),
                ),
                Signal::Connected | Signal::Disconnected(_) => {}
            }
        }
    });
}

/// Waits until one pod other than `not` answers 200 on `/leader`.
async fn wait_for_leader(pods: &[Pod], not: Option<usize>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        for (i, pod) in pods.iter().enumerate() {
            if Some(i) == not {
                continue;
            }
            let url = GateUrl::parse(&format!("http://{}", pod.gate)).expect("a gate URL");
            if let Ok((200, _)) = url
                .fetch(hyper::Method::GET, "/leader", Duration::from_secs(1))
                .await
            {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn print_next_steps(pods: &[Pod]) {
    println!("\nThe three sidecars keep running. Try, in another terminal:\n");
    for pod in pods {
        println!(
            "  curl -s -w ' %{{http_code}}\\n' http://{}/leader       # {}: 200 leading, 503 not",
            pod.gate, pod.name
        );
    }
    let first = &pods[0];
    println!(
        "  curl -N http://{}/events                 # the event stream",
        first.gate
    );
    println!(
        "  curl -s http://{}/metrics | grep leader_gate_",
        first.admin
    );
    println!("  cargo run --release -- watch --url http://{}", first.gate);
    println!(
        "  cargo run --release -- exec --url http://{} -- sh -c 'echo leading as $LEADER_GATE_TERM; sleep 1000'",
        first.gate
    );
    println!(
        "  kill {}                                   # SIGTERM {}: watch the hand-over",
        first.child.id(),
        first.name
    );
    println!("\nCtrl-C ends the demo.\n");
}

fn say(started: Instant, line: &str) {
    println!("[{:>6.2}s] {line}", started.elapsed().as_secs_f64());
}

fn field(line: &str, key: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn parse_args() -> Result<Option<Duration>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(None),
        [flag, value] if flag == "--duration" => parse_duration(value).map(Some),
        [flag] if flag.starts_with("--duration=") => {
            parse_duration(&flag["--duration=".len()..]).map(Some)
        }
        other => Err(format!("unexpected arguments {other:?}")),
    }
}

/// The sidecar program: this very executable, run as `demo serve …`.
fn sidecar_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))
}
