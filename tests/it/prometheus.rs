//! `/metrics` as real scrapers read it, and the Prometheus harness the
//! end-to-end gate tests build on: `promtool check metrics` accepts the
//! classic text a plain GET gets; a real Prometheus (which asks for
//! OpenMetrics) scrapes a real `leader-gate serve` without errors; and how
//! fast Prometheus stops scraping after a `file_sd` target file is removed,
//! or after its configuration lost a job and `/-/reload` answered. Skipped with a printed reason when Prometheus is not installed,
//! unless `LEADER_GATE_REQUIRE_PROMETHEUS=1` (CI) makes that a failure.

use crate::support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leader_gate::serve::exposition::Format;
use support::fake_apiserver::FakeApiServer;
use support::prometheus::{
    PROMTOOL, PrometheusProcess, ScrapeJob, ScrapeSource, Targets, file_sd_json, http,
    prometheus_yml, require_prometheus, write_atomically,
};
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const INTERVAL: Duration = Duration::from_secs(1);
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A request Prometheus wrote just before it stopped a scrape loop may be
/// recorded by the source a little after the test saw the loop stopped (the
/// two are scheduled independently). A new scrape would be a new loop turn,
/// one interval after the last.
const IN_FLIGHT: Duration = Duration::from_millis(250);

/// A leading `serve` (so every metric family has samples) and its fake API.
async fn leading_sidecar(test: &str) -> (FakeApiServer, Sidecar) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let sidecar = Sidecar::spawn(&api, &test_dir(test), "a", Timing::FAST);
    sidecar.wait_serving().await;
    sidecar.wait_leading(Timing::FAST.lease * 3).await;
    // At least one renew after the acquisition: the histogram has samples.
    tokio::time::sleep(Timing::FAST.retry * 2).await;
    (api, sidecar)
}

/// A point in the scrape interval after a scrape, different for each of
/// the three cycles (0, ⅓, ⅔), so a measurement does not always start just
/// after a scrape.
fn phase(cycle: u32) -> Duration {
    INTERVAL * (cycle - 1) / 3
}

/// Milliseconds from `from` to `to`, negative when `to` came first.
fn signed_ms(from: Instant, to: Instant) -> i128 {
    if to >= from {
        (to - from).as_millis() as i128
    } else {
        -((from - to).as_millis() as i128)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_without_accept_are_classic_text_that_promtool_accepts() {
    if !require_prometheus() {
        return;
    }
    let (_api, sidecar) = leading_sidecar("prom-promtool").await;
    let response = http(sidecar.admin, "GET", "/metrics", &[])
        .await
        .expect("/metrics answers");
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = response.body;
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    assert!(text.contains("# TYPE leader_gate_transitions_total counter\n"));

    let mut promtool = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().expect("promtool runs");
    println!(
        "promtool check metrics: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool rejected:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_openmetrics_when_the_accept_header_asks() {
    let (_api, sidecar) = leading_sidecar("prom-openmetrics").await;
    let response = http(
        sidecar.admin,
        "GET",
        "/metrics",
        &[("Accept", "application/openmetrics-text;version=1.0.0")],
    )
    .await
    .expect("/metrics answers");
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some(OPENMETRICS));
    assert!(response.body.ends_with("# EOF\n"), "{}", response.body);
    assert!(
        response
            .body
            .contains("# TYPE leader_gate_transitions counter\n")
    );
}

/// A Prometheus whose `file_sd` directory the test writes, as a file gate
/// would: it scrapes the source (at the file's `metrics_path`) once the file
/// appears, and stops after it is removed. Measures removal → last scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_a_file_sd_target_only_while_its_file_exists() {
    if !require_prometheus() {
        return;
    }
    let dir = test_dir("prom-file-sd");
    let sd = dir.join("targets");
    std::fs::create_dir_all(&sd).unwrap();
    let source = ScrapeSource::start().await;
    let job = ScrapeJob {
        name: "cluster".into(),
        // Overridden by each file's `__metrics_path__`; never scraped.
        metrics_path: "/job-default".into(),
        targets: Targets::FileSd {
            dir: sd.clone(),
            refresh: SECOND,
        },
    };
    let prometheus = PrometheusProcess::start(&dir, &prometheus_yml(INTERVAL, &[job])).await;
    let file = sd.join("cluster.json");
    for cycle in 1..=3 {
        let path = format!("/pod-a/cycle-{cycle}");
        let written = Instant::now();
        write_atomically(
            &file,
            &file_sd_json(&[source.target()], &path, &[("pod", "a")]),
        );
        let first = source.wait_scrape(&path, written, SECOND * 30).await;
        println!(
            "MEASURE file_sd appear -> first scrape: {} ms",
            signed_ms(written, first.at)
        );
        let second = source.wait_scrape(&path, first.at, INTERVAL * 5).await;
        let target = prometheus
            .targets()
            .await
            .into_iter()
            .find(|t| t.scrape_pool == "cluster")
            .expect("the target is active");
        assert_eq!(
            target.scrape_url,
            format!("http://{}{path}", source.target())
        );
        assert_eq!(target.labels.get("pod").map(String::as_str), Some("a"));

        // Remove at a different phase of the scrape interval each cycle.
        tokio::time::sleep_until((second.at + phase(cycle)).into()).await;
        let removed = Instant::now();
        std::fs::remove_file(&file).unwrap();
        let deadline = removed + SECOND * 30;
        while prometheus
            .targets()
            .await
            .iter()
            .any(|t| t.scrape_pool == "cluster")
        {
            assert!(
                Instant::now() < deadline,
                "target still active 30 s after its file was removed; log:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The scrape pool syncs (and stops the loop) before the API shows
        // the target gone.
        let dropped = Instant::now();
        tokio::time::sleep(INTERVAL * 3).await;
        let last = source.last_scrape_of(&path).unwrap();
        assert!(
            last.at <= dropped + IN_FLIGHT,
            "scraped {} ms after Prometheus dropped the target",
            signed_ms(dropped, last.at)
        );
        println!(
            "MEASURE file_sd removal -> last scrape: {} ms (target dropped from /api/v1/targets after {} ms)",
            signed_ms(removed, last.at),
            signed_ms(removed, dropped)
        );
    }
    assert!(source.scrapes_of("/job-default").is_empty());
    println!(
        "Prometheus asked for: {:?}",
        source.scrapes()[0].accept.as_deref()
    );
    // What Prometheus asks for is what leader-gate answers with OpenMetrics.
    for scrape in source.scrapes() {
        assert_eq!(
            Format::negotiate(scrape.accept.as_deref()),
            Format::OpenMetrics,
            "{:?}",
            scrape.accept
        );
    }
}

/// What Prometheus does when its configuration loses a job: rewrite
/// `prometheus.yml` without it and POST `/-/reload`, which answers once the
/// job's scrape pool has stopped. (Not a gate recipe: a gate removes a
/// file, and Prometheus keeps its configuration when `prometheus.yml` is
/// missing; the rule-file recipe relies on this "stopped before it answers".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_swap_with_reload_stops_scraping_before_the_reload_answers() {
    if !require_prometheus() {
        return;
    }
    let dir = test_dir("prom-config-swap");
    let source = ScrapeSource::start().await;
    let prometheus = PrometheusProcess::start(&dir, &prometheus_yml(INTERVAL, &[])).await;
    for cycle in 1..=3 {
        let path = format!("/pod-a/swap-{cycle}");
        let job = ScrapeJob {
            name: "cluster".into(),
            metrics_path: path.clone(),
            targets: Targets::Static(vec![source.target()]),
        };
        let swapped_in = Instant::now();
        prometheus.set_config(&prometheus_yml(INTERVAL, &[job]));
        prometheus.reload().await;
        let first = source.wait_scrape(&path, swapped_in, SECOND * 30).await;
        let second = source.wait_scrape(&path, first.at, INTERVAL * 5).await;

        tokio::time::sleep_until((second.at + phase(cycle)).into()).await;
        let swapped_out = Instant::now();
        prometheus.set_config(&prometheus_yml(INTERVAL, &[]));
        prometheus.reload().await;
        let reloaded = Instant::now();
        tokio::time::sleep(INTERVAL * 3).await;
        let last = source.last_scrape_of(&path).unwrap();
        assert!(
            last.at <= reloaded + IN_FLIGHT,
            "scraped {} ms after the reload answered",
            signed_ms(reloaded, last.at)
        );
        println!(
            "MEASURE config swap + reload -> last scrape: {} ms (reload answered after {} ms)",
            signed_ms(swapped_out, last.at),
            signed_ms(swapped_out, reloaded)
        );
    }
}

/// A real scraper negotiates OpenMetrics with a real `serve` and parses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_leader_gate_metrics_without_errors() {
    if !require_prometheus() {
        return;
    }
    let (_api, sidecar) = leading_sidecar("prom-scrapes-sidecar").await;
    let job = ScrapeJob {
        name: "leader-gate".into(),
        metrics_path: "/metrics".into(),
        targets: Targets::Static(vec![sidecar.admin.to_string()]),
    };
    let dir = test_dir("prom-scrapes-sidecar-prometheus");
    let prometheus = PrometheusProcess::start(&dir, &prometheus_yml(INTERVAL, &[job])).await;
    let deadline = Instant::now() + SECOND * 30;
    let target = loop {
        let targets = prometheus.targets().await;
        if let Some(t) = targets.iter().find(|t| t.health != "unknown") {
            break t.clone();
        }
        assert!(Instant::now() < deadline, "never scraped: {targets:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        target.scrape_url,
        format!("http://{}/metrics", sidecar.admin)
    );
    assert_eq!(target.health, "up", "{target:?}");
    assert_eq!(target.last_error, "", "{target:?}");

    // The values arrived as leader-gate meant them (a counter's `_total`
    // included), not merely a 200.
    let value = |result: &[serde_json::Value]| -> Option<String> {
        Some(result.first()?["value"][1].as_str()?.to_owned())
    };
    let leading = prometheus.query("leader_gate_leading").await;
    assert_eq!(value(&leading).as_deref(), Some("1"), "{leading:?}");
    let started = prometheus
        .query(r#"leader_gate_transitions_total{direction="started"}"#)
        .await;
    assert_eq!(value(&started).as_deref(), Some("1"), "{started:?}");
    let scrape_samples = prometheus
        .query(r#"scrape_samples_scraped{job="leader-gate"}"#)
        .await;
    println!("scrape_samples_scraped: {scrape_samples:?}");
}
