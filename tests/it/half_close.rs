//! Clients that close their sending side once the request is written (a
//! `printf … | nc` probe, the scripts small collector images carry): each
//! must still get its whole answer, on both listeners, `/events` included.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::fake_apiserver::FakeApiServer;
use support::sidecar::{Sidecar, Timing, test_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `request`, shuts the write side at once, and reads until the
/// server closes (or `limit` passes, for a stream): what arrived, and
/// whether the server closed.
async fn half_closed(addr: SocketAddr, request: &str, limit: Duration) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_whole_answer() {
    const ROUNDS: usize = 100;
    let api = FakeApiServer::start("collectors", "half-close").await;
    let dir = test_dir("half-close");
    let timing = Timing::FAST;
    let leader = Sidecar::spawn(&api, &dir, "a", timing);
    leader.wait_serving().await;
    leader.wait_leading(timing.lease * 3).await;

    let plain = [
        (leader.admin, "/healthz", "200 OK"),
        (leader.admin, "/leader", "200 OK"),
        (leader.gate, "/leader", "200 OK"),
    ];
    for (addr, path, status) in plain {
        let mut lost = Vec::new();
        for round in 0..ROUNDS {
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
            let (answer, _) = half_closed(addr, &request, Duration::from_secs(2)).await;
            let whole = answer.starts_with(&format!("HTTP/1.1 {status}"))
                && (!path.ends_with("leader") || answer.trim_end().ends_with('}'));
            if !whole {
                lost.push((round, answer));
            }
        }
        assert!(
            lost.is_empty(),
            "{path} on {addr}: {} of {ROUNDS} half-closed requests lost their answer, first: {:?}",
            lost.len(),
            lost.first()
        );
    }

    // A subscriber that half-closes keeps its stream: the first `state`
    // event arrives and the stream stays open (no close within the limit).
    for _ in 0..20 {
        let (answer, closed) = half_closed(
            leader.gate,
            "GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
            Duration::from_millis(300),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 OK") && answer.contains("event: state") && !closed,
            "a half-closed subscriber got (closed: {closed}): {answer:?}"
        );
    }
}
