//! The file gate under test: `leader-gate file-gate` as a real process, a
//! sampler that watches a DST as a collector would (and stamps every change
//! it sees), and a tiny HTTP server that records the `--reload-url` POSTs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::Owned;
use tokio::net::TcpListener;

/// A running `leader-gate file-gate` process.
pub struct FileGate {
    process: Owned,
    log: PathBuf,
}

impl FileGate {
    /// Starts `leader-gate file-gate --url http://GATE [extra] SRC:DST...`,
    /// its stderr in `dir/NAME.log` (appended to, across restarts).
    pub fn spawn(
        dir: &Path,
        name: &str,
        gate: SocketAddr,
        extra: &[&str],
        mappings: &[(&Path, &Path)],
    ) -> FileGate {
        Self::spawn_env(dir, name, gate, extra, mappings, &[])
    }

    /// [`FileGate::spawn`] with extra environment variables (the debug-only
    /// test hooks of `src/client/file_gate/writer.rs`).
    pub fn spawn_env(
        dir: &Path,
        name: &str,
        gate: SocketAddr,
        extra: &[&str],
        mappings: &[(&Path, &Path)],
        env: &[(&str, &Path)],
    ) -> FileGate {
        let log = dir.join(format!("{name}.log"));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the file gate's log");
        let child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
            .arg("file-gate")
            .args(["--url", &format!("http://{gate}")])
            .args(extra)
            .args(
                mappings
                    .iter()
                    .map(|(src, dst)| format!("{}:{}", src.display(), dst.display())),
            )
            .env_remove("LEADER_GATE_URL")
            .env_remove("LEADER_GATE_RELOAD_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn leader-gate file-gate");
        FileGate {
            process: Owned::new(child),
            log,
        }
    }

    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    /// SIGKILLs the gate's own children (its guard) first, then the gate:
    /// as when its whole container is killed at once, so nothing of it is
    /// left to remove a copy.
    pub fn kill_with_its_children(&self) {
        let pid = self.process.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children.split_whitespace() {
            let child: i32 = child.parse().expect("a pid");
            // SAFETY: kill(2) on a child of our own unreaped child.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        assert!(!children.trim().is_empty(), "the gate has a guard");
        std::thread::sleep(Duration::from_millis(50));
        self.process.signal(libc::SIGKILL);
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(timeout).await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// What a DST held from one instant on, as a reader saw it.
#[derive(Clone, Debug)]
pub struct Change {
    pub at: Instant,
    /// Wall clock, µs (comparable with an event's `published_at_us`).
    pub wall_us: i64,
    /// `None`: no file there.
    pub content: Option<Vec<u8>>,
}

impl Change {
    pub fn exists(&self) -> bool {
        self.content.is_some()
    }
}

/// A reader of one DST in its own thread, as a collector that rereads it:
/// each pass opens and reads the whole file, and every change in what it
/// reads (including appearing and disappearing) is kept with its instant.
/// The first change is the state found at start.
pub struct Sampler {
    pub path: PathBuf,
    changes: Arc<Mutex<Vec<Change>>>,
    reads: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Reads `path` every `period` (`Duration::ZERO`: a tight loop).
    pub fn start(path: &Path, period: Duration) -> Sampler {
        let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
        let reads: Arc<AtomicU64> = Arc::default();
        let stop: Arc<AtomicBool> = Arc::default();
        let thread = {
            let (path, changes, reads, stop) = (
                path.to_owned(),
                changes.clone(),
                reads.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let mut last: Option<Option<Vec<u8>>> = None;
                while !stop.load(Ordering::SeqCst) {
                    let content = match std::fs::read(&path) {
                        Ok(content) => Some(content),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                        Err(e) => panic!("reading {}: {e}", path.display()),
                    };
                    let (at, wall_us) = (Instant::now(), leader_gate::clock::wall_micros());
                    reads.fetch_add(1, Ordering::Relaxed);
                    if last.as_ref() != Some(&content) {
                        changes.lock().unwrap().push(Change {
                            at,
                            wall_us,
                            content: content.clone(),
                        });
                        last = Some(content);
                    }
                    if period.is_zero() {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(period);
                    }
                }
            })
        };
        Sampler {
            path: path.to_owned(),
            changes,
            reads,
            stop,
            thread: Some(thread),
        }
    }

    pub fn changes(&self) -> Vec<Change> {
        self.changes.lock().unwrap().clone()
    }

    /// Whether the file existed at each change: the appear/disappear history.
    pub fn presence(&self) -> Vec<bool> {
        let mut presence: Vec<bool> = Vec::new();
        for change in self.changes() {
            if presence.last() != Some(&change.exists()) {
                presence.push(change.exists());
            }
        }
        presence
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Waits for the `n`th change (0: the state at start).
    pub async fn change(&self, n: usize, timeout: Duration) -> Change {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(change) = self.changes.lock().unwrap().get(n) {
                return change.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{}: no change #{n} within {timeout:?}; changes: {:?}",
                self.path.display(),
                self.summary()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for the first change after `from` (a count of changes) for
    /// which `pred` holds.
    pub async fn until(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Change) -> bool,
    ) -> (usize, Change) {
        let mut n = from;
        loop {
            let change = self.change(n, timeout).await;
            if pred(&change) {
                return (n, change);
            }
            n += 1;
        }
    }

    pub fn count(&self) -> usize {
        self.changes.lock().unwrap().len()
    }

    /// The changes as (ms since the first, size or None), for messages.
    pub fn summary(&self) -> Vec<(u128, Option<usize>)> {
        let changes = self.changes.lock().unwrap();
        let first = changes.first().map_or_else(Instant::now, |c| c.at);
        changes
            .iter()
            .map(|c| {
                (
                    c.at.duration_since(first).as_millis(),
                    c.content.as_ref().map(Vec::len),
                )
            })
            .collect()
    }

    /// Stops the thread and returns every change.
    pub fn stop(mut self) -> Vec<Change> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the sampler thread");
        }
        self.changes()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One POST to the reload server.
#[derive(Clone, Debug)]
pub struct Post {
    pub method: String,
    pub path: String,
    /// Whether each watched file existed when the request arrived.
    pub existed: Vec<bool>,
    /// When it arrived.
    pub at: Instant,
    /// The status it was (or is being) answered with.
    pub status: u16,
}

/// How the reload server answers: `status` after `delay`; the next
/// `failures` requests get `failure` instead.
#[derive(Clone, Copy, Debug)]
struct Policy {
    status: u16,
    delay: Duration,
    failures: usize,
    failure: u16,
}

impl Policy {
    /// 200 after `delay`, as long as the test says nothing else.
    fn ok_after(delay: Duration) -> Arc<Mutex<Policy>> {
        Arc::new(Mutex::new(Policy {
            status: 200,
            delay,
            failures: 0,
            failure: 500,
        }))
    }
}

/// One answer as sent: the status line `line` (`"200 OK"`) and `body`,
/// after `delay`; `status` is what [`Post::status`] records.
struct Reply {
    status: u16,
    line: String,
    body: &'static str,
    delay: Duration,
}

/// A tiny HTTP server in place of a collector's reload endpoint: it records
/// every request (and which watched files exist at that moment), and
/// answers 200 after `delay` — or as the test says since.
pub struct Reloads {
    pub addr: SocketAddr,
    posts: Arc<Mutex<Vec<Post>>>,
    answer: Arc<Mutex<Policy>>,
}

impl Reloads {
    /// Answers each request only after `delay`, as a collector that reloads
    /// a large configuration before it answers.
    pub async fn start_slow(watched: &[&Path], delay: Duration) -> Reloads {
        let answer = Policy::ok_after(delay);
        let policy = answer.clone();
        Self::serve(watched, answer, move |_| {
            let mut answer = policy.lock().unwrap();
            let status = if answer.failures > 0 {
                answer.failures -= 1;
                answer.failure
            } else {
                answer.status
            };
            let (reason, body) = if status / 100 == 2 {
                ("OK", "")
            } else {
                ("Failed", "failed to reload config")
            };
            Some(Reply {
                status,
                line: format!("{status} {reason}"),
                body,
                delay: answer.delay,
            })
        })
        .await
    }

    /// Records every request, and answers it as `reply` says for the
    /// number of requests recorded before it (`None`: never).
    async fn serve(
        watched: &[&Path],
        answer: Arc<Mutex<Policy>>,
        reply: impl Fn(usize) -> Option<Reply> + Send + Sync + 'static,
    ) -> Reloads {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
        let watched: Vec<PathBuf> = watched.iter().map(|p| p.to_path_buf()).collect();
        let (recorded, reply) = (posts.clone(), Arc::new(reply));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (recorded, watched, reply) = (recorded.clone(), watched.clone(), reply.clone());
                tokio::spawn(async move {
                    let Some(head) = super::read_head(&mut stream).await else {
                        return;
                    };
                    let existed = watched.iter().map(|p| p.exists()).collect();
                    let at = Instant::now();
                    let text = String::from_utf8_lossy(&head);
                    let mut first = text.split_whitespace();
                    let method = first.next().unwrap_or_default().to_owned();
                    let path = first.next().unwrap_or_default().to_owned();
                    let reply = {
                        let mut recorded = recorded.lock().unwrap();
                        let reply = reply(recorded.len());
                        recorded.push(Post {
                            method,
                            path,
                            existed,
                            at,
                            status: reply.as_ref().map_or(0, |r| r.status),
                        });
                        reply
                    };
                    let Some(reply) = reply else {
                        // Keep the connection until the client gives up.
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = stream.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                        return;
                    };
                    tokio::time::sleep(reply.delay).await;
                    let response = format!(
                        "HTTP/1.1 {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                        reply.line,
                        reply.body.len(),
                        reply.body
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        Reloads {
            addr,
            posts,
            answer,
        }
    }

    /// From now on, answer `status` after `delay`.
    pub fn set_answer(&self, status: u16, delay: Duration) {
        let mut answer = self.answer.lock().unwrap();
        answer.status = status;
        answer.delay = delay;
    }

    /// Answer the next `n` requests with `status` (a failed reload), then
    /// as before.
    pub fn fail_next(&self, n: usize, status: u16) {
        let mut answer = self.answer.lock().unwrap();
        answer.failures = n;
        answer.failure = status;
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.posts.lock().unwrap().len()
    }

    /// Waits until at least `n` POSTs arrived.
    pub async fn wait_count(&self, n: usize, timeout: Duration) -> Vec<Post> {
        let deadline = Instant::now() + timeout;
        loop {
            let posts = self.posts();
            if posts.len() >= n {
                return posts;
            }
            assert!(
                Instant::now() < deadline,
                "{n} reload POSTs expected within {timeout:?}; got {posts:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Replaces `path` with `content` atomically (a rename), as the kubelet
/// updates a mounted ConfigMap: a reader of SRC never sees a part.
pub fn replace(path: &Path, content: &[u8]) {
    let temporary = path.with_extension("writing");
    std::fs::write(&temporary, content).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// How a [`Reloads`] stand-in answers one request: the answers real
/// collectors give, failures included.
#[derive(Clone, Debug)]
pub enum Answer {
    /// `200 OK`, empty body, after the delay.
    Ok(Duration),
    /// This status line (`"500 Internal Server Error"`) and body, at once.
    Status(&'static str, &'static str),
    /// The request is read and never answered; the connection stays open
    /// (a reload stuck in the collector).
    Hang,
}

impl Answer {
    /// Prometheus' answer to `POST /-/reload` when the new configuration
    /// fails to apply (a rule file that does not parse): it keeps running
    /// what it had loaded.
    pub const PROMETHEUS_FAILED: Answer = Answer::Status(
        "500 Internal Server Error",
        "failed to reload config: one or more errors occurred while applying the new configuration",
    );
    /// Fluent Bit's answer to `POST /api/v2/reload` while an earlier reload
    /// is still in progress (and for good, when that one is stuck).
    pub const FLUENT_BIT_IN_PROGRESS: Answer = Answer::Status(
        "400 Bad Request",
        "{\"reload\":\"in progress\",\"status\":-2}",
    );
}

impl Reloads {
    /// Answers the requests in turn from `script` (the last answer repeats
    /// for every later request), recording each as [`Reloads::start_slow`]
    /// does.
    pub async fn start_scripted(watched: &[&Path], script: Vec<Answer>) -> Reloads {
        assert!(!script.is_empty(), "a script of at least one answer");
        // The script decides; set_answer and fail_next do not apply.
        Self::serve(
            watched,
            Policy::ok_after(Duration::ZERO),
            move |n| match script[n.min(script.len() - 1)] {
                Answer::Ok(delay) => Some(Reply {
                    status: 200,
                    line: "200 OK".to_owned(),
                    body: "",
                    delay,
                }),
                Answer::Status(line, body) => Some(Reply {
                    status: line
                        .split(' ')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                    line: line.to_owned(),
                    body,
                    delay: Duration::ZERO,
                }),
                Answer::Hang => None,
            },
        )
        .await
    }
}

/// How a [`StatusStandIn`] answers `GET /stats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusMode {
    /// Metricbeat's shape: `libbeat.config.module.running` counts `base`
    /// modules, plus one while the copy is loaded.
    Counts,
    /// An answer that is not the status (a proxy's error page).
    Garbage,
}

/// A collector's status, in place of Metricbeat's `/stats`: it "loads" the
/// watched copy as soon as it appears, and "stops" it `stop_after` it
/// disappeared (`None`: never), whether or not anyone reads it. It records
/// when it first served an answer with the copy, and one without it after.
pub struct StatusStandIn {
    pub addr: SocketAddr,
    state: Arc<Mutex<StandInState>>,
}

#[derive(Debug, Default)]
struct StandInState {
    loaded: bool,
    /// When the copy was seen gone while loaded.
    gone_since: Option<Instant>,
    /// When an answer that counted the copy was first served.
    served_loaded: Option<Instant>,
    /// When an answer without the copy was first served after one with it.
    served_stopped: Option<Instant>,
    reads: usize,
}

impl StatusStandIn {
    /// `base`: the running modules that are not gated (what `before` reads).
    pub async fn start(
        dst: &Path,
        base: u64,
        stop_after: Option<Duration>,
        mode: StatusMode,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<StandInState>> = Arc::default();
        // The collector's reload loop: it watches the copy every 5 ms.
        let (watcher, watched) = (state.clone(), dst.to_path_buf());
        tokio::spawn(async move {
            loop {
                {
                    let mut s = watcher.lock().unwrap();
                    let now = Instant::now();
                    if watched.exists() {
                        s.loaded = true;
                        s.gone_since = None;
                    } else if s.loaded {
                        let since = *s.gone_since.get_or_insert(now);
                        if stop_after.is_some_and(|after| now >= since + after) {
                            s.loaded = false;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let served = state.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let state = served.clone();
                tokio::spawn(async move {
                    if super::read_head(&mut stream).await.is_none() {
                        return;
                    }
                    let body = {
                        let mut s = state.lock().unwrap();
                        let now = Instant::now();
                        s.reads += 1;
                        if s.loaded {
                            s.served_loaded.get_or_insert(now);
                        } else if s.served_loaded.is_some() {
                            s.served_stopped.get_or_insert(now);
                        }
                        match mode {
                            StatusMode::Counts => format!(
                                r#"{{"beat":{{"info":{{"name":"stand-in"}}}},"libbeat":{{"config":{{"module":{{"running":{},"starts":1,"stops":0}}}}}}}}"#,
                                base + u64::from(s.loaded)
                            ),
                            StatusMode::Garbage => "<html>502 Bad Gateway</html>".to_owned(),
                        }
                    };
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}/stats", self.addr)
    }

    /// When an answer that says the copy stopped was first served.
    pub fn served_stopped(&self) -> Option<Instant> {
        self.state.lock().unwrap().served_stopped
    }

    /// Whether the stand-in runs the copy now.
    pub fn loaded(&self) -> bool {
        self.state.lock().unwrap().loaded
    }

    pub fn reads(&self) -> usize {
        self.state.lock().unwrap().reads
    }
}
