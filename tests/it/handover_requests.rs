//! What hand-over requests can cost a group, with real processes against
//! the fake API server: `leader-gate handover --to` the pod that already
//! holds the Lease is done (exit 0), and `POST /handover` sent to every pod
//! over and over — what anything the gate channel admits can do where that
//! channel is wider than the pod (a mesh, `hostNetwork` without a gate
//! socket) — leaves the group without a leader for one lease duration plus
//! two retry periods at most at a time, not for as long as it goes on.

use crate::support;

use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, lease_holder};
use support::monitor::Monitor;
use support::sidecar::{Sidecar, test_dir};

const LEASE: &str = "cluster-metrics";
const TIMING: support::sidecar::Timing = support::sidecar::Timing::GATES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_to_the_pod_that_holds_the_lease_exits_0_saying_already_holds() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("review-handover-to-holder");
    let a = Sidecar::spawn(&api, &dir, "a", TIMING);
    a.wait_serving().await;
    a.wait_term(TIMING.lease * 2).await;
    let kubeconfig = api.write_kubeconfig("operator", &dir);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["handover", "--lease-name", LEASE, "--lease-namespace"])
        .args(["collectors", "--to", "a", "--timeout", "5s"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run leader-gate handover");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let holder = lease_holder(&api.lease(LEASE).unwrap());
    println!(
        "holder {holder:?}; handover --to a exited {:?}: {}",
        output.status.code(),
        stderr.trim()
    );
    assert_eq!(holder.as_deref(), Some("a"));
    assert_eq!(
        output.status.code(),
        Some(0),
        "the pod asked for holds the Lease: {}",
        stderr.trim()
    );
    // Said on stdout, as a hand-over seen done is.
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "a already holds lease collectors/cluster-metrics"
    );
}

/// `POST /handover` on a gate listener: the status (0: no answer).
async fn post_handover(sidecar: &Sidecar) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(sidecar.gate).await.ok()?;
        let request =
            "POST /handover HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        answer.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// The longest stretch within `[from, to]` in which no instance answered
/// 200, judged from the monitor's samples: a stretch starts at the last
/// 200 received and ends at the next 200 sent.
fn longest_leaderless(monitor: &Monitor, from: Instant, to: Instant) -> Duration {
    let mut leading: Vec<(Instant, Instant)> = monitor
        .samples()
        .into_iter()
        .filter(|s| s.leading() && s.received >= from && s.sent <= to)
        .map(|s| (s.sent, s.received))
        .collect();
    leading.sort();
    let mut longest = Duration::ZERO;
    let mut last = from;
    for (sent, received) in leading {
        longest = longest.max(sent.saturating_duration_since(last));
        last = last.max(received);
    }
    longest.max(to.saturating_duration_since(last))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_requests_to_every_pod_every_second_leave_the_group_leaderless_within_a_bound() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("handover-request-flood");
    let sidecars: Vec<Sidecar> = ["a", "b", "c"]
        .into_iter()
        .map(|name| Sidecar::spawn(&api, &dir, name, TIMING))
        .collect();
    for sidecar in &sidecars {
        sidecar.wait_serving().await;
    }
    support::sidecar::leading_one(&sidecars, TIMING.lease * 3).await;
    let monitor = Monitor::start(&sidecars.iter().collect::<Vec<_>>());
    // Five lease durations of a request to every pod every second: without
    // a bound, every pod stands aside for as long as it goes on.
    let attack = TIMING.lease * 5;
    let started = Instant::now();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    while started.elapsed() < attack {
        for sidecar in &sidecars {
            *statuses.entry(post_handover(sidecar).await).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let ended = Instant::now();
    let longest = longest_leaderless(&monitor, started, ended);
    let bound = TIMING.lease + TIMING.retry * 2;
    // Anything the requests cost, the group gets a leader again afterwards.
    let after = support::sidecar::leading_one(&sidecars, bound * 2).await;
    monitor.assert_no_overlap();
    println!(
        "MEASURE handover flood: {:?} of requests to 3 pods every second (statuses {statuses:?}): longest with no leading pod {:.2}s (bound: lease + 2 retry = {bound:?}); then {} leads",
        attack,
        longest.as_secs_f64(),
        sidecars[after].name
    );
    assert!(
        longest <= bound,
        "the group was leaderless for {longest:?} under repeated hand-over requests (bound {bound:?}); statuses {statuses:?}"
    );
    assert!(
        statuses.get(&429).is_some_and(|&n| n > 0),
        "repeated requests were refused: {statuses:?}"
    );
}
