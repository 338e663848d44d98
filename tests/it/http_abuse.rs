//! Hostile clients against a real leader: thousands of idle and slow-header
//! connections and oversized heads on the admin listener (reachable by every
//! pod in a cluster) must not slow `/leader`, grow memory without bound, or
//! cost the election a renew.

use crate::support;

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
    let mut baseline = Vec::new();
    for _ in 0..20 {
        baseline.push(probe(leader.admin).await.1);
    }
    baseline.sort();
    let baseline = baseline[baseline.len() / 2];
    let rss_before = leader.rss_kib();
    let anon_before = leader.anon_kib();

    let attack_started = Instant::now();
    let mut held = Vec::new();
    // 1,000 idle connections that never send a byte.
    for _ in 0..1000 {
        if let Ok(stream) = TcpStream::connect(leader.admin).await {
            held.push(stream);
        }
    }
    // Until its first byte, a connection costs a socket and a small task,
    // not hyper's buffers (8 KiB to read and 8 KiB to write): the 128 held
    // at once cost well under a MiB, where hyper's would cost 2 or more.
    let anon_idle = leader.anon_kib();
    assert!(
        anon_idle <= anon_before + 1024,
        "1,000 idle connections grew anonymous memory from {anon_before} to {anon_idle} KiB"
    );
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
    let anon_during = leader.anon_kib();
    println!(
        "MEASURE /leader under 2,000 hostile connections: median {median:?} (before: {baseline:?}), max {:?}; rss {rss_before} -> {rss_during} KiB, anonymous {anon_before} -> {anon_idle} (idle) -> {anon_during} KiB",
        latencies.last().unwrap()
    );
    // Fast, judged against the same machine's own baseline just before (a
    // loaded 2-core machine moves both): 10 ms, or 5 times the baseline.
    let bound = Duration::from_millis(10).max(baseline * 5);
    assert!(
        median <= bound,
        "/leader median {median:?} with 2,000 hostile connections held (bound {bound:?})"
    );
    // The cap (128 per listener) bounds what the attack may cost: a few MiB,
    // not hyper's buffers for every connection (2,000 x 8 KiB and more).
    // Judged on anonymous memory: the code the attack's paths fault in is
    // file-backed and the same at any scale.
    assert!(
        anon_during <= anon_before + 4 * 1024,
        "anonymous memory grew from {anon_before} to {anon_during} KiB"
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

/// A leading sidecar whose `/healthz` answers, for an attack on its admin
/// listener (the fake API server is returned to keep it running).
async fn leader_for_an_attack(test: &str) -> (FakeApiServer, Sidecar) {
    support::raise_fd_limit(16_384);
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(test);
    let leader = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    leader.wait_serving().await;
    leader.wait_leading(Timing::FAST.lease * 3).await;
    assert!(
        healthz(leader.admin).await,
        "/healthz answers before the attack"
    );
    (api, leader)
}

/// `probes` liveness probes, one every `every`, as a kubelet sends them:
/// which of them went unanswered within 1 s.
async fn probe_healthz(admin: SocketAddr, probes: usize, every: Duration) -> Vec<usize> {
    let mut failed_at = Vec::new();
    for i in 0..probes {
        let started = Instant::now();
        if !healthz(admin).await {
            failed_at.push(i);
        }
        tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
    }
    failed_at
}

/// Issue 14: 128 clients (the admin listener's cap) pipeline `GET /metrics`
/// without ever reading the answers, and reconnect whenever the server drops
/// them, so every place ends up held by a connection whose write is blocked.
/// The liveness probe must keep answering: a server that keeps such a
/// connection's place and refuses the newcomer fails the kubelet's probes,
/// the kubelet restarts the sidecar, and leadership moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_pipelining_metrics_and_never_reading_leave_healthz_answering() {
    pipelining_without_reading("http-abuse-pipeline", "/metrics").await;
}

/// The same with `GET /leader`, which is answered before the router (the
/// shortcut of a lone Lease) and, unless pipelined, takes no turn in the
/// handlers' queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_pipelining_leader_and_never_reading_leave_healthz_answering() {
    pipelining_without_reading("http-abuse-pipeline-leader", "/leader").await;
}

/// 128 clients pipeline `GET {path}` without reading (see above) while the
/// kubelet probes: every probe is answered within 1 s.
async fn pipelining_without_reading(test: &str, path: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    const ATTACKERS: usize = 128;
    const PROBES: usize = 40;
    let (_api, leader) = leader_for_an_attack(test).await;

    let admin = leader.admin;
    let stop = Arc::new(AtomicBool::new(false));
    let (connections, blocked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut attackers = tokio::task::JoinSet::new();
    let burst = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
        .into_bytes()
        .repeat(64);
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

    let failed_at = probe_healthz(admin, PROBES, Duration::from_millis(500)).await;
    let answered = PROBES - failed_at.len();
    stop.store(true, Relaxed);
    while attackers.join_next().await.is_some() {}
    println!(
        "MEASURE /healthz under {ATTACKERS} clients pipelining {path} that never read: {answered} of {PROBES} answered within 1 s; attacker connections {filled_after} once all blocked, {} at the end",
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

/// 1,000 clients on the gate listener (`--max-subscribers 1000`) pipeline
/// `GET /leader` in bursts of 64 and read every answer, as fast as the
/// sidecar makes them: its one thread does nothing else. A `GET /leader`
/// read off the socket takes no turn in the handlers' queue; one that came
/// in the same read as the one before it (pipelined) does, so flooding
/// connections wait for their turns out of the run queue instead of each
/// getting the 16 answers hyper makes per poll of a connection (754 ms for
/// the slowest probe without the rule, 2-3 ms with it): every probe is
/// answered within [`FLOOD_PROBE_BOUND`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_pipelining_leader_as_fast_as_it_answers_leave_healthz_answering() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    const CLIENTS: usize = 1000;
    const PROBES: usize = 20;
    support::raise_fd_limit(16_384);
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("http-abuse-leader-flood");
    let leader = Sidecar::spawn_with(
        &api,
        &dir,
        "a",
        Timing::FAST,
        &["--max-subscribers", "1000"],
    );
    leader.wait_serving().await;
    leader.wait_leading(Timing::FAST.lease * 3).await;
    let (gate, admin) = (leader.gate, leader.admin);
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicUsize::new(0));
    let burst = b"GET /leader HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (stop, answers, burst) = (stop.clone(), answers.clone(), burst.clone());
        clients.spawn(async move {
            let mut stream = TcpStream::connect(gate).await.expect("connects");
            let (mut read, mut write) = stream.split();
            let reader = async {
                let mut buffer = vec![0u8; 16 * 1024];
                loop {
                    match read.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let heads = buffer[..n].windows(12).filter(|w| w == b"HTTP/1.1 200");
                            answers.fetch_add(heads.count(), Relaxed);
                        }
                    }
                }
            };
            let writer = async {
                while !stop.load(Relaxed) {
                    if write.write_all(&burst).await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                () = reader => {}
                () = writer => {}
            }
        });
    }
    // The flood runs: answers flow.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = answers.load(Relaxed);
    assert!(before > 0, "no answer to the flood");
    let mut slowest = Duration::ZERO;
    let mut failed_at = Vec::new();
    for i in 0..PROBES {
        let started = Instant::now();
        if !healthz(admin).await {
            failed_at.push(i);
        }
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = answers.load(Relaxed) - before;
    stop.store(true, Relaxed);
    clients.abort_all();
    while clients.join_next().await.is_some() {}
    println!(
        "MEASURE /healthz under {CLIENTS} clients pipelining /leader on the gate listener and reading: {} of {PROBES} answered, the slowest in {slowest:?}; {during} answers to the flood meanwhile",
        PROBES - failed_at.len()
    );
    assert!(during > 0, "the flood stopped while probing");
    assert_eq!(failed_at, Vec::<usize>::new(), "probes went unanswered");
    assert!(
        slowest < FLOOD_PROBE_BOUND,
        "the slowest probe took {slowest:?}: pipelined requests did not take turns"
    );
    assert!(
        leader.leader().await.is_some_and(|p| p.leading()),
        "still leading"
    );
}

/// What a probe may wait under that flood, with a debug build on 2 shared
/// cores: 2-3 ms seen, 88-110 ms when each connection got one answer per
/// turn, 754 ms with 16.
const FLOOD_PROBE_BOUND: Duration = Duration::from_millis(300);

/// 128 clients (the admin listener's cap) send a head that announces a body
/// (by `Content-Length` or chunked) and then trickle it a byte at a time,
/// reconnecting whenever the server gives up on them. A body is read while
/// the connection counts as idle and under a short timeout, so every probe
/// finds a place: a server that kept such connections busy while it waited
/// for their bodies refused every probe at admission for as long as the
/// attack lasted, and the kubelet would restart the sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_trickling_request_bodies_leave_healthz_answering() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    const ATTACKERS: usize = 128;
    const PROBES: usize = 40;
    let (_api, leader) = leader_for_an_attack("http-abuse-trickle").await;

    let admin = leader.admin;
    let stop = Arc::new(AtomicBool::new(false));
    let (connections, trickling) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut attackers = tokio::task::JoinSet::new();
    for attacker in 0..ATTACKERS {
        let (stop, connections, trickling) = (stop.clone(), connections.clone(), trickling.clone());
        // Half announce a length, half a chunked body; each then sends one
        // byte of it every 100 ms (a chunk of one byte, for the chunked).
        let (head, byte): (&[u8], &[u8]) = if attacker % 2 == 0 {
            (
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
                b"x",
            )
        } else {
            (
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"1\r\nx\r\n",
            )
        };
        attackers.spawn(async move {
            let mut counted = false;
            while !stop.load(Relaxed) {
                let Ok(mut stream) = TcpStream::connect(admin).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                connections.fetch_add(1, Relaxed);
                if stream.write_all(head).await.is_err() {
                    continue;
                }
                let mut sent = 0;
                while !stop.load(Relaxed) {
                    if stream.write_all(byte).await.is_err() {
                        break;
                    }
                    sent += 1;
                    if sent == 3 && !counted {
                        counted = true;
                        trickling.fetch_add(1, Relaxed);
                    }
                    // Until the server answers or closes: then reconnect.
                    let mut buf = [0u8; 512];
                    match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf))
                        .await
                    {
                        Err(_) => {}    // nothing yet: trickle on
                        Ok(_) => break, // an answer (400) or the close
                    }
                }
            }
        });
    }
    // Every attacker has had a body under way for a while (300 ms).
    let deadline = Instant::now() + Duration::from_secs(60);
    while trickling.load(Relaxed) < ATTACKERS {
        assert!(
            Instant::now() < deadline,
            "the attack never got going: {trickling:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let failed_at = probe_healthz(admin, PROBES, Duration::from_millis(250)).await;
    let answered = PROBES - failed_at.len();
    stop.store(true, Relaxed);
    while attackers.join_next().await.is_some() {}
    println!(
        "MEASURE /healthz under {ATTACKERS} clients trickling request bodies: {answered} of {PROBES} answered within 1 s; {} attacker connections",
        connections.load(Relaxed)
    );
    assert_eq!(
        answered, PROBES,
        "probes {failed_at:?} went unanswered while bodies trickled"
    );
    let after = leader
        .leader()
        .await
        .expect("/leader answers after the attack");
    assert!(
        after.leading(),
        "the leader kept leading through the attack"
    );
}

/// Sends `request` on a fresh connection, closes nothing, and reads until the
/// server closes: what came back, or how the read failed (a reset).
async fn exchange(addr: SocketAddr, request: &[u8]) -> Result<String, std::io::ErrorKind> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.kind())?;
    stream.write_all(request).await.map_err(|e| e.kind())?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
        .map_err(|e| e.kind())?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

fn statuses(response: &str) -> Vec<&str> {
    response
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| &response[at + 9..at + 12])
        .collect()
}

/// The framing cases a reviewer asks for, on the admin listener of a real
/// sidecar: ambiguous or unknown framing is refused or ends the connection
/// (no request smuggled behind it is answered), pipelined requests are
/// answered in order, and a body too large is answered 413 cleanly: the
/// client reads the whole answer, no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_framing_is_strict_pipelining_works_and_big_bodies_get_a_clean_413() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("http-abuse-framing");
    let timing = Timing::FAST;
    let leader = Sidecar::spawn(&api, &dir, "a", timing);
    leader.wait_serving().await;
    let admin = leader.admin;
    let smuggled = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

    // Content-Length with Transfer-Encoding: the chunked framing wins, and
    // the connection closes after the answer; what follows is never read as
    // a request.
    let both = format!(
        "GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
    );
    let response = exchange(admin, both.as_bytes()).await.unwrap();
    assert_eq!(
        statuses(&response).len(),
        1,
        "one answer, then the close: {response}"
    );

    // A signed length is no length.
    let signed =
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello{smuggled}");
    let response = exchange(admin, signed.as_bytes()).await.unwrap();
    assert_eq!(statuses(&response), ["400"], "{response}");

    // Unknown transfer codings (or chunked not last): 400, nothing more.
    for coding in ["gzip", "chunked, gzip", "foo"] {
        let request = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {coding}\r\n\r\n0\r\n\r\n{smuggled}"
        );
        let response = exchange(admin, request.as_bytes()).await.unwrap();
        assert_eq!(statuses(&response), ["400"], "{coding}: {response}");
    }

    // Pipelining: three requests in one write, three answers in order (the
    // last asks to close). A small body is read and dropped, the connection
    // goes on.
    let pipelined = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\
                     GET /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
                     GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let response = exchange(admin, pipelined.as_bytes()).await.unwrap();
    assert_eq!(statuses(&response), ["200", "404", "200"], "{response}");

    // A body over 64 KiB, sent whole before reading: a 413 the client reads
    // in full (a close with the body unread would reset the connection and
    // could destroy the answer), by length or chunked.
    let big = vec![b'a'; 1024 * 1024];
    let mut by_length = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    by_length.extend_from_slice(&big);
    let mut chunked =
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in big.chunks(16 * 1024) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    for (how, request) in [("by length", by_length), ("chunked", chunked)] {
        let response = exchange(admin, &request).await;
        let response = response.unwrap_or_else(|e| panic!("{how}: the read failed: {e:?}"));
        assert_eq!(statuses(&response), ["413"], "{how}: {response}");
    }
    // And the listener is none the worse.
    assert!(healthz(admin).await);
}
