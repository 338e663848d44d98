//! Hostile clients against a real leader: thousands of idle and slow-header
//! connections and oversized heads on the admin listener (reachable by every
//! pod in a cluster) must not slow `/leader`, grow memory without bound, or
//! cost the election a renew.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, Verb};
use support::sidecar::{Sidecar, Timing, test_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LEASE: &str = "cluster-metrics";

/// One `GET /leader` on a fresh connection: the status and how long it took.
async fn probe(addr: SocketAddr) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    let status = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten();
    (status, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slow_and_oversized_connections_leave_leader_fast_memory_bounded_and_renews_on_time() {
    support::raise_fd_limit(16_384);
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("http-abuse");
    let timing = Timing::FAST;
    let leader = Sidecar::spawn(&api, &dir, "a", timing);
    leader.wait_serving().await;
    leader.wait_leading(timing.lease * 3).await;
    // Warm up, then the baseline.
    for _ in 0..20 {
        probe(leader.admin).await;
    }
    let rss_before = leader.rss_kib();

    let attack_started = Instant::now();
    let mut held = Vec::new();
    // 1,000 idle connections that never send a byte.
    for _ in 0..1000 {
        if let Ok(stream) = TcpStream::connect(leader.admin).await {
            held.push(stream);
        }
    }
    // 1,000 slow heads: a request line and then nothing more.
    for _ in 0..1000 {
        if let Ok(mut stream) = TcpStream::connect(leader.admin).await {
            let _ = stream.write_all(b"GET /leader HTTP/1.1\r\nX-Slow: ").await;
            held.push(stream);
        }
    }
    // Oversized heads are refused, not buffered.
    let mut refused = 0;
    for _ in 0..50 {
        let mut stream = TcpStream::connect(leader.admin).await.unwrap();
        let huge = format!(
            "GET /leader HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(256 * 1024)
        );
        let _ = stream.write_all(huge.as_bytes()).await;
        let mut response = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut response)).await;
        let text = String::from_utf8_lossy(&response);
        if text.is_empty() || text.starts_with("HTTP/1.1 431") {
            refused += 1;
        }
    }
    assert_eq!(refused, 50, "an oversized head gets 431 or a closed socket");

    // While all that is held open: /leader answers, and fast.
    let mut latencies = Vec::new();
    for _ in 0..50 {
        let (status, took) = probe(leader.admin).await;
        assert_eq!(status, Some(200), "/leader must answer the leader's 200");
        latencies.push(took);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let rss_during = leader.rss_kib();
    println!(
        "MEASURE /leader under 2,000 hostile connections: median {median:?}, max {:?}; rss {rss_before} -> {rss_during} KiB",
        latencies.last().unwrap()
    );
    assert!(
        median <= Duration::from_millis(10),
        "/leader median {median:?} with 2,000 hostile connections held"
    );
    // The cap (512 per listener) bounds what the attack may cost: a few MiB,
    // not one buffer per connection (2,000 x 8 KiB and more).
    assert!(
        rss_during <= rss_before + 4 * 1024,
        "memory grew from {rss_before} to {rss_during} KiB"
    );

    // The header read timeout closes what the cap let in: a held connection
    // is closed by the server (read returns 0), not kept for ever.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut closed = 0;
    for stream in &mut held {
        let mut buf = [0u8; 256];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(5), stream.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, held.len(), "every hostile connection was closed");

    // The election did not miss a renew: consecutive PUTs of the leader are
    // one retry period apart (plus scheduling), throughout the attack.
    let renews: Vec<Instant> = api
        .requests_of("a", Verb::Update)
        .iter()
        .filter(|r| r.status == Some(200))
        .map(|r| r.at)
        .filter(|at| *at >= attack_started)
        .collect();
    assert!(
        renews.len() >= 5,
        "renews during the attack: {}",
        renews.len()
    );
    for pair in renews.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap < timing.retry + Duration::from_millis(500),
            "a renew came {gap:?} after the previous one"
        );
    }
    assert_eq!(probe(leader.admin).await.0, Some(200));
}
