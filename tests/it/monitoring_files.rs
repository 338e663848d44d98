//! The monitoring files against the real binary: every metric that
//! `monitoring/leader-gate.rules.yml`, its promtool tests and
//! `monitoring/leader-gate-dashboard.json` name is one a running `leader-gate
//! serve` exposes on `/metrics`; every input series of the promtool tests
//! has exactly the labels the binary gives that metric (plus the scrape
//! target's); and, with a real Prometheus scraping that sidecar, every panel
//! query answers with data and every alert expression parses and stays
//! silent for a healthy leader. (`scripts/check-alerts.sh` runs promtool
//! itself on the rules and their tests.) And the series the rules count
//! with, from real processes: a fresh follower's counters at 0, a leader's
//! crash-looping `exec` counted once per restart.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_apiserver::FakeApiServer;
use support::gate_clients::GateClient;
use support::health::HealthEndpoint;
use support::prometheus::{PrometheusProcess, http, require_prometheus};
use support::sidecar::{Sidecar, Timing, test_dir};

const RULES: &str = "monitoring/leader-gate.rules.yml";
const RULE_TESTS: &str = "monitoring/leader-gate.rules.test.yml";
const DASHBOARD: &str = "monitoring/leader-gate-dashboard.json";
/// Labels the scrape adds (a PodMonitor's), not the binary.
const TARGET_LABELS: [&str; 4] = ["job", "instance", "namespace", "pod"];

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Sample name → label names, from a classic-text exposition.
fn exposed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut samples = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).expect("a sample line has a name");
        let labels = line[end..]
            .strip_prefix('{')
            .map(|rest| label_names(&rest[..rest.find('}').expect("closed labels")]))
            .unwrap_or_default();
        samples.insert(line[..end].to_owned(), labels);
    }
    samples
}

/// The names in `a="x",b="y"` (values here never hold `="`).
fn label_names(labels: &str) -> BTreeSet<String> {
    labels
        .split("\",")
        .filter_map(|pair| Some(pair.split_once('=')?.0.trim().to_owned()))
        .filter(|name| !name.is_empty())
        .collect()
}

/// Every `leader_gate_…` identifier in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("leader_gate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// `expr` without its `{…}` label matchers.
fn without_matchers(expr: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in expr.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Each panel's title and its queries (with their legends), with Grafana's variables replaced
/// by what they stand for over all Leases.
fn panel_queries() -> Vec<(String, Vec<(String, String)>)> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty(), "no panels in {DASHBOARD}");
    panels
        .iter()
        .map(|panel| {
            let title = panel["title"].as_str().expect("a title").to_owned();
            let queries: Vec<(String, String)> = panel["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("panel {title:?} has no targets"))
                .iter()
                .map(|t| {
                    let expr = t["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("a target of {title:?} has no expr"))
                        .replace("$lease", ".*")
                        .replace("$__rate_interval", "30s");
                    (
                        expr,
                        t["legendFormat"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            assert!(!queries.is_empty(), "panel {title:?} has no query");
            (title, queries)
        })
        .collect()
}

/// The scrape config in the rules file's header, with its Kubernetes pod
/// discovery replaced by what it would discover: `admin`, the sidecar's
/// admin port at `target` in pod monitoring/metricbeat-a, and another
/// container port of that pod.
fn scrape_config_from_the_rules(target: &str) -> String {
    let rules = read(RULES);
    let (_, config) = rules
        .split_once("# scrape-config-begin\n")
        .expect("a scrape config in the header");
    let (config, _) = config.split_once("# scrape-config-end\n").expect("its end");
    let config: String = config
        .lines()
        .map(|l| {
            format!(
                "{}\n",
                l.strip_prefix("# ").unwrap_or(l.trim_start_matches('#'))
            )
        })
        .collect();
    let discovery = "    kubernetes_sd_configs:\n      - role: pod\n";
    assert_eq!(config.matches(discovery).count(), 1, "{config}");
    let pod = |port: &str| {
        format!(
            "      - targets: [\"{target}\"]\n        labels:\n\
             \x20         __meta_kubernetes_pod_container_port_name: {port}\n\
             \x20         __meta_kubernetes_namespace: monitoring\n\
             \x20         __meta_kubernetes_pod_name: metricbeat-a\n"
        )
    };
    config.replace(
        discovery,
        &format!("    static_configs:\n{}{}", pod("admin"), pod("statsd-tcp")),
    )
}

/// Each alert's name and expression.
fn alert_expressions() -> Vec<(String, String)> {
    let rules: Value = serde_saphyr::from_str(&read(RULES)).expect("the rules file is YAML");
    let alerts: Vec<(String, String)> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules").iter())
        .map(|rule| {
            (
                rule["alert"].as_str().expect("alert rules only").to_owned(),
                rule["expr"].as_str().expect("an expr").to_owned(),
            )
        })
        .collect();
    assert!(!alerts.is_empty(), "no alerts in {RULES}");
    alerts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_and_the_dashboard_name_what_a_running_sidecar_exposes() {
    let api = FakeApiServer::start("monitoring", "metricbeat-leader").await;
    // With a collector health check: then every metric family is registered.
    let health = HealthEndpoint::start(200).await;
    let sidecar = Sidecar::spawn_with(
        &api,
        &test_dir("monitoring-files"),
        "a",
        Timing::FAST,
        &["--collector-health-url", health.url.as_str()],
    );
    sidecar.wait_serving().await;
    sidecar.wait_leading(Timing::FAST.lease * 3).await;
    // At least one renew after the acquisition: the histogram has samples.
    tokio::time::sleep(Timing::FAST.retry * 2).await;
    let metrics = http(sidecar.admin, "GET", "/metrics", &[])
        .await
        .expect("/metrics answers");
    assert_eq!(metrics.status, 200);
    let samples = exposed(&metrics.body);
    assert!(
        samples.contains_key("leader_gate_build_info")
            && samples.contains_key("leader_gate_collector_healthy"),
        "{}",
        metrics.body
    );

    // Every metric named anywhere in the files, comments and descriptions
    // included: a sample's name, or a family's (as the docs name a
    // histogram). That a query selects real series, Prometheus shows below.
    let families: BTreeSet<&str> = metrics
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    for (file, text) in [RULES, RULE_TESTS, DASHBOARD].map(|f| (f, read(f))) {
        let named = metric_names(&text);
        assert!(!named.is_empty(), "{file} names no metric");
        let unknown: Vec<_> = named
            .iter()
            .filter(|n| !samples.contains_key(*n) && !families.contains(n.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics the binary does not expose: {unknown:?}\n/metrics:\n{}",
            metrics.body
        );
    }

    // The promtool tests' input series carry the binary's labels.
    let tests: Value = serde_saphyr::from_str(&read(RULE_TESTS)).expect("the tests are YAML");
    let mut checked = 0;
    for test in tests["tests"].as_array().expect("tests") {
        for input in test["input_series"].as_array().expect("input_series") {
            let series = input["series"].as_str().expect("series");
            let (name, labels) = series.split_once('{').expect("series with labels");
            let mut labels = label_names(labels.trim_end_matches('}'));
            for target in TARGET_LABELS {
                assert!(
                    labels.remove(target),
                    "{series} lacks the target label {target}"
                );
            }
            let binary = samples
                .get(name)
                .unwrap_or_else(|| panic!("{RULE_TESTS}: {name} is not exposed"));
            assert_eq!(
                &labels, binary,
                "{RULE_TESTS}: {series} has other labels than the binary gives {name}"
            );
            checked += 1;
        }
    }
    println!("{checked} input series of {RULE_TESTS} carry the binary's labels");

    if !require_prometheus() {
        return;
    }
    // The scrape config of the rules' header, as plain Kubernetes discovery
    // would give it the sidecar's pod (and another container port of it,
    // which it must drop): the target labels the rules need come from its
    // relabelling (a PodMonitor gives the same, its job `namespace/name`).
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n{}",
        scrape_config_from_the_rules(&sidecar.admin.to_string())
    );
    let dir = test_dir("monitoring-files-prometheus");
    let prometheus = PrometheusProcess::start(&dir, &config).await;
    // Enough scrapes for rate() and increase() over 30 s windows.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus
        .query("count_over_time(leader_gate_build_info[30s]) >= 4")
        .await
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "too few scrapes: {:?}",
            prometheus.targets().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let up = prometheus.query("up").await;
    assert_eq!(up.len(), 1, "only the admin port is scraped: {up:?}");
    for label in ["namespace", "pod"] {
        assert_eq!(
            up[0]["metric"][label].as_str(),
            Some(if label == "pod" {
                "metricbeat-a"
            } else {
                "monitoring"
            }),
            "the header's relabelling gives {label}: {up:?}"
        );
    }
    for (title, queries) in panel_queries() {
        for (query, legend) in queries {
            let result = prometheus.query(&query).await;
            assert!(!result.is_empty(), "panel {title:?}: no data for {query}");
            // Each `{{label}}` of the legend is a label of every series.
            for label in legend
                .split("{{")
                .skip(1)
                .filter_map(|l| l.split_once("}}"))
            {
                let label = label.0.trim();
                assert!(
                    result.iter().all(|r| r["metric"][label].is_string()),
                    "panel {title:?}: its legend names {label}, which {query} does not keep: {result:?}"
                );
            }
        }
    }
    for (alert, expr) in alert_expressions() {
        let result = prometheus.query(&expr).await;
        assert!(
            result.is_empty(),
            "{alert} fires for a healthy leader: {result:?}"
        );
        // An alert for series that are missing has no threshold: its
        // selector (the job Prometheus gives the sidecar here, as a
        // PodMonitor would) must see the sidecar.
        if let Some(inner) = expr.trim().strip_prefix("absent_over_time(") {
            let (selector, _) = inner.rsplit_once('[').expect("a range");
            let result = prometheus.query(selector).await;
            assert!(!result.is_empty(), "{alert}: {selector} matches no series");
            continue;
        }
        // Its measure (the expression without its threshold, over all the
        // series of its metrics: no label matchers) sees the sidecar and
        // keeps its Lease.
        let (measure, _) = expr.rsplit_once(['>', '=']).expect("a threshold");
        let measure = without_matchers(measure.trim_end_matches(['=', '>', ' ', '\n']));
        let result = prometheus.query(&measure).await;
        assert!(!result.is_empty(), "{alert}: {measure} matches no series");
        let lease = result[0]["metric"]["lease"].as_str();
        assert_eq!(
            lease,
            Some("monitoring/metricbeat-leader"),
            "{alert}: {result:?}"
        );
    }
}

/// Each sample of a classic-text exposition: its name, labels and value.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter_map(|pair| {
                    let (label, value) = pair.split_once('=')?;
                    Some((label.to_owned(), value.trim_matches('"').to_owned()))
                })
                .collect();
            (name.to_owned(), labels, value.parse().expect("a number"))
        })
        .collect()
}

/// Every counter selector (`leader_gate_…_total{…}`) in `expr`, as its name
/// and the label sets it selects: an `=~"a|b"` matcher stands for each of
/// its alternatives (the rules' regexes are plain alternations).
fn counter_selectors(expr: &str) -> Vec<(String, Vec<BTreeMap<String, String>>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("leader_gate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        rest = &tail[end..];
        if !name.ends_with("_total") {
            continue;
        }
        let mut sets = vec![BTreeMap::new()];
        if let Some(matchers) = rest.strip_prefix('{') {
            let matchers = &matchers[..matchers.find('}').expect("closed matchers")];
            for matcher in matchers.split("\",").map(str::trim) {
                let (label, values) = match matcher.split_once("=~") {
                    Some((label, regex)) => (label, regex.trim_matches('"').split('|').collect()),
                    None => {
                        let (label, value) = matcher.split_once('=').expect("a matcher");
                        (label, vec![value.trim_matches('"')])
                    }
                };
                sets = sets
                    .iter()
                    .flat_map(|set| {
                        values.iter().map(move |value| {
                            let mut set = set.clone();
                            set.insert(label.trim().to_owned(), (*value).to_owned());
                            set
                        })
                    })
                    .collect();
            }
        }
        out.push((name.to_owned(), sets));
    }
    out
}

/// `increase()` cannot see the step of a series that first appears at 1: a
/// follower that never led, never failed a renew and was never refused
/// exposes at 0 every counter series the rules select (each alternative of
/// a regex matcher), so that its first term, step-down or gate restart is
/// counted. And a follower whose health check fails because its collector
/// runs only on the leader (under `exec`) is not unhealthy: its
/// `collector_healthy` is 1, which LeaderGateFollowerCollectorUnhealthy
/// relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_follower_exposes_every_counter_the_rules_select_at_zero() {
    let api = FakeApiServer::start("monitoring", "metricbeat-leader").await;
    let dir = test_dir("monitoring-fresh-follower");
    let leader = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    leader.wait_leading(Timing::FAST.lease * 3).await;
    // The follower's collector does not answer (status 0: the connection
    // closes unanswered), as under `exec`, where it does not run.
    let silent = HealthEndpoint::start(0).await;
    let follower = Sidecar::spawn_with(
        &api,
        &dir,
        "b",
        Timing::FAST,
        &["--collector-health-url", silent.url.as_str()],
    );
    follower.wait_serving().await;
    // A few failed health checks and reads of the Lease as a follower.
    tokio::time::sleep(Timing::FAST.retry * 4).await;
    assert!(
        silent.answers().len() >= 2,
        "the follower checked its collector: {:?}",
        silent.answers()
    );
    let probe = follower.leader().await.expect("/leader answers");
    assert!(!probe.leading(), "b must follow: {probe:?}");
    let metrics = http(follower.admin, "GET", "/metrics", &[])
        .await
        .expect("/metrics answers");
    let exposed = samples(&metrics.body);
    let lease = "monitoring/metricbeat-leader";

    let mut checked = 0;
    for (alert, expr) in alert_expressions() {
        for (name, sets) in counter_selectors(&expr) {
            for set in sets {
                let found: Vec<f64> = exposed
                    .iter()
                    .filter(|(n, labels, _)| {
                        *n == name
                            && labels.get("lease").map(String::as_str) == Some(lease)
                            && set.iter().all(|(k, v)| labels.get(k) == Some(v))
                    })
                    .map(|(_, _, value)| *value)
                    .collect();
                assert!(
                    !found.is_empty() && found.iter().all(|v| *v == 0.0),
                    "{alert}: a fresh follower exposes no {name}{set:?} at 0 (found {found:?}):\n{}",
                    metrics.body
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} counter label sets in {RULES}");

    let healthy: Vec<f64> = exposed
        .iter()
        .filter(|(n, labels, _)| {
            n == "leader_gate_collector_healthy"
                && labels.get("lease").map(String::as_str) == Some(lease)
        })
        .map(|(_, _, value)| *value)
        .collect();
    assert_eq!(
        healthy,
        [1.0],
        "a follower whose collector runs only on the leader:\n{}",
        metrics.body
    );
}

/// The value of `name{lease="monitoring/metricbeat-leader"}` on `sidecar`.
async fn lease_sample(sidecar: &Sidecar, name: &str) -> f64 {
    let metrics = http(sidecar.admin, "GET", "/metrics", &[])
        .await
        .expect("/metrics answers");
    let values: Vec<f64> = samples(&metrics.body)
        .into_iter()
        .filter(|(n, labels, _)| {
            n == name
                && labels.get("lease").map(String::as_str) == Some("monitoring/metricbeat-leader")
        })
        .map(|(_, _, value)| value)
        .collect();
    assert_eq!(values.len(), 1, "{name}:\n{}", metrics.body);
    values[0]
}

/// LeaderGateGateRestarting's counter: an `exec` whose command exits at
/// once (exit 127, as a collector that cannot start), restarted by a
/// stand-in for the kubelet while its pod leads, is counted once per
/// restart; an `exec` killed and restarted on a follower is not.
/// A leader's `exec` stopped by SIGTERM (a rollout without the preStop
/// hook) asks its sidecar to hand over and stays registered until it
/// stepped down: a graceful stop is not counted as a gated container
/// that went away while its pod led.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_exec_stopped_by_sigterm_is_not_counted_as_a_restart() {
    const COUNTER: &str = "leader_gate_gate_disconnects_while_leading_total";
    let api = FakeApiServer::start("monitoring", "metricbeat-leader").await;
    let dir = test_dir("monitoring-gate-sigterm");
    let leader = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    leader.wait_leading(Timing::FAST.lease * 3).await;
    let url = format!("http://{}", leader.gate);
    let started = dir.join("started");
    let script = format!("touch {}; sleep 60", started.display());
    let mut exec = GateClient::spawn(
        &dir,
        "exec-a",
        &["exec", "--url", &url, "--", "sh", "-c", &script],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !started.exists() {
        assert!(Instant::now() < deadline, "{}", exec.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exec.signal(libc::SIGTERM);
    assert_eq!(
        exec.exit_code(Duration::from_secs(10)).await,
        0,
        "{}",
        exec.stderr()
    );
    assert!(
        exec.stderr()
            .contains("asked the sidecar to hand the Lease over"),
        "{}",
        exec.stderr()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        lease_sample(&leader, COUNTER).await,
        0.0,
        "{}",
        exec.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_exec_on_the_leader_is_counted_once_per_restart() {
    const COUNTER: &str = "leader_gate_gate_disconnects_while_leading_total";
    const RESTARTS: usize = 3;
    let api = FakeApiServer::start("monitoring", "metricbeat-leader").await;
    let dir = test_dir("monitoring-gate-restarts");
    let leader = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    leader.wait_leading(Timing::FAST.lease * 3).await;
    let follower = Sidecar::spawn(&api, &dir, "b", Timing::FAST);
    follower.wait_serving().await;
    assert_eq!(lease_sample(&leader, COUNTER).await, 0.0);

    let url = format!("http://{}", leader.gate);
    for restart in 0..RESTARTS {
        let mut exec = GateClient::spawn(
            &dir,
            &format!("exec-a-{restart}"),
            &["exec", "--url", &url, "--", "sh", "-c", "exit 127"],
            &[],
        );
        let (status, _) = exec
            .wait_exit(Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("exec did not exit: {}", exec.stderr()));
        assert!(!status.success(), "{status:?}");
        // The sidecar sees the stream end when the process is gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while lease_sample(&leader, COUNTER).await < (restart + 1) as f64 {
            assert!(
                Instant::now() < deadline,
                "restart {restart} not counted: {} (exec: {})",
                lease_sample(&leader, COUNTER).await,
                exec.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await; // the kubelet's back-off
    }
    assert!(leader.leader().await.expect("/leader").leading());
    assert_eq!(lease_sample(&leader, COUNTER).await, RESTARTS as f64);

    // On the follower an exec waits for a term; killed and restarted, its
    // stream ends while its pod does not lead.
    let url = format!("http://{}", follower.gate);
    for restart in 0..2 {
        let mut exec = GateClient::spawn(
            &dir,
            &format!("exec-b-{restart}"),
            &["exec", "--url", &url, "--", "sh", "-c", "exit 127"],
            &[],
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            exec.running(),
            "exec on a follower waits: {}",
            exec.stderr()
        );
        exec.signal(libc::SIGKILL);
        exec.wait_exit(Duration::from_secs(5))
            .await
            .expect("killed");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lease_sample(&follower, COUNTER).await, 0.0);
    assert_eq!(lease_sample(&leader, COUNTER).await, RESTARTS as f64);
}
