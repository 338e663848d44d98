//! A real, unmodified collector behind each gate: two "pods", each a
//! `leader-gate serve` (against one fake Lease API server) and a Debian
//! Prometheus that scrapes "the cluster metrics" (a [`ScrapeSource`] that
//! records who scraped it and when; one `metrics_path` per pod), gated by
//! `leader-gate file-gate` writing its `file_sd` target file, or by
//! `leader-gate exec -- prometheus …`.
//!
//! Across a SIGTERM of the leading `serve`, a SIGKILL of it and an external
//! holder edit, judged from timestamps alone:
//!
//! - a pod's Prometheus scrapes only while that pod leads (its sidecar's
//!   event stream says when: from the published start to the published stop,
//!   or, when the sidecar dies silently, to the end of the last validity it
//!   announced), plus the gate lag the test declares with `--gate-lag`;
//! - the scrapes of one pod's leadership period ([first, last]) never overlap
//!   those of another pod's period — no tolerance at all;
//! - scraping resumes on the new leader.
//!
//! The timings follow the rule every gate must satisfy: *margin = lease −
//! renew deadline > gate delay*, and *`--gate-lag` ≥ gate delay*.
//!
//! - `file_sd`: Prometheus' discovery manager passes updates on at most every
//!   5 s; removal → last scrape is a few seconds, up to about 10 s is
//!   possible. Lease 15 s, renew deadline 3 s: margin 12 s > gate lag 11 s ≥
//!   10 s.
//! - `exec`: the gate delay is the grace between SIGTERM and SIGKILL (3 s;
//!   Prometheus stops within about a second of a SIGTERM). Lease 8 s, renew
//!   deadline 3 s: margin 5 s > gate lag 4 s ≥ 3 s plus the reaction.
//!
//! Prints `MEASURE` lines: step-down (or SIGKILL) → last scrape of the old
//! pod, last old scrape → first new scrape. Skipped with a printed reason
//! when Prometheus is not installed, unless `LEADER_GATE_REQUIRE_PROMETHEUS=1`.
//!
//! Below those, "One recipe, one event": every Prometheus recipe the docs
//! keep (`file_sd`; a `rule_files` pattern with `--reload-url`; `exec`
//! around a Prometheus agent), one pod each, ended by a SIGTERM of `serve`,
//! a SIGKILL of `serve`, or a SIGKILL of the gate process while another
//! holder takes the Lease; each asserts the bound the docs promise. And
//! what the rules recipe and the file gate's reload stand-ins rely on: how
//! Prometheus answers a reload that fails.

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leader_gate::clock::{parse_micro_time, wall_micros};
use serde_json::json;
use support::events::{EventClient, Received};
use support::fake_apiserver::FakeApiServer;
use support::monitor::Monitor;
use support::prometheus::{
    PROMETHEUS, PrometheusProcess, Scrape, ScrapeJob, ScrapeSource, Targets, file_sd_json,
    prometheus_yml, require_prometheus, write_atomically,
};
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const INTERVAL: Duration = Duration::from_secs(1);
/// The only tolerance: a scrape Prometheus sent just before its deadline may
/// be recorded by the source a little after it (the two are scheduled
/// independently). A new scrape would be a new loop turn, an interval later.
const IN_FLIGHT: Duration = Duration::from_millis(250);
/// How long after a start Prometheus may take to scrape: discovery (at most
/// every 5 s, up to about 10 s), or a process start on a busy machine.
const FIRST_SCRAPE: Duration = Duration::from_secs(30);

/// How each pod's Prometheus is gated, and the timing that covers it.
#[derive(Clone, Copy, Debug)]
enum Gate {
    /// `leader-gate file-gate SRC:DST` into the `file_sd` directory of an
    /// always-running Prometheus.
    FileSd,
    /// The same, acknowledged once that Prometheus' own `/metrics` shows
    /// the job without targets (`--status-url`, `--stopped-when`).
    FileSdProven,
    /// `leader-gate exec --grace 3s -- prometheus …` with a static config.
    Exec,
}

impl Gate {
    fn timing(self) -> Timing {
        match self {
            Gate::FileSd | Gate::FileSdProven => Timing {
                lease: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(3),
                retry: SECOND,
            },
            Gate::Exec => Timing {
                lease: Duration::from_secs(8),
                renew_deadline: Duration::from_secs(3),
                retry: SECOND,
            },
        }
    }

    /// `--gate-lag`: how long after a pod stops leading its collector may
    /// still scrape (≥ the gate delay, < the margin).
    fn lag(self) -> Duration {
        match self {
            Gate::FileSd | Gate::FileSdProven => Duration::from_secs(11),
            Gate::Exec => Duration::from_secs(4),
        }
    }

    fn serve_args(self) -> Vec<String> {
        let shutdown = self.timing().lease;
        vec![
            "--gate-lag".into(),
            format!("{}s", self.lag().as_secs()),
            "--shutdown-timeout".into(),
            format!("{}s", shutdown.as_secs()),
        ]
    }

    fn label(self) -> &'static str {
        match self {
            Gate::FileSd => "file-gate + file_sd",
            Gate::FileSdProven => "file-gate + file_sd, proven by /metrics",
            Gate::Exec => "exec -- prometheus",
        }
    }
}

/// Prometheus' own word that the gated job scrapes nothing.
const PROVEN_STOPPED: &str = r#"prometheus_target_scrape_pool_targets{scrape_job="cluster"} == 0"#;

/// `exec`'s time between SIGTERM and SIGKILL.
const EXEC_GRACE: &str = "3s";

/// What ends a leader's term in one step of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// SIGTERM of the leading `serve`: a graceful hand-over (G6).
    Sigterm,
    /// SIGKILL of the leading `serve`: its gate closes by validity alone.
    Sigkill,
    /// An operator writes another holder into the Lease (G7); the ghost
    /// expires after a lease duration.
    ExternalHolder,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Sigterm => "SIGTERM of the leader's serve",
            Trigger::Sigkill => "SIGKILL of the leader's serve",
            Trigger::ExternalHolder => "external holder edit",
        }
    }
}

/// One failover the scenario went through, to measure afterwards.
struct Failover {
    trigger: Trigger,
    at_us: i64,
    old_pod: String,
    old_term: String,
    new_pod: String,
    new_term: String,
}

/// One incarnation's `/events`, recorded in the background.
struct Recording {
    events: Arc<Mutex<Vec<Received>>>,
    ended: Arc<AtomicBool>,
}

impl Recording {
    async fn start(gate: SocketAddr) -> Recording {
        let mut client = EventClient::connect(gate, None).await;
        assert_eq!(client.status, 200, "/events");
        let events: Arc<Mutex<Vec<Received>>> = Arc::default();
        let ended: Arc<AtomicBool> = Arc::default();
        let (record, end) = (events.clone(), ended.clone());
        tokio::spawn(async move {
            loop {
                match client.next(Duration::from_secs(60)).await {
                    Some(received) => record.lock().unwrap().push(received),
                    None if client.ended => break,
                    None => {}
                }
            }
            end.store(true, Ordering::SeqCst);
        });
        Recording { events, ended }
    }
}

/// A stretch of time during which one pod led, as its event stream told.
#[derive(Clone, Debug)]
struct Period {
    pod: String,
    term: String,
    /// When the start was published (wall µs).
    start_us: i64,
    /// When the stop was published or, for a sidecar that died without a
    /// word, when the last validity it announced ran out; `None` while it
    /// still leads.
    end_us: Option<i64>,
    how: String,
}

/// The leadership periods one incarnation's stream shows.
fn periods_of(pod: &str, events: &[Received], ended: bool) -> Vec<Period> {
    let mut periods = Vec::new();
    let mut open: Option<Period> = None;
    let mut valid_until_us = None;
    for received in events {
        let data = &received.data;
        let valid_for_us = data["valid_for_ms"].as_i64().unwrap_or(0) * 1000;
        let new = |start_us: i64| Period {
            pod: pod.to_owned(),
            term: data["term"].as_str().expect("a term").to_owned(),
            start_us,
            end_us: None,
            how: "still leading".into(),
        };
        match received.kind() {
            "state" if data["leading"] == true => {
                // Subscribed while leading: `since` is stamped as the start is
                // published.
                let since = data["since"].as_str().and_then(parse_micro_time);
                open = Some(new(since.expect("a state's since")));
                valid_until_us = Some(received.wall_us + valid_for_us);
            }
            "started-leading" => {
                open = Some(new(data["published_at_us"].as_i64().expect("published")));
                valid_until_us = Some(received.wall_us + valid_for_us);
            }
            "renewed" => valid_until_us = Some(received.wall_us + valid_for_us),
            "stopped-leading" => {
                if let Some(mut period) = open.take() {
                    period.end_us = data["published_at_us"].as_i64();
                    period.how = format!("stopped-leading ({})", data["reason"]);
                    periods.push(period);
                }
            }
            _ => {}
        }
    }
    if let Some(mut period) = open {
        if ended {
            period.end_us = valid_until_us;
            period.how = "stream lost; its last validity ran out".into();
        }
        periods.push(period);
    }
    periods
}

/// A client gate or collector process: on drop SIGTERM, then SIGKILL.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(program: &str, args: &[String], log: &Path) -> Process {
        let log_file = std::fs::File::create(log).expect("create log");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        Process {
            child,
            log: log.to_owned(),
        }
    }

    /// SIGTERM and up to `timeout` for the exit.
    fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            return Some(status);
        }
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // `exec` stops its collector on SIGTERM; a SIGKILL would orphan it.
        if self.terminate(Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One pod: a `serve` (restarted on the same gate port, as a container
/// restart keeps its pod's port), the gate client, and Prometheus.
struct Pod {
    name: String,
    /// The path its Prometheus scrapes the source at.
    path: String,
    dir: PathBuf,
    gate: SocketAddr,
    sidecar: Sidecar,
    recordings: Vec<Recording>,
    client: Process,
    /// The always-running Prometheus of the `file_sd` gate.
    prometheus: Option<PrometheusProcess>,
    /// `exec`: each child's pid and `LEADER_GATE_TERM`, one line per start.
    termlog: PathBuf,
    prometheus_config: PathBuf,
}

impl Pod {
    async fn start(
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        gate: Gate,
        source: &ScrapeSource,
    ) -> Pod {
        let dir = dir.join(name);
        let serve_dir = dir.join("serve-0");
        std::fs::create_dir_all(&serve_dir).unwrap();
        let args = gate.serve_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sidecar = Sidecar::spawn_with(api, &serve_dir, name, gate.timing(), &args);
        sidecar.wait_serving().await;
        let recording = Recording::start(sidecar.gate).await;
        let path = format!("/pod-{name}");
        let url = format!("http://{}", sidecar.gate);
        let leader_gate = env!("CARGO_BIN_EXE_leader-gate");
        let termlog = dir.join("termlog");
        let prometheus_config = dir.join("prometheus.yml");
        let (client, prometheus) = match gate {
            Gate::FileSd | Gate::FileSdProven => {
                let (src, targets) = (dir.join("src"), dir.join("targets"));
                std::fs::create_dir_all(&src).unwrap();
                std::fs::create_dir_all(&targets).unwrap();
                let src = src.join("cluster.json");
                write_atomically(
                    &src,
                    &file_sd_json(&[source.target()], &path, &[("pod", name)]),
                );
                let job = ScrapeJob {
                    name: "cluster".into(),
                    metrics_path: path.clone(),
                    targets: Targets::FileSd {
                        dir: targets.clone(),
                        refresh: SECOND,
                    },
                };
                let prometheus = PrometheusProcess::start(
                    &dir.join("prometheus"),
                    &prometheus_yml(INTERVAL, &[job]),
                )
                .await;
                let mapping = format!(
                    "{}:{}",
                    src.display(),
                    targets.join("cluster.json").display()
                );
                let mut args = vec!["file-gate".into(), "--url".into(), url];
                if let Gate::FileSdProven = gate {
                    args.extend([
                        format!("--status-url=http://{}/metrics", prometheus.addr),
                        format!("--stopped-when={PROVEN_STOPPED}"),
                    ]);
                }
                args.push(mapping);
                let client = Process::spawn(leader_gate, &args, &dir.join("file-gate.log"));
                (client, Some(prometheus))
            }
            Gate::Exec => {
                let job = ScrapeJob {
                    name: "cluster".into(),
                    metrics_path: path.clone(),
                    targets: Targets::Static(vec![source.target()]),
                };
                write_atomically(&prometheus_config, &prometheus_yml(INTERVAL, &[job]));
                let quoted = |p: &Path| {
                    let text = p.display().to_string();
                    assert!(!text.contains('\''), "{text}");
                    format!("'{text}'")
                };
                // The collector's own command, unmodified; the wrapper only
                // logs the term it was started for.
                let script = format!(
                    "echo \"$$ $LEADER_GATE_TERM\" >> {termlog}; \
                     exec {PROMETHEUS} --config.file={config} --storage.tsdb.path={data} \
                     --storage.tsdb.retention.time=1h --web.listen-address=127.0.0.1:0 \
                     2>> {log}",
                    termlog = quoted(&termlog),
                    config = quoted(&prometheus_config),
                    data = quoted(&dir.join("data")),
                    log = quoted(&dir.join("prometheus.log")),
                );
                let client = Process::spawn(
                    leader_gate,
                    &[
                        "exec".into(),
                        "--url".into(),
                        url,
                        "--grace".into(),
                        EXEC_GRACE.into(),
                        "--".into(),
                        "sh".into(),
                        "-c".into(),
                        script,
                    ],
                    &dir.join("exec.log"),
                );
                (client, None)
            }
        };
        Pod {
            name: name.to_owned(),
            path,
            gate: sidecar.gate,
            dir,
            sidecar,
            recordings: vec![recording],
            client,
            prometheus,
            termlog,
            prometheus_config,
        }
    }

    /// A new `serve` process for this pod, on the same gate port.
    async fn restart(&mut self, api: &FakeApiServer, gate: Gate) {
        let dir = self.dir.join(format!("serve-{}", self.recordings.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = gate.serve_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.sidecar = Sidecar::spawn_on(api, &dir, &self.name, gate.timing(), self.gate, &args);
        self.sidecar.wait_serving().await;
        self.recordings.push(Recording::start(self.gate).await);
    }

    fn periods(&self) -> Vec<Period> {
        self.recordings
            .iter()
            .flat_map(|r| {
                let events = r.events.lock().unwrap().clone();
                periods_of(&self.name, &events, r.ended.load(Ordering::SeqCst))
            })
            .collect()
    }

    /// `exec`: the term of each collector it started, in order.
    fn started_terms(&self) -> Vec<String> {
        std::fs::read_to_string(&self.termlog)
            .unwrap_or_default()
            .lines()
            .map(|line| line.split_once(' ').map_or("", |(_, term)| term).to_owned())
            .collect()
    }

    /// `exec`: SIGKILLs any collector it started that still runs (only if
    /// the gate itself failed to stop it).
    fn kill_leftover_collectors(&self) {
        let log = std::fs::read_to_string(&self.termlog).unwrap_or_default();
        let config = self.prometheus_config.display().to_string();
        for pid in log
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&config) {
                // SAFETY: kill(2) on a process this test's gate started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    fn logs(&self) -> String {
        let tail = |text: String| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(25)..].join("\n")
        };
        let mut out = format!(
            "--- {} serve ---\n{}\n--- {} gate client ---\n{}",
            self.name,
            tail(self.sidecar.log()),
            self.name,
            tail(self.client.log())
        );
        if let Some(prometheus) = &self.prometheus {
            out.push_str(&format!(
                "\n--- {} prometheus ---\n{}",
                self.name,
                tail(prometheus.log())
            ));
        }
        out
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.client.terminate(Duration::from_secs(10));
        self.kill_leftover_collectors();
    }
}

/// The two pods, the API server they contend on and the scraped source.
struct Pods {
    gate: Gate,
    api: FakeApiServer,
    source: ScrapeSource,
    pods: Vec<Pod>,
    monitor: Monitor,
}

impl Pods {
    async fn start(test: &str, gate: Gate) -> Pods {
        let api = FakeApiServer::start("collectors", LEASE).await;
        let source = ScrapeSource::start().await;
        let dir = test_dir(test);
        let mut pods = Vec::new();
        for name in ["a", "b"] {
            pods.push(Pod::start(&api, &dir, name, gate, &source).await);
        }
        let monitor = Monitor::start(&pods.iter().map(|p| &p.sidecar).collect::<Vec<_>>());
        Pods {
            gate,
            api,
            source,
            pods,
            monitor,
        }
    }

    fn pod(&self, name: &str) -> &Pod {
        self.pods.iter().find(|p| p.name == name).expect("a pod")
    }

    fn pod_mut(&mut self, name: &str) -> &mut Pod {
        self.pods
            .iter_mut()
            .find(|p| p.name == name)
            .expect("a pod")
    }

    /// Waits until a pod leads in a term other than `not`: (pod, term, when
    /// `/leader` said so).
    async fn wait_leader(&self, not: Option<&str>, timeout: Duration) -> (String, String, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            for pod in &self.pods {
                if let Some(probe) = pod.sidecar.leader().await
                    && probe.leading()
                    && probe.term() != not
                {
                    let term = probe.term().expect("a term").to_owned();
                    return (pod.name.clone(), term, Instant::now());
                }
            }
            assert!(
                Instant::now() < deadline,
                "nobody led within {timeout:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `pod`'s Prometheus scraped twice after `after`.
    async fn wait_scraping(&self, pod: &str, after: Instant) {
        let path = &self.pod(pod).path;
        let first = self.source.wait_scrape(path, after, FIRST_SCRAPE).await;
        self.source.wait_scrape(path, first.at, INTERVAL * 5).await;
    }

    /// Ends the current leader's term by `trigger`, waits until a new term
    /// leads and its Prometheus scrapes, and restarts a stopped `serve`.
    async fn failover(&mut self, trigger: Trigger) -> Failover {
        let timing = self.gate.timing();
        let (old_pod, old_term, led_at) = self.wait_leader(None, timing.lease * 3).await;
        self.wait_scraping(&old_pod, led_at).await;
        // The other pod follows (it has seen the Lease), so it takes over.
        for pod in self.pods.iter().filter(|p| p.name != old_pod) {
            pod.sidecar
                .wait_for(timing.lease * 2, |p| p.holder() == Some(old_pod.as_str()))
                .await;
        }
        let at_us = wall_micros();
        match trigger {
            Trigger::Sigterm | Trigger::Sigkill => {
                let pod = self.pod_mut(&old_pod);
                let signal = if trigger == Trigger::Sigterm {
                    libc::SIGTERM
                } else {
                    libc::SIGKILL
                };
                pod.sidecar.signal(signal);
                let status = pod
                    .sidecar
                    .wait_exit(timing.lease * 2)
                    .await
                    .unwrap_or_else(|| panic!("{old_pod}'s serve did not exit"));
                if trigger == Trigger::Sigterm {
                    assert!(
                        status.success(),
                        "{old_pod}'s serve after SIGTERM: {status}"
                    );
                }
            }
            Trigger::ExternalHolder => {
                self.api
                    .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
            }
        }
        let (new_pod, new_term, led_at) = self.wait_leader(Some(&old_term), timing.lease * 3).await;
        // Scraping resumes on the new leader.
        self.wait_scraping(&new_pod, led_at).await;
        if trigger != Trigger::ExternalHolder {
            let (gate, api) = (self.gate, &self.api);
            let pod = self.pods.iter_mut().find(|p| p.name == old_pod).unwrap();
            pod.restart(api, gate).await;
        }
        Failover {
            trigger,
            at_us,
            old_pod,
            old_term,
            new_pod,
            new_term,
        }
    }

    /// Judges every scrape so far against every pod's leadership periods,
    /// and prints what each failover measured.
    fn judge(&self, failovers: &[Failover]) {
        let gate = self.gate;
        let lag_us = (gate.lag() + IN_FLIGHT).as_micros() as i64;
        let periods: Vec<Period> = self.pods.iter().flat_map(Pod::periods).collect();
        // Times in messages: seconds since the first leadership began.
        let t0 = periods
            .iter()
            .map(|p| p.start_us)
            .min()
            .expect("someone led");
        let table = describe(&periods, t0);
        let scrapes = self.source.scrapes();
        let known: HashSet<&str> = self.pods.iter().map(|p| p.path.as_str()).collect();
        let strays: Vec<&Scrape> = scrapes
            .iter()
            .filter(|s| !known.contains(s.path.as_str()))
            .collect();
        assert!(strays.is_empty(), "scrapes of unknown paths: {strays:?}");

        // Each scrape belongs to a leadership period of its pod, counting
        // the declared gate lag after the end.
        let mut groups: Vec<(usize, Vec<i64>)> = Vec::new();
        for scrape in &scrapes {
            let pod = self.pods.iter().find(|p| p.path == scrape.path).unwrap();
            let at = wall_us(scrape.wall);
            let period = periods.iter().position(|p| {
                p.pod == pod.name
                    && p.start_us <= at
                    && p.end_us.is_none_or(|end| at <= end + lag_us)
            });
            let Some(index) = period else {
                panic!(
                    "{gate:?}: pod {}'s Prometheus scraped at {} while it did not lead \
                     (gate lag {:?}); periods:\n{table}\n{}",
                    pod.name,
                    seconds(at - t0),
                    gate.lag(),
                    self.logs()
                );
            };
            match groups.iter_mut().find(|(i, _)| *i == index) {
                Some((_, times)) => times.push(at),
                None => groups.push((index, vec![at])),
            }
        }
        let span = |index: usize| -> Option<(i64, i64)> {
            let (_, times) = groups.iter().find(|(i, _)| *i == index)?;
            Some((*times.iter().min()?, *times.iter().max()?))
        };

        // Never both at once: [first, last] of one pod's period and of
        // another pod's period do not overlap.
        for (i, a) in periods.iter().enumerate() {
            for (j, b) in periods.iter().enumerate() {
                if i >= j || a.pod == b.pod {
                    continue;
                }
                let (Some(sa), Some(sb)) = (span(i), span(j)) else {
                    continue;
                };
                assert!(
                    sa.1 < sb.0 || sb.1 < sa.0,
                    "{gate:?}: both scraped at once: pod {} term {} scraped {} .. {}, pod {} term {} \
                     scraped {} .. {}\nperiods:\n{table}",
                    a.pod,
                    a.term,
                    seconds(sa.0 - t0),
                    seconds(sa.1 - t0),
                    b.pod,
                    b.term,
                    seconds(sb.0 - t0),
                    seconds(sb.1 - t0),
                );
            }
        }

        // Closed before any peer could start: the last scrape of a period
        // comes before the start of every later period of another pod.
        for (i, a) in periods.iter().enumerate() {
            let Some((_, last)) = span(i) else {
                continue;
            };
            for b in periods
                .iter()
                .filter(|b| b.pod != a.pod && b.start_us > a.start_us)
            {
                assert!(
                    last < b.start_us,
                    "{gate:?}: pod {} (term {}) was still scraped {} ms after pod {} started \
                     leading (term {})\nperiods:\n{table}",
                    a.pod,
                    a.term,
                    ms(last - b.start_us),
                    b.pod,
                    b.term,
                );
            }
        }

        for failover in failovers {
            let find = |pod: &str, term: &str| {
                periods
                    .iter()
                    .position(|p| p.pod == pod && p.term == term)
                    .unwrap_or_else(|| panic!("no period of {pod} term {term}:\n{table}"))
            };
            let (old, new) = (
                find(&failover.old_pod, &failover.old_term),
                find(&failover.new_pod, &failover.new_term),
            );
            let old_span = span(old).expect("the old leader was scraped");
            let new_span = span(new).expect("the new leader was scraped");
            let old_end = periods[old].end_us.expect("the old term ended");
            let (from, from_what) = match failover.trigger {
                Trigger::Sigkill => (failover.at_us, "SIGKILL"),
                _ => (old_end, "step-down"),
            };
            println!(
                "MEASURE {} / {}: {from_what} -> last scrape of pod {}: {} ms{}",
                gate.label(),
                failover.trigger.as_str(),
                failover.old_pod,
                ms(old_span.1 - from),
                if failover.trigger == Trigger::Sigkill {
                    format!(
                        " (its validity ran out {} ms after the SIGKILL)",
                        ms(old_end - failover.at_us)
                    )
                } else {
                    String::new()
                }
            );
            println!(
                "MEASURE {} / {}: last scrape of pod {} -> first scrape of pod {}: {} ms \
                 (pod {} started leading {} ms after that last scrape)",
                gate.label(),
                failover.trigger.as_str(),
                failover.old_pod,
                failover.new_pod,
                ms(new_span.0 - old_span.1),
                failover.new_pod,
                ms(periods[new].start_us - old_span.1),
            );
        }
        self.monitor.assert_no_overlap();
    }

    fn logs(&self) -> String {
        self.pods
            .iter()
            .map(Pod::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The periods, one a line, in seconds since `t0`.
fn describe(periods: &[Period], t0: i64) -> String {
    periods
        .iter()
        .map(|p| {
            let end = p.end_us.map_or("now".into(), |end| seconds(end - t0));
            let start = seconds(p.start_us - t0);
            format!(
                "  pod {} term {}: {start} .. {end} ({})",
                p.pod, p.term, p.how
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Microseconds as `+12.345 s`.
fn seconds(us: i64) -> String {
    format!("{:+.3} s", us as f64 / 1e6)
}

fn wall_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

fn ms(us: i64) -> i64 {
    us / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gated_prometheus_scrapes_only_while_its_pod_leads_across_sigterm_sigkill_and_an_external_holder()
 {
    if !require_prometheus() {
        return;
    }
    let mut pods = Pods::start("prom-gates-file-sd", Gate::FileSd).await;
    let mut failovers = Vec::new();
    for trigger in [Trigger::Sigterm, Trigger::Sigkill, Trigger::ExternalHolder] {
        failovers.push(pods.failover(trigger).await);
    }
    // Late scrapes of an old period would show up by now.
    tokio::time::sleep(INTERVAL * 3).await;
    pods.judge(&failovers);
    // The gate's copy is where the leader's Prometheus reads it, and only there.
    let (leader, _, _) = pods.wait_leader(None, SECOND).await;
    for pod in &pods.pods {
        let dst = pod.dir.join("targets").join("cluster.json");
        assert_eq!(dst.exists(), pod.name == leader, "{}", dst.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gated_prometheus_proven_by_its_own_metrics_hands_over_before_the_gate_lag_and_never_overlaps()
 {
    if !require_prometheus() {
        return;
    }
    let mut pods = Pods::start("prom-gates-file-sd-proven", Gate::FileSdProven).await;
    let mut failovers = Vec::new();
    for trigger in [Trigger::Sigterm, Trigger::Sigterm, Trigger::Sigkill] {
        failovers.push(pods.failover(trigger).await);
    }
    tokio::time::sleep(INTERVAL * 3).await;
    // Every scrape in its pod's period (plus the gate lag), no two pods'
    // scrapes overlapping: the proof never came before the last scrape.
    pods.judge(&failovers);
    // A graceful hand-over waited for Prometheus' word, not the gate lag:
    // the new term began sooner after the SIGTERM than the lag (and, as
    // judged above, after the old pod's last scrape).
    let periods: Vec<Period> = pods.pods.iter().flat_map(Pod::periods).collect();
    for failover in failovers.iter().filter(|f| f.trigger == Trigger::Sigterm) {
        let new = periods
            .iter()
            .find(|p| p.term == failover.new_term)
            .expect("the new term's period");
        let after = Duration::from_micros((new.start_us - failover.at_us).max(0) as u64);
        assert!(
            after < Gate::FileSdProven.lag(),
            "the new term began {after:?} after the SIGTERM: the release waited the gate lag \
             ({:?}), Prometheus' word did not end it\n{}",
            Gate::FileSdProven.lag(),
            pods.logs()
        );
        println!(
            "MEASURE {} / sigterm: new term {} ms after the SIGTERM",
            Gate::FileSdProven.label(),
            ms(new.start_us - failover.at_us)
        );
    }
    for pod in &pods.pods {
        let log = std::fs::read_to_string(pod.dir.join("file-gate.log")).unwrap_or_default();
        assert!(
            !log.contains("cannot be proven") && !log.contains("says nothing"),
            "{}: {log}",
            pod.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_wrapped_prometheus_runs_only_while_its_pod_leads_with_a_new_term_each_start() {
    if !require_prometheus() {
        return;
    }
    let mut pods = Pods::start("prom-gates-exec", Gate::Exec).await;
    let mut failovers = Vec::new();
    for trigger in [Trigger::Sigterm, Trigger::Sigkill] {
        failovers.push(pods.failover(trigger).await);
    }
    tokio::time::sleep(INTERVAL * 3).await;
    pods.judge(&failovers);

    // Each Prometheus was started for a term its pod led, and each term its
    // pod led started one Prometheus: never the same term twice.
    let mut all_terms = HashSet::new();
    for pod in &pods.pods {
        let started = pod.started_terms();
        let led: Vec<String> = pod.periods().into_iter().map(|p| p.term).collect();
        assert_eq!(
            started, led,
            "pod {}: LEADER_GATE_TERM per start vs terms led",
            pod.name
        );
        for term in started {
            assert!(!term.is_empty(), "pod {}: no LEADER_GATE_TERM", pod.name);
            assert!(all_terms.insert(term.clone()), "term {term} started twice");
        }
    }
    println!("LEADER_GATE_TERM per Prometheus start: {all_terms:?}");
    // On its own SIGTERM `exec` stops its collector and exits 0.
    for pod in &mut pods.pods {
        let status = pod.client.terminate(Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "pod {}'s exec on SIGTERM: {status:?}\n{}",
            pod.name,
            pod.client.log()
        );
    }
}

// === One recipe, one event ===
//
// Each Prometheus recipe the docs keep, run as documented beside one
// `serve`, and ended by one event. The leader-only work is what reaches the
// source (scrapes of the gated job; for the rules recipe, the alert
// notifications of the gated rule group, the source standing in for an
// Alertmanager); the test asserts from their arrival times that it stopped
// within the bound the docs promise, counted from the event:
//
// - graceful release (SIGTERM of `serve`): "not leading" is published at
//   once, so the bound is the recipe's gate delay (which its `--gate-lag`
//   covers);
// - SIGKILL of `serve`: its last validity runs out at most a renew deadline
//   after the kill, then the gate delay;
// - SIGKILL of the gate process itself while leadership moves to another
//   holder, the gate restarted as the kubelet restarts a native sidecar:
//   the gate delay after the kill (`file_sd`: the guard removes the copy;
//   `exec`: the guard kills the collector), or after the restart for a
//   recipe that needs the reload (the rules recipe: the restarted gate sends
//   a reload at start-up).

/// A recipe of the docs, as a test runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recipe {
    /// `file-gate` writes a `file_sd` targets file; no reload.
    FileSd,
    /// `exec -- prometheus --enable-feature=agent` with the leader-only job
    /// in its own config.
    Exec,
    /// `file-gate --reload-url …/-/reload` writes a rule file matched by a
    /// `rule_files` glob.
    RuleFiles,
}

/// What ends the term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Sigterm,
    SidecarKilled,
    GateKilledAndLeadershipMoved,
}

/// `exec --grace` of the rules below.
const RECIPE_EXEC_GRACE: Duration = Duration::from_secs(3);
/// The gate restarts this long after it was killed.
const GATE_RESTART: Duration = Duration::from_secs(1);
/// Prometheus resends a firing alert at most this often (its flag).
const RESEND: &str = "--rules.alert.resend-delay=500ms";

impl Recipe {
    /// The timings the docs give for the recipe.
    fn timing(self) -> Timing {
        match self {
            Recipe::FileSd => Timing {
                lease: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(3),
                retry: SECOND,
            },
            Recipe::Exec | Recipe::RuleFiles => Timing {
                lease: Duration::from_secs(8),
                renew_deadline: Duration::from_secs(3),
                retry: SECOND,
            },
        }
    }

    /// `--gate-lag` as the docs advise.
    fn lag(self) -> Duration {
        match self {
            Recipe::FileSd => Duration::from_secs(11),
            Recipe::Exec => Duration::from_secs(4),
            Recipe::RuleFiles => Duration::from_secs(2),
        }
    }

    /// The gate delay the docs promise: from "not leading" (or from the
    /// gate's restart) until the collector stopped the leader-only work.
    fn delay(self) -> Duration {
        match self {
            // Discovery updates batched every 5 s, then the scrape pool stops.
            Recipe::FileSd => Duration::from_secs(10),
            // SIGTERM, and SIGKILL after the grace at the latest.
            Recipe::Exec => RECIPE_EXEC_GRACE,
            // The reload itself: the rule group stops before it answers.
            Recipe::RuleFiles => SECOND,
        }
    }

    /// The path of the leader-only work at the source.
    fn work(self) -> &'static str {
        match self {
            Recipe::FileSd | Recipe::Exec => "/leader-only",
            Recipe::RuleFiles => support::prometheus::ALERTS_PATH,
        }
    }

    /// No arrival for this long means the work stopped (several turns of
    /// its loop: a 1 s scrape interval, a 1 s evaluation with alerts resent
    /// every 0.5 s).
    fn quiet(self) -> Duration {
        Duration::from_millis(3500)
    }
}

/// One pod running one recipe.
struct RecipePod {
    recipe: Recipe,
    api: FakeApiServer,
    dir: PathBuf,
    sidecar: Sidecar,
    source: ScrapeSource,
    /// The always-running Prometheus (`file_sd`, rules).
    prometheus: Option<PrometheusProcess>,
    /// `file-gate` or `exec`.
    gate: Option<Process>,
    /// Where the file gate's copy goes (`file_sd`, rules).
    copy: PathBuf,
    /// `exec`: the pid of each collector it started.
    termlog: PathBuf,
}

impl RecipePod {
    async fn start(test: &str, recipe: Recipe) -> RecipePod {
        let api = FakeApiServer::start("collectors", LEASE).await;
        let dir = test_dir(test);
        let timing = recipe.timing();
        let lag = format!("{}ms", recipe.lag().as_millis());
        let shutdown = format!("{}s", (recipe.lag() + Duration::from_secs(4)).as_secs());
        let sidecar = Sidecar::spawn_with(
            &api,
            &dir,
            "a",
            timing,
            &["--gate-lag", &lag, "--shutdown-timeout", &shutdown],
        );
        sidecar.wait_serving().await;
        sidecar.wait_leading(timing.lease * 3).await;
        let source = ScrapeSource::start().await;
        let leader_only = ScrapeJob {
            name: "cluster".into(),
            metrics_path: recipe.work().into(),
            targets: Targets::Static(vec![source.target()]),
        };
        let copies = dir.join("leader");
        std::fs::create_dir_all(&copies).unwrap();
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let (prometheus, copy) = match recipe {
            Recipe::FileSd => {
                let job = ScrapeJob {
                    targets: Targets::FileSd {
                        dir: copies.clone(),
                        refresh: SECOND,
                    },
                    ..leader_only.clone()
                };
                let yml = prometheus_yml(INTERVAL, &[job]);
                write_atomically(
                    &src.join("targets.json"),
                    &file_sd_json(&[source.target()], recipe.work(), &[]),
                );
                let prometheus = PrometheusProcess::start(&dir.join("prometheus"), &yml).await;
                (Some(prometheus), copies.join("targets.json"))
            }
            Recipe::RuleFiles => {
                let yml = support::prometheus::prometheus_yml_with_rules(
                    INTERVAL,
                    &copies.join("*.yml"),
                    &source.target(),
                );
                write_atomically(
                    &src.join("leader.yml"),
                    &support::prometheus::always_firing_rules("LeaderOnly", INTERVAL),
                );
                let prometheus =
                    PrometheusProcess::start_with(&dir.join("prometheus"), &yml, &[RESEND]).await;
                (Some(prometheus), copies.join("leader.yml"))
            }
            Recipe::Exec => {
                // An agent: it scrapes and forwards (here to the source too,
                // on a path of its own), and keeps no TSDB.
                let yml = format!(
                    "{}remote_write:\n  - url: \"http://{}/remote-write\"\n",
                    prometheus_yml(INTERVAL, &[leader_only]),
                    source.target()
                );
                write_atomically(&dir.join("prometheus.yml"), &yml);
                (None, PathBuf::new())
            }
        };
        let mut pod = RecipePod {
            recipe,
            api,
            termlog: dir.join("termlog"),
            dir,
            sidecar,
            source,
            prometheus,
            gate: None,
            copy,
        };
        pod.start_gate();
        let started = Instant::now();
        let first = pod
            .source
            .wait_scrape(recipe.work(), started, FIRST_SCRAPE)
            .await;
        pod.source
            .wait_scrape(recipe.work(), first.at, SECOND * 5)
            .await;
        pod
    }

    /// Starts (or restarts) the gate process as the docs run it.
    fn start_gate(&mut self) {
        let leader_gate = env!("CARGO_BIN_EXE_leader-gate");
        let url = format!("http://{}", self.sidecar.gate);
        let src = self.dir.join("src");
        let mapping = |name: &str| format!("{}:{}", src.join(name).display(), self.copy.display());
        let log = self.dir.join("gate.current.log");
        let args: Vec<String> = match self.recipe {
            Recipe::FileSd => vec![
                "file-gate".into(),
                "--url".into(),
                url,
                mapping("targets.json"),
            ],
            Recipe::RuleFiles => {
                let prometheus = self.prometheus.as_ref().expect("a prometheus");
                vec![
                    "file-gate".into(),
                    "--url".into(),
                    url,
                    "--reload-url".into(),
                    format!("http://{}/-/reload", prometheus.addr),
                    mapping("leader.yml"),
                ]
            }
            Recipe::Exec => {
                let quoted = |p: &Path| {
                    let text = p.display().to_string();
                    assert!(!text.contains('\''), "{text}");
                    format!("'{text}'")
                };
                let script = format!(
                    "echo \"$$\" >> {termlog}; \
                     exec {PROMETHEUS} --enable-feature=agent --config.file={config} \
                     --storage.agent.path={data} --web.listen-address=127.0.0.1:0 \
                     2>> {plog}",
                    termlog = quoted(&self.termlog),
                    config = quoted(&self.dir.join("prometheus.yml")),
                    data = quoted(&self.dir.join("data")),
                    plog = quoted(&self.dir.join("prometheus.log")),
                );
                vec![
                    "exec".into(),
                    "--url".into(),
                    url,
                    "--grace".into(),
                    format!("{}s", RECIPE_EXEC_GRACE.as_secs()),
                    "--".into(),
                    "sh".into(),
                    "-c".into(),
                    script,
                ]
            }
        };
        // The current incarnation's log; `kill_gate` keeps the earlier ones.
        self.gate = Some(Process::spawn(leader_gate, &args, &log));
    }

    /// SIGKILLs the gate process alone (its guard stays to do its part).
    async fn kill_gate(&mut self) {
        let gate = self.gate.as_mut().expect("a gate");
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(gate.child.id() as i32, libc::SIGKILL) };
        let _ = gate.child.wait();
        let log = gate.log();
        let mut all = std::fs::read_to_string(self.dir.join("gate.log")).unwrap_or_default();
        all.push_str(&log);
        std::fs::write(self.dir.join("gate.log"), all).unwrap();
        self.gate = None;
    }

    /// Whether the gate has closed as far as the test can see it: no copy,
    /// or no collector process left.
    fn gate_closed(&self) -> bool {
        match self.recipe {
            Recipe::FileSd | Recipe::RuleFiles => !self.copy.exists(),
            Recipe::Exec => std::fs::read_to_string(&self.termlog)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .all(|pid| !Path::new(&format!("/proc/{pid}")).exists()),
        }
    }

    /// Runs `event`, then waits until the work stopped (no arrival for the
    /// recipe's quiet time with the gate closed) or the bound plus that
    /// time passed, and asserts the last arrival came within the bound.
    async fn end_term_by(&mut self, event: Event) {
        let (recipe, timing) = (self.recipe, self.recipe.timing());
        let at = Instant::now();
        let from_restart = match event {
            Event::Sigterm => {
                self.sidecar.signal(libc::SIGTERM);
                None
            }
            Event::SidecarKilled => {
                self.sidecar.signal(libc::SIGKILL);
                None
            }
            Event::GateKilledAndLeadershipMoved => {
                self.kill_gate().await;
                // Another holder, live for a minute.
                self.api.update_lease(LEASE, |l| {
                    l["spec"]["holderIdentity"] = json!("ghost");
                    l["spec"]["leaseDurationSeconds"] = json!(60);
                });
                self.sidecar.wait_for(SECOND * 5, |p| !p.leading()).await;
                tokio::time::sleep_until((at + GATE_RESTART).into()).await;
                self.start_gate();
                Some(Instant::now())
            }
        };
        let (bound, from_what) = match (event, recipe, from_restart) {
            (Event::Sigterm, _, _) => (recipe.delay(), "SIGTERM of serve"),
            (Event::SidecarKilled, _, _) => {
                (timing.renew_deadline + recipe.delay(), "SIGKILL of serve")
            }
            (Event::GateKilledAndLeadershipMoved, Recipe::RuleFiles, Some(restarted)) => (
                restarted.duration_since(at) + recipe.delay(),
                "SIGKILL of the gate (bound counted from its restart)",
            ),
            // The guard removes the copy at once; exec's guard SIGKILLs the
            // collector at once.
            (Event::GateKilledAndLeadershipMoved, Recipe::FileSd, _) => {
                (recipe.delay(), "SIGKILL of the gate")
            }
            (Event::GateKilledAndLeadershipMoved, _, _) => (SECOND, "SIGKILL of the gate"),
        };
        let deadline = at + bound + IN_FLIGHT + recipe.quiet();
        loop {
            let last = self.source.last_scrape_of(recipe.work()).map(|s| s.at);
            let quiet = last.is_none_or(|last| last.elapsed() >= recipe.quiet());
            if (quiet && self.gate_closed()) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let arrivals = self.source.scrapes_of(recipe.work());
        let last = arrivals.last().expect("the work ran").at;
        let late: Vec<String> = arrivals
            .iter()
            .filter(|s| s.at > at + bound + IN_FLIGHT)
            .map(|s| format!("{} ms", s.at.duration_since(at).as_millis()))
            .collect();
        println!(
            "MEASURE recipe {recipe:?} / {event:?}: {from_what} -> last leader-only arrival: {} ms \
             (bound {} ms)",
            signed_ms(at, last),
            bound.as_millis()
        );
        assert!(
            late.is_empty(),
            "{recipe:?} / {event:?}: the leader-only work went on after the promised bound \
             ({} ms after the {from_what}): arrivals at {late:?} after it\n{}",
            bound.as_millis(),
            self.logs()
        );
        assert!(self.gate_closed(), "{recipe:?}: the gate is still open");
    }

    fn logs(&self) -> String {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let mut out = format!(
            "--- serve ---\n{}\n--- gate (earlier) ---\n{}\n--- gate ---\n{}",
            self.sidecar.log(),
            read(self.dir.join("gate.log")),
            read(self.dir.join("gate.current.log")),
        );
        match &self.prometheus {
            Some(prometheus) => {
                out.push_str(&format!("\n--- prometheus ---\n{}", prometheus.log()))
            }
            None => out.push_str(&format!(
                "\n--- prometheus ---\n{}",
                read(self.dir.join("prometheus.log"))
            )),
        }
        out
    }
}

impl Drop for RecipePod {
    fn drop(&mut self) {
        drop(self.gate.take());
        // Only if the gate failed to stop it: what `exec` started.
        for pid in std::fs::read_to_string(&self.termlog)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&self.dir.display().to_string()) {
                // SAFETY: kill(2) on a process this test's gate started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn signed_ms(from: Instant, to: Instant) -> i128 {
    if to >= from {
        to.duration_since(from).as_millis() as i128
    } else {
        -(from.duration_since(to).as_millis() as i128)
    }
}

async fn recipe_ends_with(test: &str, recipe: Recipe, event: Event) {
    if !require_prometheus() {
        return;
    }
    let mut pod = RecipePod::start(test, recipe).await;
    pod.end_term_by(event).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_file_sd_stops_scraping_within_its_bound_after_a_graceful_release() {
    recipe_ends_with("recipe-file-sd-sigterm", Recipe::FileSd, Event::Sigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_file_sd_stops_scraping_within_its_bound_after_the_sidecar_is_killed() {
    recipe_ends_with("recipe-file-sd-kill", Recipe::FileSd, Event::SidecarKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_file_sd_stops_scraping_within_its_bound_after_its_file_gate_is_killed() {
    recipe_ends_with(
        "recipe-file-sd-gate-kill",
        Recipe::FileSd,
        Event::GateKilledAndLeadershipMoved,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_exec_stops_scraping_within_its_grace_after_a_graceful_release() {
    recipe_ends_with("recipe-exec-sigterm", Recipe::Exec, Event::Sigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_exec_stops_scraping_within_its_bound_after_the_sidecar_is_killed() {
    recipe_ends_with("recipe-exec-kill", Recipe::Exec, Event::SidecarKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_exec_stops_scraping_at_once_when_exec_itself_is_killed() {
    recipe_ends_with(
        "recipe-exec-gate-kill",
        Recipe::Exec,
        Event::GateKilledAndLeadershipMoved,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_rule_files_stops_alerting_within_a_second_after_a_graceful_release() {
    recipe_ends_with("recipe-rules-sigterm", Recipe::RuleFiles, Event::Sigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_rule_files_stops_alerting_within_its_bound_after_the_sidecar_is_killed() {
    recipe_ends_with("recipe-rules-kill", Recipe::RuleFiles, Event::SidecarKilled).await;
}

/// Needs the file gate to send one reload at start-up: its guard removed the
/// copy when it was killed, but only a reload tells Prometheus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_rule_files_stops_alerting_once_its_killed_file_gate_restarts() {
    recipe_ends_with(
        "recipe-rules-gate-kill",
        Recipe::RuleFiles,
        Event::GateKilledAndLeadershipMoved,
    )
    .await;
}

/// What the rules recipe relies on, and what a reload stand-in of the file
/// gate's tests must reproduce: a reload whose configuration fails to
/// apply (another rule file that does not parse) answers 500, and
/// Prometheus keeps evaluating what it had loaded, the removed leader-only
/// group included; once nothing fails, a reload of a pattern that matches
/// nothing answers 200 and the group has stopped. The stand-in's answers
/// (Prometheus' failure, Fluent Bit's "in progress", a reload that never
/// answers) come out as scripted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rules_reload_keeps_the_leader_only_rules_and_the_stand_in_answers_alike() {
    use support::file_gate::{Answer, Reloads};
    use support::prometheus::{ALERTS_PATH, always_firing_rules, http, prometheus_yml_with_rules};
    if !require_prometheus() {
        return;
    }
    let dir = test_dir("prom-rules-failed-reload");
    let rules = dir.join("leader");
    std::fs::create_dir_all(&rules).unwrap();
    let alertmanager = ScrapeSource::start().await;
    let yml = prometheus_yml_with_rules(INTERVAL, &rules.join("*.yml"), &alertmanager.target());
    let prometheus = PrometheusProcess::start_with(&dir.join("prometheus"), &yml, &[RESEND]).await;
    let reload = || async {
        http(prometheus.addr, "POST", "/-/reload", &[])
            .await
            .unwrap_or_else(|| panic!("/-/reload unanswered; log:\n{}", prometheus.log()))
    };

    write_atomically(
        &rules.join("leader.yml"),
        &always_firing_rules("LeaderOnly", INTERVAL),
    );
    assert_eq!(reload().await.status, 200);
    alertmanager
        .wait_scrape(ALERTS_PATH, Instant::now(), FIRST_SCRAPE)
        .await;

    // The copy is removed while another rule file is broken.
    write_atomically(
        &rules.join("broken.yml"),
        "groups: [{name: x, rules: [{record: , expr: 1}]}]\n",
    );
    std::fs::remove_file(rules.join("leader.yml")).unwrap();
    let failed = reload().await;
    let Answer::Status(status, body) = Answer::PROMETHEUS_FAILED else {
        unreachable!()
    };
    assert_eq!(failed.status.to_string(), status[..3], "{}", failed.body);
    assert!(failed.body.starts_with(body), "{}", failed.body);
    let after_failure = Instant::now();
    alertmanager
        .wait_scrape(ALERTS_PATH, after_failure, SECOND * 5)
        .await;
    println!("a reload answered 500; the removed group still alerts");

    // Nothing fails any more: the reload applies the removal.
    std::fs::remove_file(rules.join("broken.yml")).unwrap();
    assert_eq!(reload().await.status, 200);
    let reloaded = Instant::now();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let last = alertmanager.last_scrape_of(ALERTS_PATH).expect("alerts").at;
    assert!(
        last <= reloaded + IN_FLIGHT,
        "an alert {} ms after the reload that removed its group answered",
        signed_ms(reloaded, last)
    );

    // The stand-in, scripted with the same failure and the others.
    let stand_in = Reloads::start_scripted(
        &[],
        vec![
            Answer::PROMETHEUS_FAILED,
            Answer::FLUENT_BIT_IN_PROGRESS,
            Answer::Hang,
            Answer::Ok(Duration::ZERO),
        ],
    )
    .await;
    let post = |path: &'static str| http(stand_in.addr, "POST", path, &[]);
    let first = post("/-/reload").await.expect("an answer");
    assert_eq!((first.status, first.body.as_str()), (500, body));
    let second = post("/api/v2/reload").await.expect("an answer");
    assert_eq!(second.status, 400);
    assert_eq!(second.body, "{\"reload\":\"in progress\",\"status\":-2}");
    let hung = tokio::time::timeout(SECOND * 2, post("/api/v2/reload")).await;
    assert!(hung.is_err(), "the hung reload answered: {hung:?}");
    let fourth = post("/api/v2/reload").await.expect("an answer");
    assert_eq!(fourth.status, 200);
    assert_eq!(stand_in.count(), 4);
}
