//! A real Prometheus (Debian's `prometheus` package) as an unmodified
//! collector for end-to-end tests: the process with its own config, storage
//! and log; a scrape source that records who scraped it and when; and the
//! files a gate hands Prometheus (`file_sd` target files, `prometheus.yml`).
//!
//! Everything listens on 127.0.0.1 with kernel-chosen ports (Prometheus
//! accepts `--web.listen-address=127.0.0.1:0` and logs the port it bound), so
//! tests running in parallel never race each other for a port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

/// Whether the Prometheus tests can run. Without the package they print why
/// and are skipped (`cargo test` passes on any machine), unless CI demands
/// them with `LEADER_GATE_REQUIRE_PROMETHEUS=1`: then a missing package fails.
pub fn require_prometheus() -> bool {
    if Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists() {
        return true;
    }
    if std::env::var("LEADER_GATE_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
        panic!(
            "LEADER_GATE_REQUIRE_PROMETHEUS=1 but {PROMETHEUS} or {PROMTOOL} is missing \
             (apt-get install prometheus)"
        );
    }
    println!("SKIPPED: prometheus not installed (apt-get install prometheus)");
    false
}

/// One active target as `/api/v1/targets` reports it.
#[derive(Clone, Debug)]
pub struct Target {
    pub scrape_pool: String,
    pub scrape_url: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
    pub last_error: String,
    /// When Prometheus last scraped it, as it reports (RFC 3339); read only
    /// in the failure messages that print a target (`{target:?}`).
    #[allow(dead_code)]
    pub last_scrape: String,
    /// The target's labels after relabelling (`job`, `instance`, …).
    pub labels: BTreeMap<String, String>,
}

/// A running `prometheus`, killed on drop.
pub struct PrometheusProcess {
    pub addr: SocketAddr,
    /// The `--config.file` it reads; [`PrometheusProcess::set_config`] rewrites it.
    pub config: PathBuf,
    child: Child,
    log: PathBuf,
}

impl PrometheusProcess {
    /// Starts Prometheus with `config_yaml` as its config, its storage and
    /// log (`prometheus.log`) under `dir`, and waits until it is ready.
    pub async fn start(dir: &Path, config_yaml: &str) -> PrometheusProcess {
        Self::start_with(dir, config_yaml, &[]).await
    }

    /// [`PrometheusProcess::start`] with more command-line flags (e.g.
    /// `--rules.alert.resend-delay=500ms`).
    pub async fn start_with(dir: &Path, config_yaml: &str, extra: &[&str]) -> PrometheusProcess {
        std::fs::create_dir_all(dir).expect("create prometheus dir");
        let config = dir.join("prometheus.yml");
        write_atomically(&config, config_yaml);
        let log = dir.join("prometheus.log");
        let log_file = std::fs::File::create(&log).expect("create prometheus log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            // A test's samples are worthless after it; keep the TSDB small.
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--web.listen-address=127.0.0.1:0")
            // POST /-/reload for config swaps.
            .arg("--web.enable-lifecycle")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn prometheus");
        let mut prometheus = PrometheusProcess {
            addr: ([127, 0, 0, 1], 0).into(),
            config,
            child,
            log,
        };
        prometheus.addr = prometheus.bound_address();
        prometheus.wait_ready().await;
        prometheus
    }

    /// The port Prometheus logged in `msg="Listening on" address=…`.
    fn bound_address(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let log = self.log();
            let bound = log
                .lines()
                .filter(|line| line.contains("msg=\"Listening on\""))
                .find_map(|line| {
                    let rest = &line[line.find(" address=")? + " address=".len()..];
                    rest.split_whitespace().next()?.parse().ok()
                });
            if let Some(addr) = bound {
                return addr;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("prometheus exited ({status}) before listening; log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("prometheus never logged its address; log:\n{}", self.log());
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(response) = http(self.addr, "GET", "/-/ready", &[]).await
                && response.status == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("prometheus never became ready; log:\n{}", self.log());
    }

    /// The active targets (`/api/v1/targets?state=active`).
    pub async fn targets(&self) -> Vec<Target> {
        let body = self.api("/api/v1/targets?state=active").await;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        body["data"]["activeTargets"]
            .as_array()
            .unwrap_or_else(|| panic!("no activeTargets in {body}"))
            .iter()
            .map(|t| Target {
                scrape_pool: text(&t["scrapePool"]),
                scrape_url: text(&t["scrapeUrl"]),
                health: text(&t["health"]),
                last_error: text(&t["lastError"]),
                last_scrape: text(&t["lastScrape"]),
                labels: t["labels"]
                    .as_object()
                    .map(|labels| labels.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// An instant query (`/api/v1/query`): the `data.result` array.
    pub async fn query(&self, expr: &str) -> Vec<Value> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let body = self.api(&format!("/api/v1/query?query={encoded}")).await;
        body["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("no result for {expr}: {body}"))
            .clone()
    }

    async fn api(&self, path: &str) -> Value {
        let response = http(self.addr, "GET", path, &[])
            .await
            .unwrap_or_else(|| panic!("prometheus did not answer {path}; log:\n{}", self.log()));
        assert_eq!(response.status, 200, "{path}: {}", response.body);
        serde_json::from_str(&response.body).expect("prometheus answers JSON")
    }

    /// Replaces the config file atomically (as a gate would); takes effect
    /// on [`PrometheusProcess::reload`].
    pub fn set_config(&self, config_yaml: &str) {
        write_atomically(&self.config, config_yaml);
    }

    /// `POST /-/reload`; it answers once the new config is applied (stopped
    /// scrape pools have stopped) and panics with the error if it was rejected.
    pub async fn reload(&self) {
        let response = http(self.addr, "POST", "/-/reload", &[])
            .await
            .unwrap_or_else(|| panic!("/-/reload unanswered; log:\n{}", self.log()));
        assert_eq!(
            response.status,
            200,
            "reload rejected: {}\nlog:\n{}",
            response.body,
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request a [`ScrapeSource`] received.
#[derive(Clone, Debug)]
pub struct Scrape {
    pub path: String,
    /// The scraper's `Accept` header, if any.
    pub accept: Option<String>,
    /// When the request head arrived (monotonic, for intervals).
    pub at: Instant,
    /// The same moment on the wall clock (to compare with other logs).
    pub wall: SystemTime,
}

/// "The cluster metrics": an HTTP server answering every path with a valid
/// classic-text metric and recording each request, so a test can tell which
/// scraper (one `metrics_path` each) scraped it and when.
pub struct ScrapeSource {
    pub addr: SocketAddr,
    scrapes: Arc<Mutex<Vec<Scrape>>>,
    server: JoinHandle<()>,
}

impl ScrapeSource {
    pub async fn start() -> ScrapeSource {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let scrapes = Arc::new(Mutex::new(Vec::new()));
        let record = scrapes.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer_scrape(stream, record.clone()));
            }
        });
        ScrapeSource {
            addr,
            scrapes,
            server,
        }
    }

    /// `host:port`, as a scrape target.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }

    /// Every request so far, in arrival order.
    pub fn scrapes(&self) -> Vec<Scrape> {
        self.scrapes.lock().unwrap().clone()
    }

    /// The requests for `path`, in arrival order.
    pub fn scrapes_of(&self, path: &str) -> Vec<Scrape> {
        self.scrapes()
            .into_iter()
            .filter(|s| s.path == path)
            .collect()
    }

    /// The last request for `path`.
    pub fn last_scrape_of(&self, path: &str) -> Option<Scrape> {
        self.scrapes_of(path).pop()
    }

    /// Waits for a request for `path` that arrived after `after`.
    pub async fn wait_scrape(&self, path: &str, after: Instant, timeout: Duration) -> Scrape {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(scrape) = self.scrapes_of(path).into_iter().find(|s| s.at > after) {
                return scrape;
            }
            assert!(
                Instant::now() < deadline,
                "no scrape of {path} within {timeout:?}; got {:?}",
                self.scrapes()
                    .iter()
                    .map(|s| s.path.as_str())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ScrapeSource {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn answer_scrape(mut stream: TcpStream, record: Arc<Mutex<Vec<Scrape>>>) {
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let (at, wall) = (Instant::now(), SystemTime::now());
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let accept = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, value)| value.trim().to_owned());
    let body = format!(
        "# HELP cluster_objects Objects in the cluster.\n\
         # TYPE cluster_objects gauge\n\
         cluster_objects{{path=\"{path}\"}} 42\n"
    );
    record.lock().unwrap().push(Scrape {
        path,
        accept,
        at,
        wall,
    });
    // One request per connection: every scrape shows up as its own accept.
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Reads an HTTP request head (up to the blank line); `None` on EOF or junk.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() > 64 * 1024 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(head).ok()
}

/// One HTTP answer.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.0 request with `headers` (HTTP/1.0 so that no server chunks
/// the body; it ends when the connection closes). `None` when nothing
/// answers within 5 s.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<HttpResponse> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let mut request = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("Content-Length: 0\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let mut lines = head.lines();
        let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Some(HttpResponse {
            status,
            headers,
            body: body.to_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Writes `contents` to `path` as a gate must: a temporary file in the same
/// directory (named so that no `*.json`/`*.yml` pattern matches it), fsync,
/// rename. A reader sees the old file or the new one, never a part.
pub fn write_atomically(path: &Path, contents: &str) {
    use std::io::Write;
    let name = path.file_name().expect("a file name").to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp).expect("create temporary file");
    file.write_all(contents.as_bytes()).expect("write");
    file.sync_all().expect("fsync");
    std::fs::rename(&tmp, path).expect("rename into place");
}

/// A `file_sd` target file's JSON: `targets` scraped at `metrics_path`
/// (`__metrics_path__` overrides the job's), with extra `labels`.
pub fn file_sd_json(targets: &[String], metrics_path: &str, labels: &[(&str, &str)]) -> String {
    let mut all = serde_json::Map::new();
    all.insert("__metrics_path__".into(), json!(metrics_path));
    for (name, value) in labels {
        all.insert((*name).into(), json!(value));
    }
    serde_json::to_string_pretty(&json!([{ "targets": targets, "labels": all }]))
        .expect("serializes")
}

/// Where a scrape job's targets come from.
#[derive(Clone, Debug)]
pub enum Targets {
    /// `file_sd_configs` reading `dir/*.json`, re-read every `refresh`
    /// besides the inotify watch.
    FileSd {
        dir: PathBuf,
        refresh: Duration,
    },
    Static(Vec<String>),
}

/// One `scrape_configs` entry.
#[derive(Clone, Debug)]
pub struct ScrapeJob {
    pub name: String,
    pub metrics_path: String,
    pub targets: Targets,
}

/// A `prometheus.yml` scraping `jobs` every `scrape_interval` (the timeout
/// equals the interval: Prometheus rejects a longer one).
pub fn prometheus_yml(scrape_interval: Duration, jobs: &[ScrapeJob]) -> String {
    // JSON strings are valid YAML scalars: no quoting rules of our own.
    let q = |s: &str| serde_json::to_string(s).expect("serializes");
    let interval = format!("{}ms", scrape_interval.as_millis());
    let mut yml = format!(
        "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n\
         scrape_configs:{}\n",
        if jobs.is_empty() { " []" } else { "" }
    );
    for job in jobs {
        yml.push_str(&format!(
            "  - job_name: {}\n    metrics_path: {}\n",
            q(&job.name),
            q(&job.metrics_path)
        ));
        match &job.targets {
            Targets::FileSd { dir, refresh } => yml.push_str(&format!(
                "    file_sd_configs:\n      - files: [{}]\n        refresh_interval: {}ms\n",
                q(&dir.join("*.json").to_string_lossy()),
                refresh.as_millis()
            )),
            Targets::Static(targets) => yml.push_str(&format!(
                "    static_configs:\n      - targets: [{}]\n",
                targets.iter().map(|t| q(t)).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    yml
}

/// A `prometheus.yml` with no scrape job that evaluates every rule file
/// matching `rules_glob` every `interval` and sends alerts to `alertmanager`
/// (`host:port`; Prometheus POSTs them to `/api/v2/alerts`). A glob that
/// matches nothing is valid: Prometheus starts, and a reload answers 200.
pub fn prometheus_yml_with_rules(
    interval: Duration,
    rules_glob: &Path,
    alertmanager: &str,
) -> String {
    let q = |s: &str| serde_json::to_string(s).expect("serializes");
    let interval = format!("{}ms", interval.as_millis());
    format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: [{am}]\n\
         rule_files: [{glob}]\nscrape_configs: []\n",
        am = q(alertmanager),
        glob = q(&rules_glob.to_string_lossy()),
    )
}

/// A rule file with one group of one alert, `name`, that always fires
/// (`vector(1)`, no `for`), evaluated every `interval`: while Prometheus has
/// it loaded, it sends the alert to its Alertmanager again and again.
pub fn always_firing_rules(name: &str, interval: Duration) -> String {
    format!(
        "groups:\n  - name: leader-only\n    interval: {}ms\n    rules:\n      - alert: {name}\n        expr: vector(1)\n",
        interval.as_millis()
    )
}

/// Where Prometheus sends alerts on an Alertmanager (API v2).
pub const ALERTS_PATH: &str = "/api/v2/alerts";
