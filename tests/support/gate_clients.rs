//! The client subcommands as real processes (`leader-gate exec|watch|status|
//! wait`), each line of their stdout stamped on the test's monotonic clock as
//! it is read; and what the children of `exec` wrote to a shared log.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::events::{EventClient, Received};

/// One line a client printed, stamped when the test read it.
#[derive(Clone, Debug)]
pub struct Line {
    pub at: Instant,
    pub text: String,
}

/// A running `leader-gate <subcommand>` process.
pub struct GateClient {
    pub name: String,
    child: Child,
    lines: Arc<Mutex<Vec<Line>>>,
    /// Reads stdout until it closes: an exit is reported once its output
    /// is all read.
    reader: Option<tokio::task::JoinHandle<()>>,
    stderr: PathBuf,
    exit: Option<(ExitStatus, Instant)>,
}

impl GateClient {
    /// Starts `leader-gate ARGS…` with `env` added; stderr goes to
    /// `dir/<name>.err`.
    pub fn spawn(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> GateClient {
        Self::spawn_under(&[], dir, name, args, env)
    }

    /// [`GateClient::spawn`] under `wrapper` (a command that runs the rest
    /// of its arguments, e.g. `unshare --pid --fork`).
    pub fn spawn_under(
        wrapper: &[&str],
        dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> GateClient {
        let stderr = dir.join(format!("{name}.err"));
        let binary = env!("CARGO_BIN_EXE_leader-gate");
        let (program, before) = match wrapper.split_first() {
            Some((program, rest)) => (*program, [rest, &[binary]].concat()),
            None => (binary, Vec::new()),
        };
        let mut child = Command::new(program)
            .args(before)
            .args(args)
            .envs(env.iter().copied())
            .env_remove("LEADER_GATE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("create stderr file"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn leader-gate client");
        let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let sink = lines.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(text)) = stdout.next_line().await {
                let at = Instant::now();
                sink.lock().unwrap().push(Line { at, text });
            }
        });
        GateClient {
            name: name.into(),
            child,
            lines,
            reader: Some(reader),
            stderr,
            exit: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("still running") as i32
    }

    pub fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    pub fn stdout(&self) -> String {
        self.lines()
            .iter()
            .map(|l| format!("{}\n", l.text))
            .collect()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The first line for which `pred` holds, waiting up to `timeout`.
    pub async fn wait_line(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Line {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| pred(&l.text)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no such line within {timeout:?}; stdout:\n{}\nstderr:\n{}",
                self.name,
                self.stdout(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own unreaped child with a valid signal.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// The exit status and when it was seen, if it exited within `timeout`.
    /// Its stdout is read to the end first (a grandchild holding the pipe
    /// open is waited for up to a second).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<(ExitStatus, Instant)> {
        if self.exit.is_none()
            && let Ok(status) = tokio::time::timeout(timeout, self.child.wait()).await
        {
            self.exit = Some((status.expect("wait for the client"), Instant::now()));
            if let Some(reader) = self.reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
        }
        self.exit
    }

    /// Whether it is still running now.
    pub fn running(&mut self) -> bool {
        if self.exit.is_none()
            && let Some(status) = self.child.try_wait().expect("try_wait")
        {
            self.exit = Some((status, Instant::now()));
        }
        self.exit.is_none()
    }

    /// SIGTERM, as the kubelet stops a container: it must exit 0 within
    /// `timeout`.
    pub async fn terminate_cleanly(&mut self, timeout: Duration) {
        self.signal(libc::SIGTERM);
        let code = self.exit_code(timeout).await;
        assert_eq!(code, 0, "{} after SIGTERM: {}", self.name, self.stderr());
    }

    /// The exit code of a client expected to end within `timeout`.
    pub async fn exit_code(&mut self, timeout: Duration) -> i32 {
        let (status, _) = self.wait_exit(timeout).await.unwrap_or_else(|| {
            panic!(
                "{} still running after {timeout:?}; stderr:\n{}",
                self.name,
                self.stderr()
            )
        });
        status.code().expect("exited, not killed")
    }
}

impl Drop for GateClient {
    fn drop(&mut self) {
        // SIGTERM first: `exec` stops its child (its own process group)
        // only then; SIGKILL would orphan it.
        if let Ok(None) = self.child.try_wait()
            && let Some(pid) = self.child.id()
        {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// `leader-gate exec --url URL --grace 2s -- sh -c SCRIPT` as pod `name`:
/// the child appends to `log` (see [`ChildLog`]).
pub fn spawn_exec(dir: &Path, name: &str, url: &str, log: &Path, script: &str) -> GateClient {
    spawn_exec_under(&[], dir, name, url, log, script)
}

/// [`spawn_exec`] under `wrapper` (see [`GateClient::spawn_under`]).
pub fn spawn_exec_under(
    wrapper: &[&str],
    dir: &Path,
    name: &str,
    url: &str,
    log: &Path,
    script: &str,
) -> GateClient {
    GateClient::spawn_under(
        wrapper,
        dir,
        &format!("exec-{name}"),
        &[
            "exec", "--url", url, "--grace", "2s", "--", "sh", "-c", script,
        ],
        &[("NAME", name), ("LOG", log.to_str().expect("a UTF-8 path"))],
    )
}

/// A collector stand-in: logs `start`, keeps running, and logs `stop` from
/// its TERM trap; every line `<what> $NAME $LEADER_GATE_TERM <wall clock>
/// <pid>`. It also ends if its `exec` is gone, so a test that fails never
/// leaves it behind.
pub const COLLECTOR: &str = r#"
note() { echo "$1 $NAME $LEADER_GATE_TERM $(date +%s.%N) $$" >> "$LOG"; }
trap 'note stop; exit 0' TERM
trap 'note hup' HUP
trap 'note usr1' USR1
note start
while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
"#;

/// One line of a [`ChildLog`].
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub what: String,
    pub name: String,
    pub term: String,
    /// CLOCK_REALTIME in seconds (one machine: comparable across processes).
    pub wall: f64,
    pub pid: i32,
}

/// A run of one child: from its `start` to its `stop` (open while running).
#[derive(Clone, Debug)]
pub struct Interval {
    pub name: String,
    pub term: String,
    pub start: f64,
    pub stop: Option<f64>,
}

/// The log the children of every `exec` in a test append to.
pub struct ChildLog(pub PathBuf);

impl ChildLog {
    pub fn entries(&self) -> Vec<Entry> {
        std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f.len(), 5, "a whole line: {line:?}");
                Entry {
                    what: f[0].into(),
                    name: f[1].into(),
                    term: f[2].into(),
                    wall: f[3].parse().expect("a time"),
                    pid: f[4].parse().expect("a pid"),
                }
            })
            .collect()
    }

    /// Waits for an entry for which `pred` holds.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&Entry) -> bool) -> Entry {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(entry) = self.entries().into_iter().find(&pred) {
                return entry;
            }
            assert!(
                Instant::now() < deadline,
                "no such entry within {timeout:?}; log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn text(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }

    /// Every child's run, in order of start.
    pub fn intervals(&self) -> Vec<Interval> {
        let mut runs: Vec<Interval> = Vec::new();
        for e in self.entries() {
            match e.what.as_str() {
                "start" => {
                    assert!(
                        !runs.iter().any(|r| r.name == e.name && r.stop.is_none()),
                        "{} started a child while one ran:\n{}",
                        e.name,
                        self.text()
                    );
                    runs.push(Interval {
                        name: e.name,
                        term: e.term,
                        start: e.wall,
                        stop: None,
                    });
                }
                "stop" => {
                    let run = runs
                        .iter_mut()
                        .find(|r| r.name == e.name && r.stop.is_none())
                        .expect("a stop follows a start");
                    assert_eq!(run.term, e.term, "stopped in the term it started in");
                    run.stop = Some(e.wall);
                }
                _ => {}
            }
        }
        runs
    }

    /// Panics with the log if two children (of different pods) ever ran at once.
    pub fn assert_never_two_at_once(&self) {
        let runs = self.intervals();
        for a in &runs {
            for b in &runs {
                if a.name == b.name {
                    continue;
                }
                let a_before_b = a.stop.is_some_and(|stop| stop <= b.start);
                let b_before_a = b.stop.is_some_and(|stop| stop <= a.start);
                assert!(
                    a_before_b || b_before_a,
                    "two children ran at once: {a:?} and {b:?}; log:\n{}",
                    self.text()
                );
            }
        }
    }
}

/// CLOCK_REALTIME now, in seconds, as the children's `date +%s.%N`.
pub fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A subscriber read continuously in the background, so each event is
/// stamped when it arrives, not when the test gets round to it.
pub struct Recording {
    events: Arc<Mutex<Vec<Received>>>,
    ended: Arc<Mutex<Option<Instant>>>,
}

impl Recording {
    pub fn start(mut client: EventClient) -> Recording {
        let events: Arc<Mutex<Vec<Received>>> = Arc::default();
        let ended: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (sink, end) = (events.clone(), ended.clone());
        tokio::spawn(async move {
            loop {
                match client.next(Duration::from_secs(3600)).await {
                    Some(received) => sink.lock().unwrap().push(received),
                    None if client.ended => {
                        *end.lock().unwrap() = Some(Instant::now());
                        return;
                    }
                    None => {}
                }
            }
        });
        Recording { events, ended }
    }

    pub fn events(&self) -> Vec<Received> {
        self.events.lock().unwrap().clone()
    }

    /// When the stream ended, if it did.
    pub fn ended(&self) -> Option<Instant> {
        *self.ended.lock().unwrap()
    }

    /// The first event for which `pred` holds, waiting up to `timeout`.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&Received) -> bool) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(received) = self.events().into_iter().find(&pred) {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "no such event within {timeout:?}; got {:?}",
                self.events()
                    .iter()
                    .map(|e| e.kind().to_owned())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Where this subscriber's leadership ends by the validity rule, given
    /// what it received: *receive time + valid_for_ms* of the latest
    /// confirmation, unless a `stopped-leading` came after it.
    pub fn validity_end(&self) -> Option<Instant> {
        let mut end = None;
        for e in self.events() {
            let valid_for = e.data["valid_for_ms"].as_u64().unwrap_or(0);
            match e.kind() {
                "state" if e.data["leading"] == true && valid_for > 0 => {
                    end = Some(e.at + Duration::from_millis(valid_for));
                }
                "state" => end = None,
                "started-leading" | "renewed" if valid_for > 0 => {
                    end = Some(e.at + Duration::from_millis(valid_for));
                }
                "stopped-leading" => end = None,
                _ => {}
            }
        }
        end
    }
}
