//! `/events` on a real socket (real time), fed directly through the event
//! log: ordering, resumption, fan-out to 1,000 subscribers, a stalled
//! subscriber, the cap, keep-alives and shutdown.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leader_gate::clock::{BootInstant, boot_clock_id};
use leader_gate::elector::driver::Heartbeat;
use leader_gate::elector::lease::TermId;
use leader_gate::elector::machine::Snapshot;
use leader_gate::serve::app_state::AppState;
use leader_gate::serve::exposition::Format;
use leader_gate::serve::metrics::Metrics;
use leader_gate::serve::published::Publisher;
use leader_gate::serve::routes;
use leader_gate::serve::server::{self, Limits};
use leader_gate::serve::transitions::{EventKind, EventLog, LeaseLabel, Transition};
use serde_json::json;
use support::events::EventClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

struct Served {
    addr: SocketAddr,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Publishes snapshots as the election would (kept open for ever).
    publisher: &'static Publisher,
}

async fn serve(max_subscribers: usize, keep_alive: Duration) -> Served {
    serve_with(
        max_subscribers,
        keep_alive,
        Limits::for_gate(max_subscribers),
    )
    .await
}

async fn serve_with(max_subscribers: usize, keep_alive: Duration, limits: Limits) -> Served {
    let events = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 1024, 256);
    let metrics = Arc::new(Metrics::new("ns", "demo"));
    let (publisher, state) = Publisher::new(events.clone(), metrics.clone());
    let publisher: &'static Publisher = Box::leak(Box::new(publisher)); // keeps the state channel open
    let stop = CancellationToken::new();
    let app = AppState {
        state,
        identity: "me".into(),
        namespace: "ns".into(),
        lease_name: "demo".into(),
        heartbeat: Heartbeat::new(),
        stuck_after: Duration::from_secs(15),
        events: events.clone(),
        metrics: metrics.clone(),
        subscribers: leader_gate::serve::app_state::StreamSlots::new(max_subscribers),
        keep_alive,
        shutdown: stop.clone(),
        gate_acks: leader_gate::serve::gate_acks::GateAcks::new(8),
        gate_lag: Duration::from_secs(4),
        step_aside: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(server::serve(
        listener,
        routes::lease_gate_router(app),
        stop.clone(),
        limits,
    ));
    Served {
        addr,
        events,
        metrics,
        stop,
        server,
        publisher,
    }
}

fn transition(i: usize) -> Transition {
    let kind = if i.is_multiple_of(2) {
        EventKind::StartedLeading
    } else {
        EventKind::StoppedLeading
    };
    Transition {
        kind,
        term: Some(format!("uid/{}", i / 2)),
        reason: (kind == EventKind::StoppedLeading).then_some("renew-deadline"),
        holder: None,
    }
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_gets_the_state_then_every_transition_in_order() {
    let served = serve(8, Duration::from_secs(15)).await;
    let mut client = EventClient::connect(served.addr, None).await;
    assert_eq!(client.status, 200);
    let state = client.next(SECOND).await.unwrap();
    assert_eq!(state.kind(), "state");
    assert_eq!(state.data["may_have_missed_events"], false);
    assert_eq!(state.data["leading"], false);
    for i in 0..50 {
        served.events.publish(transition(i));
    }
    let received = client.drain(Duration::from_millis(300)).await;
    assert_eq!(received.len(), 50);
    for (i, event) in received.iter().enumerate() {
        let expected = served.events.id_of(i as u64 + 1);
        assert_eq!(event.message.id.as_deref(), Some(expected.as_str()));
        assert_eq!(
            event.kind(),
            if i % 2 == 0 {
                "started-leading"
            } else {
                "stopped-leading"
            }
        );
        assert_eq!(event.term(), Some(format!("uid/{}", i / 2).as_str()));
        assert!(event.data["published_at_us"].as_i64().unwrap() > 0);
    }
    // Each start pairs with the stop of the same term.
    for pair in received.chunks(2) {
        assert_eq!(pair[0].term(), pair[1].term());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_with_last_event_id_replays_exactly_the_missed_events_first() {
    let served = serve(8, Duration::from_secs(15)).await;
    let mut client = EventClient::connect(served.addr, None).await;
    client.next(SECOND).await.unwrap(); // state
    for i in 0..2 {
        served.events.publish(transition(i));
    }
    let seen = client.drain(Duration::from_millis(200)).await;
    let last_id = seen.last().unwrap().message.id.clone().unwrap();
    drop(client);

    for i in 2..7 {
        served.events.publish(transition(i));
    }
    let mut resumed = EventClient::connect(served.addr, Some(&last_id)).await;
    let missed = resumed.drain(Duration::from_millis(300)).await;
    let ids: Vec<_> = missed
        .iter()
        .map(|e| e.message.id.clone().unwrap())
        .collect();
    let expected: Vec<_> = (3..=7).map(|seq| served.events.id_of(seq)).collect();
    assert_eq!(
        ids, expected,
        "exactly the missed events, in order, and no state first"
    );
    served.events.publish(transition(7));
    let live = resumed.next(SECOND).await.unwrap();
    assert_eq!(live.message.id, Some(served.events.id_of(8)));

    // An unknown id: a fresh state that says events may have been missed.
    let mut bogus = EventClient::connect(served.addr, Some("not-an-id")).await;
    let state = bogus.next(SECOND).await.unwrap();
    assert_eq!(state.kind(), "state");
    assert_eq!(state.data["may_have_missed_events"], true);
    // A state's id is a cursor: the last event it reflects. Here events were
    // published straight into the log, so the state reflects none of them,
    // and resuming from it replays all eight.
    let cursor = state.message.id.clone().unwrap();
    assert_eq!(cursor, served.events.id_of(0));
    let mut from_state = EventClient::connect(served.addr, Some(&cursor)).await;
    let replayed = from_state.drain(Duration::from_millis(300)).await;
    assert_eq!(replayed.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_that_is_not_ascii_is_unknown_not_absent() {
    let served = serve(8, Duration::from_secs(15)).await;
    served.events.publish(transition(0));
    let mut stream = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    // Raw bytes: no HTTP client library would send this header.
    stream
        .write_all(b"GET /events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: caf\xc3\xa9-1\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + SECOND * 5;
    while !String::from_utf8_lossy(&seen).contains("may_have_missed_events") {
        assert!(
            Instant::now() < deadline,
            "no state: {}",
            String::from_utf8_lossy(&seen)
        );
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(SECOND, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"may_have_missed_events\":true"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_receive_the_same_sequence() {
    support::raise_fd_limit(8192);
    let served = serve(1100, Duration::from_secs(15)).await;
    let mut clients = Vec::new();
    for _ in 0..1000 {
        let mut client = EventClient::connect(served.addr, None).await;
        assert_eq!(client.status, 200);
        client.next(SECOND * 5).await.unwrap(); // state
        clients.push(client);
    }
    assert!(
        served
            .metrics
            .encode(Format::OpenMetrics)
            .contains("leader_gate_event_subscribers 1000")
    );
    let mut published = Vec::new();
    for i in 0..10 {
        published.push(served.events.publish(transition(i)));
    }
    let expected: Vec<_> = published.iter().map(|e| e.id.clone()).collect();
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.len() < 10 {
                    match client.next(SECOND * 20).await {
                        Some(event) => got.push(event),
                        None => break,
                    }
                }
                got
            })
        })
        .collect();
    let mut last_arrival = 0;
    for reader in readers {
        let got = reader.await.unwrap();
        let ids: Vec<_> = got.iter().map(|e| e.message.id.clone().unwrap()).collect();
        assert_eq!(ids, expected);
        last_arrival = last_arrival.max(got.last().unwrap().wall_us);
    }
    let delivery = Duration::from_micros((last_arrival - published[9].published_at_us) as u64);
    eprintln!("MEASURE delivery of the 10th event to the last of 1000 subscribers: {delivery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_delays_no_other_subscriber_and_is_told_it_lagged() {
    let served = serve(8, Duration::from_secs(15)).await;
    // A subscriber that never reads, with a tiny receive buffer: once its
    // socket buffers are full, every write to it would block.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    let mut stalled = socket.connect(served.addr).await.unwrap();
    stalled
        .write_all(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .await
        .unwrap();
    let mut healthy = EventClient::connect(served.addr, None).await;
    healthy.next(SECOND).await.unwrap(); // state

    // 3,000 events of about 2.3 kB (a long term id): 7 MB, more than the
    // socket buffers hold (the kernel grows a send buffer up to 4 MB).
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(event) = healthy.next(SECOND * 5).await {
            got.push(event);
            if got.len() == 3000 {
                break;
            }
        }
        got
    });
    let mut last = None;
    let padding = "x".repeat(2000);
    // Paced (1,000 events/s) so that the healthy subscriber keeps up even on
    // a busy machine: what is measured is the stalled one's effect on it.
    for batch in 0..150 {
        for i in 0..20 {
            let mut big = transition(batch * 20 + i);
            big.term = Some(format!("{}-{padding}", big.term.unwrap()));
            last = Some(served.events.publish(big));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = reader.await.unwrap();
    assert_eq!(got.len(), 3000, "the healthy subscriber got every event");
    let lag = got.last().unwrap().wall_us - last.unwrap().published_at_us;
    // Publishing is synchronous and never touches a socket; what a stalled
    // subscriber could delay is the others' delivery. A generous bound that
    // only delivery waiting on the stalled socket would exceed:
    assert!(
        lag < 2_000_000,
        "the healthy subscriber trailed by {lag} µs"
    );

    // The stalled subscriber, read at last: it fell behind its buffer and was
    // told so, then given a fresh state — not disconnected.
    let mut window = String::new();
    let mut seen_lagged = false;
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "no lagged event followed by a state"
        );
        let n = tokio::time::timeout(SECOND * 5, stalled.read(&mut buf))
            .await
            .expect("the stalled subscriber's stream went quiet")
            .unwrap();
        assert!(n > 0, "the stalled subscriber was disconnected");
        window.push_str(&String::from_utf8_lossy(&buf[..n]));
        if !seen_lagged && let Some(at) = window.find("event: lagged") {
            seen_lagged = true;
            window.drain(..at + "event: lagged".len());
        }
        if seen_lagged && window.contains("event: state") {
            break;
        }
        // Keep only a tail long enough to hold a marker cut by a read.
        let keep = window.len().saturating_sub(64);
        let keep = (keep..=window.len())
            .find(|i| window.is_char_boundary(*i))
            .unwrap();
        window.drain(..keep);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_whose_socket_accepts_nothing_is_disconnected_and_frees_its_slot() {
    let limits = Limits {
        write_timeout: SECOND,
        ..Limits::for_gate(1)
    };
    let served = serve_with(1, Duration::from_secs(15), limits).await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    let mut stalled = socket.connect(served.addr).await.unwrap();
    stalled
        .write_all(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .await
        .unwrap();
    // The one slot is taken.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(EventClient::connect(served.addr, None).await.status, 503);
    // Fill its socket buffers and keep publishing: the writes stall.
    let padding = "x".repeat(4000);
    let started = Instant::now();
    let freed = loop {
        for i in 0..200 {
            let mut big = transition(i);
            big.term = Some(format!("{}-{padding}", big.term.unwrap()));
            served.events.publish(big);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let probe = EventClient::connect(served.addr, None).await;
        if probe.status == 200 {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < SECOND * 20,
            "the stalled subscriber still holds its slot"
        );
    };
    println!("MEASURE stalled subscriber freed its slot after {freed:?}");
    // It was disconnected, not merely told it lagged: its socket ends.
    let mut buf = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(SECOND * 10, async {
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stalled subscriber's connection was closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_beyond_the_cap_are_refused_until_a_slot_frees() {
    let served = serve(2, Duration::from_secs(15)).await;
    let a = EventClient::connect(served.addr, None).await;
    let _b = EventClient::connect(served.addr, None).await;
    assert_eq!((a.status, _b.status), (200, 200));
    let c = EventClient::connect(served.addr, None).await;
    assert_eq!(c.status, 503);
    drop(a);
    let deadline = Instant::now() + SECOND * 3;
    loop {
        let d = EventClient::connect(served.addr, None).await;
        if d.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was not freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_get_keep_alive_comments() {
    let served = serve(2, Duration::from_millis(200)).await;
    let mut stream = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    stream
        .write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + SECOND * 3;
    while text.matches(":keep-alive").count() + text.matches(": keep-alive").count() < 2 {
        assert!(Instant::now() < deadline, "no keep-alives in {text:?}");
        let n = tokio::time::timeout(SECOND, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_after_the_final_event() {
    let served = serve(8, Duration::from_secs(15)).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut client = EventClient::connect(served.addr, None).await;
        client.next(SECOND).await.unwrap();
        clients.push(client);
    }
    served.events.publish(Transition {
        kind: EventKind::StoppedLeading,
        term: Some("uid/0".into()),
        reason: Some("shutdown"),
        holder: None,
    });
    served.stop.cancel();
    for mut client in clients {
        let rest = client.until_end(SECOND * 3).await;
        assert!(client.ended, "the stream ended");
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].data["reason"], "shutdown");
    }
    tokio::time::timeout(SECOND * 3, served.server)
        .await
        .expect("graceful shutdown completes with streams open")
        .unwrap()
        .unwrap();
}

/// What the election publishes while leading term `uid/1` until `valid_until`.
fn leading(valid_until: BootInstant) -> Snapshot {
    Snapshot {
        leading: true,
        term: Some(TermId::new(Some("uid"), 1)),
        holder: Some("me".into()),
        deadline: None,
        valid_until: Some(valid_until),
        last_stop: None,
        observed: true,
        collector_healthy: None,
        successor: None,
        own_record: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_replay_holds_the_current_start_is_followed_by_a_fresh_renewed() {
    let served = serve(8, Duration::from_secs(15)).await;
    let mut client = EventClient::connect(served.addr, None).await;
    let state = client.next(SECOND).await.unwrap();
    assert_eq!(
        state.data["valid_until"],
        serde_json::Value::Null,
        "not leading"
    );
    let before_start = state.message.id.clone().unwrap();
    drop(client);
    // The term starts while the subscriber is away, and is not renewed
    // again for a while (no renew lands between the replay and the test).
    let until = BootInstant::after(Duration::from_secs(30));
    served.publisher.publish(&leading(until));
    let boot_clock = json!({
        "boot_id": boot_clock_id().unwrap(),
        "boottime_ms": until.as_millis(),
    });

    let mut resumed = EventClient::connect(served.addr, Some(&before_start)).await;
    let replayed = resumed.drain(Duration::from_millis(300)).await;
    let kinds: Vec<&str> = replayed.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, ["started-leading", "renewed"], "{replayed:?}");
    for event in &replayed {
        assert_eq!(event.term(), Some("uid/1"));
        assert!(event.data["valid_for_ms"].as_u64().unwrap() > 29_000);
        assert_eq!(event.data["valid_until"], boot_clock, "{event:?}");
    }
    // The renewal is fresh (published now, not when the term started).
    assert!(
        replayed[1].data["published_at_us"].as_i64() > replayed[0].data["published_at_us"].as_i64()
    );
    assert_eq!(replayed[1].message.id, None, "a renewal has no id");

    // Resuming after the start: nothing to replay, and a renewal still.
    let after_start = replayed[0].message.id.clone().unwrap();
    let mut again = EventClient::connect(served.addr, Some(&after_start)).await;
    let replayed = again.drain(Duration::from_millis(300)).await;
    let kinds: Vec<&str> = replayed.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, ["renewed"]);
    assert_eq!(replayed[0].data["valid_until"], boot_clock);

    // A fresh subscriber's state carries the same deadline.
    let mut fresh = EventClient::connect(served.addr, None).await;
    let state = fresh.next(SECOND).await.unwrap();
    assert_eq!(state.data["leading"], true);
    assert_eq!(state.data["valid_until"], boot_clock);

    // A renew moves the deadline, and every stream is told.
    let later = BootInstant::after(Duration::from_secs(40));
    served.publisher.publish(&leading(later));
    for stream in [&mut resumed, &mut again, &mut fresh] {
        let renewed = stream.next(SECOND).await.unwrap();
        assert_eq!(renewed.kind(), "renewed");
        assert_eq!(
            renewed.data["valid_until"]["boottime_ms"],
            later.as_millis()
        );
    }
}
