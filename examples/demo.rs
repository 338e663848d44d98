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
//! restarting each. Beside the graceful hand-over it prints its figures, read
//! off the fake API server: the release waits the gate lag (0.8 s with the
//! demo's timings) so that a collector polling `/leader` stops first, then
//! the named successor takes the Lease within milliseconds. Then it says
//! what to try against the sidecars (its `kill` line names the leader of the
//! moment), which stay up until Ctrl-C or `--duration`. It exits non-zero if
//! it saw no hand-over.
//!
//! The gate ports are chosen below the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), so no outgoing connection can
//! be given one while its sidecar restarts; if another program binds it
//! anyway, the sidecar is restarted on a new port and the new address is
//! printed. Any failure to start is one line on stderr and exit 1, not a
//! panic.

#[path = "../tests/support"]
mod support {
    pub mod fake_apiserver;
}

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use leader_gate::client::feed::{Feed, Signal};
use leader_gate::client::url::GateUrl;
use leader_gate::duration::parse_duration;
use support::fake_apiserver::{FakeApiServer, lease_holder};

const NAMESPACE: &str = "demo";
const LEASE: &str = "demo-leader";
const NAMES: [&str; 3] = ["pod-a", "pod-b", "pod-c"];
/// Short timings so the demo moves: a crashed leader is replaced in ~4 s.
/// The margin (lease duration - renew deadline) is 1 s, so the gate lag,
/// 80% of it, is 0.8 s. Followers claim the successor slot within 1-2 s of
/// an election, so the graceful stop 3 s in finds a successor named.
const TIMING: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "1s",
    "--successor-claim-window",
    "2s",
];
/// The gate lag those timings give (80% of the 1 s margin).
const GATE_LAG: Duration = Duration::from_millis(800);
/// The Lease annotation naming the successor.
const SUCCESSOR: &str = "leader-gate.dev/successor";

/// Hidden, for tests/it/cli.rs: pod-a's gate address, used as given (no other
/// port is tried), so a test can hand it a busy one.
const FORCE_GATE_ENV: &str = "LEADER_GATE_DEMO_GATE_A";
/// Hidden, for tests/it/cli.rs: the demo itself binds each gate port before the
/// sidecar's restart, as another program might, to exercise the rebind.
const TAKE_PORT_ENV: &str = "LEADER_GATE_DEMO_TAKE_PORT_ON_RESTART";

fn main() -> ExitCode {
    // The sidecars are this very program, run as `demo serve …`: the same
    // code as `leader-gate serve`, as real processes, without a second build.
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return run_sidecar();
    }
    // `demo watch …`, `demo exec …`: the clients the closing hints name,
    // from this build (no second build of leader-gate to try them).
    if matches!(std::env::args().nth(1).as_deref(), Some("watch" | "exec")) {
        return run_client();
    }
    // A bug is still one line and exit 1, never a backtrace and 101.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        let at = info
            .location()
            .map(|l| format!(" ({}:{})", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("demo: internal error: {}{at}", message.replace('\n', " "));
        std::process::exit(1);
    }));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo: cannot start a tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(demo())
}

/// `demo serve …`: exactly `leader-gate serve …`.
fn run_sidecar() -> ExitCode {
    use clap::Parser;
    let cli = leader_gate::cli::Cli::parse_from(
        std::iter::once("leader-gate".to_owned()).chain(std::env::args().skip(1)),
    );
    let leader_gate::cli::Command::Serve(args) = cli.command else {
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
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(leader_gate::serve::sidecar::run(config)),
        Err(error) => {
            eprintln!("leader-gate: cannot start a tokio runtime: {error}");
            ExitCode::from(leader_gate::exit::OSERR)
        }
    }
}

/// `demo watch …` and `demo exec …`: exactly `leader-gate watch|exec …`.
fn run_client() -> ExitCode {
    use clap::Parser;
    use leader_gate::cli::{Cli, Command};
    use leader_gate::client::exec::ExecArgs;
    use leader_gate::client::watch::WatchArgs;
    use leader_gate::client::{exec, watch};
    let cli =
        Cli::parse_from(std::iter::once("leader-gate".to_owned()).chain(std::env::args().skip(1)));
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("leader-gate: cannot start a tokio runtime: {error}");
            return ExitCode::from(leader_gate::exit::OSERR);
        }
    };
    match cli.command {
        Command::Watch(WatchArgs { client, json }) => {
            let _closed = runtime.block_on(watch::run(client.gate(), json, std::io::stdout()));
            ExitCode::SUCCESS
        }
        Command::Exec(ExecArgs {
            client,
            grace,
            command,
        }) => {
            let options = exec::ExecOptions {
                url: client.gate(),
                grace,
                command,
            };
            match runtime.block_on(exec::run(options)) {
                Ok(code) => ExitCode::from(code),
                Err(error) => {
                    eprintln!("leader-gate exec: {error}");
                    ExitCode::from(error.exit_code())
                }
            }
        }
        _ => unreachable!("only watch and exec are run this way"),
    }
}

async fn demo() -> ExitCode {
    let duration = match parse_args() {
        Ok(duration) => duration,
        Err(message) => {
            eprintln!("demo: {message}\nusage: demo [--duration 30s]");
            return ExitCode::from(64);
        }
    };
    let dir = std::env::temp_dir().join(format!("leader-gate-demo-{}", std::process::id()));
    let mut pods = Vec::new();
    let result = run_demo(duration, &dir, &mut pods).await;
    // Whatever happened, no sidecar outlives the demo (`Child::kill` skips
    // one already reaped, so no recycled pid is hit).
    for pod in &mut pods {
        let _ = pod.child.kill();
        let _ = pod.child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("demo: {}", message.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

async fn run_demo(
    duration: Option<Duration>,
    dir: &Path,
    pods: &mut Vec<Pod>,
) -> Result<ExitCode, String> {
    let binary = sidecar_binary()?;
    let started = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
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
    let mut ports = PortPicker::new();
    let forced: Option<SocketAddr> = match std::env::var(FORCE_GATE_ENV) {
        Ok(value) => Some(
            value
                .parse()
                .map_err(|e| format!("{FORCE_GATE_ENV}={value:?}: {e}"))?,
        ),
        Err(_) => None,
    };
    for (i, name) in NAMES.iter().enumerate() {
        let gate = match forced {
            Some(gate) if i == 0 => gate,
            _ => ports.next()?,
        };
        let pod = Pod::start(&binary, &api, dir, name, gate, started)
            .map_err(|e| format!("{name} cannot start: {e}"))?;
        pods.push(pod);
    }
    for pod in pods.iter_mut() {
        pod.follow(started, &starts);
    }
    let taken = std::env::var_os(TAKE_PORT_ENV).is_some();
    let mut held = Vec::new();

    // Let an election happen, then a graceful hand-over, then a crash.
    let leader = wait_for_leader(pods, None, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    say(
        started,
        &format!(
            ">>> SIGTERM to {} (graceful: it releases the Lease)",
            pods[leader].name
        ),
    );
    let successor = successor_of(&api);
    let sigterm = Instant::now();
    pods[leader].stop(libc::SIGTERM);
    let handover = watch_handover(&api, pods[leader].name, sigterm).await?;
    explain_handover(started, &handover, successor.as_deref());
    let next = wait_for_leader(pods, Some(leader), Duration::from_secs(20)).await?;
    let _ = pods[leader].child.wait();
    if taken {
        held.extend(TcpListener::bind(pods[leader].gate).ok());
    }
    pods[leader].restart(&binary, &api, dir, started, &mut ports, &starts)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    say(
        started,
        &format!(
            ">>> SIGKILL to {} (a crash: peers wait for the Lease to expire)",
            pods[next].name
        ),
    );
    pods[next].stop(libc::SIGKILL);
    wait_for_leader(pods, Some(next), Duration::from_secs(20)).await?;
    let _ = pods[next].child.wait();
    if taken {
        held.extend(TcpListener::bind(pods[next].gate).ok());
    }
    pods[next].restart(&binary, &api, dir, started, &mut ports, &starts)?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let leader = wait_for_leader(pods, None, Duration::from_secs(20)).await?;
    print_next_steps(pods, leader);
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
    for pod in pods.iter_mut() {
        pod.stop(libc::SIGTERM);
    }
    // Each hands over and exits within its shutdown timeout (the gate lag,
    // 80% of the 1 s margin, plus 5 s).
    for pod in pods.iter_mut() {
        let _ = pod.child.wait();
    }
    let seen = starts.load(Ordering::SeqCst).saturating_sub(1);
    say(started, &format!("done: {seen} hand-overs seen"));
    if seen >= 1 {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

/// Gate ports outside the kernel's ephemeral range: free when picked, and
/// never handed to an outgoing connection or a `:0` bind afterwards, so a
/// restarted sidecar finds its port again.
struct PortPicker {
    candidates: Vec<u16>,
    next: usize,
}

impl PortPicker {
    fn new() -> PortPicker {
        let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|text| {
                let mut numbers = text.split_whitespace().map(str::parse::<u16>);
                Some((numbers.next()?.ok()?, numbers.next()?.ok()?))
            })
            .unwrap_or((32768, 60999));
        let mut candidates: Vec<u16> = (10000..low).chain(high.saturating_add(1)..=65535).collect();
        if candidates.is_empty() {
            candidates = (1025..low).collect();
        }
        // Start somewhere of this process's own, so two demos do not race.
        let start = (std::process::id() as usize).wrapping_mul(7919) % candidates.len().max(1);
        candidates.rotate_left(start);
        PortPicker {
            candidates,
            next: 0,
        }
    }

    /// The next port that binds now.
    fn next(&mut self) -> Result<SocketAddr, String> {
        while self.next < self.candidates.len() {
            let addr = SocketAddr::from(([127, 0, 0, 1], self.candidates[self.next]));
            self.next += 1;
            if TcpListener::bind(addr).is_ok() {
                return Ok(addr);
            }
        }
        Err("no free port for a gate on 127.0.0.1".to_owned())
    }
}

/// One candidate: a real `leader-gate serve` process with its own
/// credentials, on a gate port that survives its restarts.
struct Pod {
    name: &'static str,
    gate: SocketAddr,
    admin: SocketAddr,
    child: Child,
    /// Prints its event stream; replaced if the gate moves.
    follower: Option<tokio::task::JoinHandle<()>>,
}

impl Pod {
    fn start(
        binary: &Path,
        api: &FakeApiServer,
        dir: &Path,
        name: &'static str,
        gate: SocketAddr,
        started: Instant,
    ) -> Result<Pod, String> {
        let kubeconfig = api.write_kubeconfig(name, dir);
        let gate_arg = gate.to_string();
        let mut child = Command::new(binary)
            .args(["serve", "--lease-name", LEASE, "--identity", name])
            .args(["--listen", &gate_arg, "--admin-listen", "127.0.0.1:0"])
            .args(TIMING)
            .env("KUBECONFIG", &kubeconfig)
            // The listening line, then warnings only.
            .env("RUST_LOG", "warn,leader_gate::serve::sidecar=info")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        // Its first lines say where it listens; later ones (warnings) are shown.
        let Some(stderr) = child.stderr.take() else {
            return Err("no stderr pipe".to_owned());
        };
        let mut lines = BufReader::new(stderr).lines();
        let mut last = String::new();
        let (gate, admin) = loop {
            let Some(line) = lines.next().and_then(Result::ok) else {
                // It exited before listening: say how, and its last word.
                let status = child
                    .wait()
                    .map_or_else(|e| e.to_string(), |s| s.to_string());
                return Err(format!(
                    "it exited ({status}) before listening on {gate_arg}: {}",
                    last.trim()
                ));
            };
            if let (Some(gate), Some(admin)) = (field(&line, "gate="), field(&line, "admin=")) {
                break (gate, admin);
            }
            if !line.trim().is_empty() {
                last = line;
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
        Ok(Pod {
            name,
            gate,
            admin,
            child,
            follower: None,
        })
    }

    /// Restarts it on its gate port; if another program took that port
    /// meanwhile, on a new one, and says so.
    fn restart(
        &mut self,
        binary: &Path,
        api: &FakeApiServer,
        dir: &Path,
        started: Instant,
        ports: &mut PortPicker,
        starts: &Arc<AtomicUsize>,
    ) -> Result<(), String> {
        let _ = self.child.wait();
        let name = self.name;
        say(started, &format!(">>> restarting {name}"));
        let pod = match Pod::start(binary, api, dir, name, self.gate, started) {
            Ok(pod) => pod,
            Err(first) => {
                let gate = ports.next()?;
                say(
                    started,
                    &format!(
                        ">>> {name} could not listen on {} again ({first}); restarting it on {gate}",
                        self.gate
                    ),
                );
                let pod = Pod::start(binary, api, dir, name, gate, started)
                    .map_err(|e| format!("{name} cannot restart: {e}"))?;
                say(
                    started,
                    &format!("{name}'s gate moved: it now listens on http://{}", pod.gate),
                );
                pod
            }
        };
        let moved = pod.gate != self.gate;
        let follower = self.follower.take();
        *self = pod;
        if moved {
            if let Some(old) = follower {
                old.abort();
            }
            self.follow(started, starts);
        } else {
            self.follower = follower;
        }
        Ok(())
    }

    fn follow(&mut self, started: Instant, starts: &Arc<AtomicUsize>) {
        self.follower = Some(follow(self.name, self.gate, started, starts.clone()));
    }

    fn stop(&mut self, signal: i32) {
        // SAFETY: kill(2) on our own child with a valid signal number.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

/// Prints `name`'s transitions as its event stream reports them, applying
/// the same validity rule the gates apply; counts terms started.
fn follow(
    name: &'static str,
    gate: SocketAddr,
    started: Instant,
    starts: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(url) = GateUrl::parse(&format!("http://{gate}")) else {
            return;
        };
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
                Signal::Connected | Signal::Disconnected(_) | Signal::Resumed(_) => {}
            }
        }
    })
}

/// Waits until one pod other than `not` answers 200 on `/leader`.
async fn wait_for_leader(
    pods: &[Pod],
    not: Option<usize>,
    within: Duration,
) -> Result<usize, String> {
    let deadline = Instant::now() + within;
    loop {
        for (i, pod) in pods.iter().enumerate() {
            if Some(i) == not {
                continue;
            }
            let url = GateUrl::parse(&format!("http://{}", pod.gate))
                .map_err(|e| format!("gate URL of {}: {e}", pod.name))?;
            if let Ok((200, _)) = url
                .fetch(hyper::Method::GET, "/leader", Duration::from_secs(1))
                .await
            {
                return Ok(i);
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("no leader within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// When the Lease left the stopped leader, and when another pod held it.
struct Handover {
    released: Duration,
    taken: Duration,
    by: String,
}

/// Watches the Lease in the fake API server (every millisecond) from the
/// SIGTERM of `leader` until another pod holds it.
async fn watch_handover(
    api: &FakeApiServer,
    leader: &str,
    sigterm: Instant,
) -> Result<Handover, String> {
    let mut released = None;
    while sigterm.elapsed() < Duration::from_secs(20) {
        let holder = api.lease(LEASE).as_ref().and_then(lease_holder);
        if holder.as_deref() != Some(leader) {
            let at = *released.get_or_insert(sigterm.elapsed());
            if let Some(by) = holder {
                return Ok(Handover {
                    released: at,
                    taken: sigterm.elapsed(),
                    by,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(format!(
        "the Lease did not leave {leader} within 20 s of its SIGTERM"
    ))
}

fn successor_of(api: &FakeApiServer) -> Option<String> {
    api.lease(LEASE)?
        .pointer(&format!(
            "/metadata/annotations/{}",
            SUCCESSOR.replace('/', "~1")
        ))
        .and_then(serde_json::Value::as_str)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// The figures of a graceful hand-over, and why the release waited.
fn explain_handover(started: Instant, handover: &Handover, successor: Option<&str>) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    say(
        started,
        &format!(
            "    the release went out {:.0} ms after SIGTERM: it waits the gate lag ({} ms here, \
             80% of the 1 s margin)",
            ms(handover.released),
            GATE_LAG.as_millis()
        ),
    );
    say(
        started,
        "    so that a collector polling /leader stops first; gates that acknowledge (exec, \
         file-gate) cut it short, and none runs here",
    );
    let why = match successor {
        Some(name) if name == handover.by => "the named successor takes a release at once",
        Some(_) => "not the named successor: the others wait a random spread",
        None => "no successor named yet: the followers wait a random spread",
    };
    say(
        started,
        &format!(
            "    {} took the Lease {:.1} ms after the release ({why}): the hand-over the \
             benchmarks measure",
            handover.by,
            ms(handover.taken - handover.released)
        ),
    );
}

fn print_next_steps(pods: &[Pod], leader: usize) {
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
    // This very build runs the clients too (`demo watch`, `demo exec`).
    let this = std::env::current_exe().map_or_else(
        |_| "target/release/examples/demo".to_owned(),
        |p| p.display().to_string(),
    );
    println!("  {this} watch --url http://{}", first.gate);
    println!(
        "  {this} exec --url http://{} -- sh -c 'echo leading as $LEADER_GATE_TERM; sleep 1000'",
        first.gate
    );
    let leading = &pods[leader];
    println!(
        "  kill {}                                   # SIGTERM {}, the leader now: watch the hand-over",
        leading.child.id(),
        leading.name
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
