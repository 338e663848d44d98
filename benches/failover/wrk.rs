//! `/leader` under Debian's `wrk`, with the leader's renews and memory
//! watched during and after the load.

use std::time::{Duration, Instant};

use crate::group::Group;
use crate::program::DEFAULTS;
use crate::program::Program;

pub struct WrkRun {
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub rss_after_5s: u64,
    pub follower_rss: u64,
    pub max_renew_gap: Duration,
    pub renews: usize,
    pub still_leading: bool,
}

pub async fn wrk_leader(program: &Program, seconds: u64) -> Option<WrkRun> {
    let group = Group::start_program(program, "wrk", DEFAULTS, 2, &[]).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    let follower = 1 - leader;
    group.wait_renew(leader).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = group.sidecars[leader].rss_kib();
    let follower_rss = group.sidecars[follower].rss_kib();
    let name = group.sidecars[leader].name.clone();
    group.api.clear_requests();
    let url = format!("http://{}/leader", group.sidecars[leader].gate);
    let from = Instant::now();
    let text = match run_wrk(url, seconds).await {
        Ok(text) => text,
        Err(why) => {
            eprintln!("{why}");
            return None;
        }
    };
    let until = Instant::now();
    let rss_after = group.sidecars[leader].rss_kib();
    let still_leading = group.sidecars[leader]
        .leader()
        .await
        .is_some_and(|p| p.leading());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after_5s = group.sidecars[leader].rss_kib();
    // Renews during the load: the gaps between successive successful renews
    // (and from the start and to the end of the load).
    let mut times: Vec<Instant> = vec![from];
    times.extend(
        group
            .successful_updates(&name)
            .iter()
            .map(|r| r.at)
            .filter(|at| *at <= until),
    );
    let renews = times.len() - 1;
    times.push(until);
    let max_renew_gap = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    Some(WrkRun {
        requests_per_s: wrk_field(&text, "Requests/sec:"),
        p50_ms: wrk_latency(&text, "50%"),
        p99_ms: wrk_latency(&text, "99%"),
        rss_before,
        rss_after,
        rss_after_5s,
        follower_rss,
        max_renew_gap,
        renews,
        still_leading,
    })
}

/// `wrk -t2 -c64 --latency` on `url` for `seconds`: its report.
async fn run_wrk(url: String, seconds: u64) -> Result<String, String> {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("wrk")
            .args(["-t2", "-c64", &format!("-d{seconds}s"), "--latency", &url])
            .output()
    })
    .await
    .unwrap();
    match output {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        other => Err(format!(
            "wrk did not run ({other:?}); apt-get install -y wrk"
        )),
    }
}

pub fn wrk_field(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// A line of wrk's latency distribution (`50%  612.00us`), in ms.
pub fn wrk_latency(text: &str, key: &str) -> f64 {
    let value = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or("");
    let (number, unit) = value.split_at(
        value
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(value.len()),
    );
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

/// The same wrk run against Go's net/http answering the same body
/// (`benches/failover/go-leader`, built here with the `go` on PATH, the
/// standard library only): the baseline the `/leader` figure is judged by.
pub struct GoRun {
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Builds and runs the Go baseline under wrk; `Err` says why it could not.
pub async fn wrk_go(seconds: u64) -> Result<GoRun, String> {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/failover/go-leader");
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target").to_owned());
    let binary = format!("{target}/go-leader");
    let built = std::process::Command::new("go")
        .args(["build", "-o", &binary, "."])
        .current_dir(source)
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .output()
        .map_err(|e| format!("go is not on PATH ({e})"))?;
    if !built.status.success() {
        return Err(format!(
            "go build failed: {}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let mut child = std::process::Command::new(&binary)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{binary}: {e}"))?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("piped")),
        &mut line,
    )
    .map_err(|e| e.to_string())?;
    let url = format!("http://{}/leader", line.trim());
    let text = run_wrk(url, seconds).await;
    let _ = child.kill();
    let _ = child.wait();
    let text = text?;
    Ok(GoRun {
        requests_per_s: wrk_field(&text, "Requests/sec:"),
        p50_ms: wrk_latency(&text, "50%"),
        p99_ms: wrk_latency(&text, "99%"),
    })
}
