//! A follower's requests per minute while the API server fails for a
//! minute (defaults 15s/10s/2s): answering it 503 to everything, counted by
//! the fake; and refusing connections, which the server never sees, counted
//! by the follower's own failed-request counters (`outcome="transport"`,
//! or `"error"` in builds that did not tell transport errors apart).

use std::time::{Duration, Instant};

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::{FakeApiServer, Fault, FaultKind};
use crate::support::sidecar::{Sidecar, get, test_dir};

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(60);

/// Requests per minute, one value per round.
pub struct Outage {
    pub unavailable: Vec<f64>,
    pub refused: Vec<f64>,
}

pub async fn run(rounds: usize) -> Outage {
    let mut unavailable = Vec::new();
    let mut refused = Vec::new();
    for round in 0..rounds {
        let (api, _a, _b) = pair(&format!("bench-outage-503-{round}")).await;
        api.set_fault("b", Fault::all(FaultKind::Status(503)));
        api.drop_watches("b");
        let from = Instant::now();
        tokio::time::sleep(OUTAGE).await;
        let sent = api.requests_per_client(from, Instant::now());
        unavailable.push(per_minute(sent.get("b").copied().unwrap_or(0)));

        let (api, _a, b) = pair(&format!("bench-outage-refused-{round}")).await;
        let before = failed_requests(&b).await;
        api.shutdown().await;
        tokio::time::sleep(OUTAGE).await;
        let after = failed_requests(&b).await;
        refused.push(per_minute(after.saturating_sub(before)));
    }
    Outage {
        unavailable,
        refused,
    }
}

/// A leader `a` and a follower `b` that saw it, at the defaults.
async fn pair(test: &str) -> (FakeApiServer, Sidecar, Sidecar) {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let a = Sidecar::spawn(&api, &dir, "a", DEFAULTS);
    a.wait_serving().await;
    a.wait_leading(DEFAULTS.lease * 3).await;
    let b = Sidecar::spawn(&api, &dir, "b", DEFAULTS);
    b.wait_serving().await;
    b.wait_for(Duration::from_secs(10), |p| p.holder() == Some("a"))
        .await;
    (api, a, b)
}

fn per_minute(count: usize) -> f64 {
    count as f64 * 60.0 / OUTAGE.as_secs_f64()
}

/// The follower's failed Lease API requests so far, by its own metrics.
async fn failed_requests(sidecar: &Sidecar) -> usize {
    let probe = get(sidecar.admin, "/metrics").await.expect("/metrics");
    let text = probe.body.as_str().unwrap_or_default().to_owned();
    text.lines()
        .filter(|l| l.starts_with("leader_gate_api_requests_total{"))
        .filter(|l| {
            ["transport", "error", "timeout"]
                .iter()
                .any(|o| l.contains(&format!("outcome=\"{o}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

pub fn print(outage: &Outage) {
    println!();
    println!(
        "| one-minute API server outage: a follower's requests per minute (defaults) | rounds | min | median | max |"
    );
    println!("|---|---|---|---|---|");
    for (name, values) in [
        (
            "503 to every request, counted by the fake",
            &outage.unavailable,
        ),
        (
            "connections refused, counted by the follower's failed-request metrics",
            &outage.refused,
        ),
    ] {
        let mut v = values.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        println!(
            "| {name} | {n} | {:.0} | {:.0} | {:.0} |",
            v[0],
            v[n / 2],
            v[n - 1]
        );
    }
}
