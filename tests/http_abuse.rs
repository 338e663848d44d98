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

/// One `GET /healthz` on a fresh connection, as the kubelet probes: whether
/// a 200 came within its one-second timeout (the kubelet's default).
async fn healthz(addr: SocketAddr) -> bool {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(response.starts_with(b"HTTP/1.1 200 "))
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Issue 14: 128 clients (the admin listener's cap) pipeline `GET /metrics`
/// without ever reading the answers, and reconnect whenever the server drops
/// them, so every place ends up held by a connection whose write is blocked.
/// The liveness probe must keep answering: a server that keeps such a
/// connection's place and refuses the newcomer fails the kubelet's probes,
/// the kubelet restarts the sidecar, and leadership moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_pipelining_metrics_and_never_reading_leave_healthz_answering() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    const ATTACKERS: usize = 128;
    const PROBES: usize = 40;
    support::raise_fd_limit(16_384);
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("http-abuse-pipeline");
    let timing = Timing::FAST;
    let leader = Sidecar::spawn(&api, &dir, "a", timing);
    leader.wait_serving().await;
    leader.wait_leading(timing.lease * 3).await;
    assert!(
        healthz(leader.admin).await,
        "/healthz answers before the attack"
    );

    let admin = leader.admin;
    let stop = Arc::new(AtomicBool::new(false));
    let (connections, blocked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut attackers = tokio::task::JoinSet::new();
    let burst = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
    for _ in 0..ATTACKERS {
        let (stop, connections, blocked) = (stop.clone(), connections.clone(), blocked.clone());
        let burst = burst.clone();
        attackers.spawn(async move {
            let mut was_blocked = false;
            while !stop.load(Relaxed) {
                let Ok(mut stream) = TcpStream::connect(admin).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                connections.fetch_add(1, Relaxed);
                // Requests until the server stops reading them (its answers
                // fill both socket buffers) or drops the connection; never a
                // read. `write` is cancel-safe: a request is never cut short.
                let mut at = 0;
                while !stop.load(Relaxed) {
                    let write = stream.write(&burst[at..]);
                    match tokio::time::timeout(Duration::from_millis(200), write).await {
                        Ok(Ok(n)) if n > 0 => at = (at + n) % burst.len(),
                        Ok(_) => break, // dropped: reconnect
                        Err(_) if !was_blocked => {
                            was_blocked = true;
                            blocked.fetch_add(1, Relaxed);
                        }
                        Err(_) => {}
                    }
                }
            }
        });
    }
    // The attack holds every place: each attacker has had a write blocked
    // (the server stopped reading it, its answers unread).
    let deadline = Instant::now() + Duration::from_secs(60);
    while blocked.load(Relaxed) < ATTACKERS {
        assert!(
            Instant::now() < deadline,
            "the attack never blocked: {blocked:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let filled_after = connections.load(Relaxed);

    let mut answered = 0;
    let mut failed_at = Vec::new();
    for i in 0..PROBES {
        let started = Instant::now();
        if healthz(admin).await {
            answered += 1;
        } else {
            failed_at.push(i);
        }
        tokio::time::sleep(Duration::from_millis(500).saturating_sub(started.elapsed())).await;
    }
    stop.store(true, Relaxed);
    while attackers.join_next().await.is_some() {}
    println!(
        "MEASURE /healthz under {ATTACKERS} pipelining clients that never read: {answered} of {PROBES} answered within 1 s; attacker connections {filled_after} once all blocked, {} at the end",
        connections.load(Relaxed)
    );
    // Causal, not a margin: every probe finds a place (the longest-stalled
    // connection gives up its own) and its request does not queue behind the
    // attackers' pipelined ones.
    assert_eq!(
        answered, PROBES,
        "probes {failed_at:?} went unanswered while the attack ran"
    );
    assert!(healthz(admin).await, "/healthz answers after the attack");
    let after = leader
        .leader()
        .await
        .expect("/leader answers after the attack");
    assert!(
        after.leading(),
        "the leader kept leading through the attack"
    );
}
