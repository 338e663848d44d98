//! Real `leader-gate` processes for the scenario tests: each one a separate
//! OS process with its own kubeconfig (so the fake API server can fault it
//! alone), its own listeners and a log file to read afterwards. The benchmark
//! also runs a peer elector with the same command line this way
//! ([`Sidecar::spawn_program`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::fake_apiserver::FakeApiServer;
use super::process::Owned;

/// Election timing for one test, as flags.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Timing {
    /// Short enough for a quick suite, long enough for a busy 2-core machine.
    pub const FAST: Timing = Timing {
        lease: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry: Duration::from_millis(1000),
    };

    /// For gates: the margin (lease − renew deadline = 3 s) covers `exec
    /// --grace 2s`, as the README asks, and a gate lag of seconds.
    pub const GATES: Timing = Timing {
        lease: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(3),
        retry: Duration::from_secs(1),
    };

    fn args(&self) -> Vec<String> {
        vec![
            "--lease-duration".into(),
            format!("{}s", self.lease.as_secs()),
            "--renew-deadline".into(),
            format!("{}ms", self.renew_deadline.as_millis()),
            "--retry-period".into(),
            format!("{}ms", self.retry.as_millis()),
        ]
    }
}

/// The answer to one `GET /leader`.
#[derive(Clone, Debug)]
pub struct Probe {
    pub status: u16,
    pub body: Value,
}

impl Probe {
    pub fn leading(&self) -> bool {
        self.status == 200
    }

    pub fn holder(&self) -> Option<&str> {
        self.body["holder"].as_str()
    }

    pub fn term(&self) -> Option<&str> {
        self.body["term"].as_str()
    }
}

/// A running `leader-gate serve` process.
pub struct Sidecar {
    pub name: String,
    pub gate: SocketAddr,
    pub admin: SocketAddr,
    process: Owned,
    log: PathBuf,
}

impl Sidecar {
    /// `POST /gates/GATE/closed?term=TERM` on the gate listener: the status.
    pub async fn acknowledge(&self, gate: &str, term: &str) -> u16 {
        let mut stream = TcpStream::connect(self.gate).await.unwrap();
        let request = format!(
            "POST /gates/{gate}/closed?term={} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            term.replace('/', "%2F")
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("an HTTP answer: {answer:?}"))
    }

    /// Starts `leader-gate serve` as candidate `name` against `api`.
    pub fn spawn(api: &FakeApiServer, dir: &Path, name: &str, timing: Timing) -> Sidecar {
        Self::spawn_with(api, dir, name, timing, &[])
    }

    pub fn spawn_with(
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        timing: Timing,
        extra: &[&str],
    ) -> Sidecar {
        Self::spawn_full(
            None,
            api,
            dir,
            name,
            &format!("{name}.log"),
            timing,
            any_port(),
            extra,
        )
    }

    /// Like [`Sidecar::spawn_with`], running `program` instead of leader-gate: any
    /// program that takes leader-gate's `serve` flags and answers its `/leader` contract
    /// (the benchmark's peer elector, `bench-peer/`).
    pub fn spawn_program(
        program: &Path,
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        timing: Timing,
        extra: &[&str],
    ) -> Sidecar {
        Self::spawn_full(
            Some(program),
            api,
            dir,
            name,
            &format!("{name}.log"),
            timing,
            any_port(),
            extra,
        )
    }

    /// Like [`Sidecar::spawn_with`], with the gate listener on `gate`: a
    /// restarted container keeps its pod's port, so the gate clients of the
    /// pod (`exec`, `file-gate`) reconnect to it at the address they know.
    pub fn spawn_on(
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        timing: Timing,
        gate: SocketAddr,
        extra: &[&str],
    ) -> Sidecar {
        Self::spawn_full(
            None,
            api,
            dir,
            name,
            &format!("{name}.log"),
            timing,
            gate,
            extra,
        )
    }

    /// [`Sidecar::spawn_with`] for each name, every one serving when this
    /// returns.
    pub async fn spawn_serving(
        api: &FakeApiServer,
        dir: &Path,
        names: &[&str],
        timing: Timing,
        extra: &[&str],
    ) -> Vec<Sidecar> {
        let sidecars: Vec<Sidecar> = names
            .iter()
            .map(|name| Self::spawn_with(api, dir, name, timing, extra))
            .collect();
        for sidecar in &sidecars {
            sidecar.wait_serving().await;
        }
        sidecars
    }

    /// [`Sidecar::spawn_with`] with a gate socket, `<dir>/run/gate.sock`
    /// (returned), before `extra`.
    pub fn spawn_with_socket(
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        timing: Timing,
        extra: &[&str],
    ) -> (Sidecar, PathBuf) {
        let run = dir.join("run");
        std::fs::create_dir_all(&run).expect("create the socket's directory");
        let socket = run.join("gate.sock");
        let flags = [
            &["--gate-socket", socket.to_str().expect("a UTF-8 path")][..],
            extra,
        ]
        .concat();
        (Self::spawn_with(api, dir, name, timing, &flags), socket)
    }

    /// Like [`Sidecar::spawn_with`], logging to `<dir>/<log_name>` (a
    /// restarted candidate keeps the log of its previous incarnation).
    pub fn spawn_logged(
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        log_name: &str,
        timing: Timing,
        extra: &[&str],
    ) -> Sidecar {
        Self::spawn_full(None, api, dir, name, log_name, timing, any_port(), extra)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_full(
        program: Option<&Path>,
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        log_name: &str,
        timing: Timing,
        gate: SocketAddr,
        extra: &[&str],
    ) -> Sidecar {
        let kubeconfig = api.write_kubeconfig(name, dir);
        let log = dir.join(log_name);
        let log_file = std::fs::File::create(&log).expect("create log file");
        // LEADER_GATE_BIN: another build of the binary (the benchmark compares
        // builds side by side); the one cargo built otherwise.
        let binary = program.map(Path::to_path_buf).unwrap_or_else(|| {
            std::env::var_os("LEADER_GATE_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_leader-gate")))
        });
        // An `--identity` in `extra` overrides the name (processes sharing
        // one identity keep their own kubeconfig client and log).
        let identity = if extra.contains(&"--identity") {
            &[][..]
        } else {
            &["--identity", name][..]
        };
        let child = Command::new(&binary)
            .arg("serve")
            .args(["--lease-name", api.lease_name()])
            .args(identity)
            // Port 0: the kernel picks free ports, which the process logs;
            // reserving ports here first would race other tests for them.
            .args(["--listen", &gate.to_string()])
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(timing.args())
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,leader_gate=debug")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        let (gate, admin) = bound_addresses(&log, name);
        Sidecar {
            name: name.into(),
            gate,
            admin,
            process: Owned::new(child),
            log,
        }
    }

    /// Waits until the process serves HTTP.
    pub async fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if get(self.admin, "/healthz").await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} never served HTTP; log:\n{}", self.name, self.log());
    }

    pub async fn leader(&self) -> Option<Probe> {
        get(self.gate, "/leader").await
    }

    pub async fn admin_get(&self, path: &str) -> Option<Probe> {
        get(self.admin, path).await
    }

    /// Waits until `/leader` answers 200.
    pub async fn wait_leading(&self, timeout: Duration) -> Probe {
        self.wait_for(timeout, Probe::leading).await
    }

    /// Waits until the process serves, then until it leads (within
    /// `timeout`): its term.
    pub async fn wait_term(&self, timeout: Duration) -> String {
        self.wait_serving().await;
        let leading = self.wait_leading(timeout).await;
        leading.term().expect("a term").to_owned()
    }

    /// Waits until `/leader` answers something for which `pred` holds.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&Probe) -> bool) -> Probe {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(probe) = self.leader().await
                && pred(&probe)
            {
                return probe;
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: condition not met within {timeout:?}; last: {:?}\nlog:\n{}",
                    self.name,
                    self.leader().await,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(timeout).await
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    /// Resident set size of the process in KiB (Linux `VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Anonymous resident memory in KiB (Linux `RssAnon`: heap, stacks),
    /// without the pages of the mapped binary, which a debug build has
    /// plenty of and pages in and out as code paths run for the first time
    /// or the machine is short of memory.
    pub fn anon_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{}: no RssAnon in /proc/<pid>/status", self.name))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Port 0 on 127.0.0.1: the kernel picks, the process logs what it bound.
fn any_port() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

/// The addresses a starting process logged in its `listening` line.
fn bound_addresses(log: &Path, name: &str) -> (SocketAddr, SocketAddr) {
    let field = |line: &str, key: &str| -> Option<SocketAddr> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace().next()?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Only whole lines: the process may be writing this one right now.
        let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        if let Some(line) = whole.lines().find(|l| l.contains(" listening ")) {
            let gate = field(line, "gate=").expect("gate address in the listening line");
            let admin = field(line, "admin=").expect("admin address in the listening line");
            return (gate, admin);
        }
        // `--log-format json`.
        let json = whole
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["fields"]["message"] == "listening");
        if let Some(line) = json {
            let addr = |key: &str| line["fields"][key].as_str()?.parse().ok();
            return (
                addr("gate").expect("gate address in the listening line"),
                addr("admin").expect("admin address in the listening line"),
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("{name} never logged its listening addresses");
}

/// The index of the first of `sidecars` seen leading within `within`.
pub async fn leading_one(sidecars: &[Sidecar], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        for (i, sidecar) in sidecars.iter().enumerate() {
            if sidecar.leader().await.is_some_and(|p| p.leading()) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "nobody led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until one of two sidecars leads (at most `within`) and returns
/// them as (leader, other).
pub async fn first_leader<'a>(
    a: &'a mut Sidecar,
    b: &'a mut Sidecar,
    within: Duration,
) -> (&'a mut Sidecar, &'a mut Sidecar) {
    let deadline = Instant::now() + within;
    loop {
        if a.leader().await.is_some_and(|p| p.leading()) {
            return (a, b);
        }
        if b.leader().await.is_some_and(|p| p.leading()) {
            return (b, a);
        }
        assert!(
            Instant::now() < deadline,
            "nobody led\n{}\n{}",
            a.log(),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One plain HTTP/1.1 GET; `None` when nothing answers within a second.
pub async fn get(addr: SocketAddr, path: &str) -> Option<Probe> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response);
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let body = serde_json::from_str(body).unwrap_or(Value::String(body.into()));
        Some(Probe { status, body })
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
}

/// A fresh directory for one test's kubeconfigs and logs.
pub fn test_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join("leader-gate-tests")
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}
