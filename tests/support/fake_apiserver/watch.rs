//! Watch streams: newline-delimited JSON events, one per chunk (exchanges 12 to 14).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::tcp::OwnedWriteHalf;

use super::handler::{parse_rv, wait_for_rv};
use super::http::{self, Request};
use super::status;
use super::store::{
    Filter, WatchFrom, WatchMsg, WatchSignal, bookmark_line, error_line, render_event,
};
use super::{FaultKind, Inner, Verb};

/// Without `timeoutSeconds` the real server picks 30 to 60 minutes.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Removes the watch from the store however the stream ends (also when cancelled).
struct Registration {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.inner.lock().store.unregister_watch(self.id);
    }
}

enum Item {
    Line(String),
    /// The server ends the stream (timeout).
    End,
    /// An ERROR event, then the end.
    ErrorEnd(String),
}

fn partitioned(inner: &Inner, client: &str) -> bool {
    inner.lock().faults.get(client).is_some_and(|fs| {
        fs.iter()
            .any(|f| f.kind == FaultKind::Partition && f.applies_to(Verb::Watch))
    })
}

fn lag(inner: &Inner, client: &str) -> Duration {
    inner
        .lock()
        .watch_lag
        .get(client)
        .copied()
        .unwrap_or_default()
}

/// HTTP 200, one ERROR event with a Status (410 `Expired`), end of stream (exchange 13).
pub(super) async fn reply_expired(
    inner: &Inner,
    rec: usize,
    w: &mut OwnedWriteHalf,
    status: &Value,
    drop_response: bool,
    keep_alive: bool,
) -> bool {
    if !drop_response {
        inner.set_status(rec, 200);
    }
    if http::write_stream_head(w, 200).await.is_err() {
        return false;
    }
    if drop_response {
        return false;
    }
    http::write_chunk(w, error_line(status).as_bytes())
        .await
        .is_ok()
        && http::write_last_chunk(w).await.is_ok()
        && keep_alive
}

/// Watch events (not bookmarks) and bookmarks written to clients by the fake
/// API servers of this process, for the benchmarks' load figures.
pub(super) static EVENTS_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static BOOKMARKS_SENT: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Serves a watch request until `timeoutSeconds`, a fault or a signal ends it.
pub(super) async fn serve(
    inner: &Arc<Inner>,
    rec: usize,
    w: &mut OwnedWriteHalf,
    req: &Request,
    client: &str,
    filter: Filter,
    drop_response: bool,
) -> bool {
    let rv = match parse_rv(req) {
        Ok(rv) => rv,
        Err(e) => {
            inner.set_status(rec, e.code);
            let body = super::store::to_json(&e.body) + "\n";
            let _ = http::write_full(w, e.code, &e.headers, body.as_bytes(), false).await;
            return false;
        }
    };
    let initial_events = req.query_param("sendInitialEvents") == Some("true");
    let bookmarks = req.query_param("allowWatchBookmarks") == Some("true");
    let timeout = req
        .query_param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let from = match (initial_events, rv) {
        (true, _) => WatchFrom::InitialEvents,
        (false, None) => WatchFrom::Current,
        (false, Some(rv)) => WatchFrom::Rv(rv),
    };
    if let (false, Some(rv)) = (initial_events, rv)
        && let Err(e) = wait_for_rv(inner, rv).await
    {
        inner.set_status(rec, e.code);
        let body = super::store::to_json(&e.body) + "\n";
        return http::write_full(w, e.code, &e.headers, body.as_bytes(), req.keep_alive)
            .await
            .is_ok()
            && req.keep_alive;
    }
    let started = inner.lock().store.start_watch(client, &filter, from);
    let start = match started {
        Ok(s) => s,
        Err(e) => {
            return reply_expired(inner, rec, w, &e.body, drop_response, req.keep_alive).await;
        }
    };
    let _registration = Registration {
        inner: inner.clone(),
        id: start.id,
    };
    let mut rx = start.rx;
    let mut last_rv = start.start_rv;

    if !drop_response {
        inner.set_status(rec, 200);
    }
    if http::write_stream_head(w, 200).await.is_err() {
        return false;
    }
    if drop_response {
        // Cut the stream in the middle of the first chunk.
        let _ = tokio::io::AsyncWriteExt::write_all(w, b"40\r\n{\"type\":").await;
        let _ = tokio::io::AsyncWriteExt::shutdown(w).await;
        return false;
    }

    let now = Instant::now();
    let deadline = now + timeout;
    let mut queue: VecDeque<(Instant, Item)> = VecDeque::new();
    let l = lag(inner, client);
    for line in start.initial {
        queue.push_back((now + l, Item::Line(line)));
    }
    let mut server_done = false;
    let bookmark_interval = || inner.lock().bookmark_interval;
    let mut next_bookmark = now + bookmark_interval();
    let mut fault_changes = inner.faults_changed.subscribe();
    // Read again only when faults or lags change (they notify): a lock per
    // event and watch made the fan-out to 5,000 watches slow (swarm bench).
    let mut held = partitioned(inner, client);
    let mut l = lag(inner, client);

    loop {
        // A fault set before an event was sent holds that event: look again
        // before writing, since the select below may take the event first
        // when both are ready.
        if fault_changes.has_changed().unwrap_or(false) {
            fault_changes.borrow_and_update();
            held = partitioned(inner, client);
            l = lag(inner, client);
        }
        let now = Instant::now();
        if !held {
            while queue.front().is_some_and(|(due, _)| *due <= now) {
                let (_, item) = queue.pop_front().expect("front exists");
                match item {
                    Item::Line(line) => {
                        if http::write_chunk(w, line.as_bytes()).await.is_err() {
                            return false;
                        }
                        let counter = if line.contains("\"BOOKMARK\"") {
                            &BOOKMARKS_SENT
                        } else {
                            &EVENTS_SENT
                        };
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Item::End => return http::write_last_chunk(w).await.is_ok() && req.keep_alive,
                    Item::ErrorEnd(line) => {
                        return http::write_chunk(w, line.as_bytes()).await.is_ok()
                            && http::write_last_chunk(w).await.is_ok()
                            && req.keep_alive;
                    }
                }
            }
        }
        if !server_done && now >= deadline {
            queue.push_back((now + l, Item::End));
            server_done = true;
            continue;
        }
        if bookmarks && !server_done && !held && now >= next_bookmark {
            queue.push_back((now + l, Item::Line(bookmark_line(last_rv, false))));
            next_bookmark = now + bookmark_interval();
            continue;
        }
        let mut wake = if server_done {
            now + Duration::from_secs(3600)
        } else {
            deadline
        };
        if bookmarks && !server_done && !held {
            wake = wake.min(next_bookmark);
        }
        if !held && let Some((due, _)) = queue.front() {
            wake = wake.min(*due);
        }
        tokio::select! {
            msg = rx.recv(), if !server_done => match msg {
                Some(WatchMsg::Event(e)) => {
                    last_rv = e.rv;
                    if let Some(line) = render_event(&filter, &e) {
                        queue.push_back((Instant::now() + l, Item::Line(line)));
                    }
                }
                Some(WatchMsg::Signal(WatchSignal::Drop)) => {
                    // Like a dropped connection: no terminating chunk, connection closed.
                    return false;
                }
                Some(WatchMsg::Signal(WatchSignal::Expire)) => {
                    let current = inner.lock().store.rv();
                    let e = status::expired(last_rv, current);
                    queue.push_back((Instant::now() + l, Item::ErrorEnd(error_line(&e.body))));
                    server_done = true;
                }
                None => {
                    queue.push_back((Instant::now(), Item::End));
                    server_done = true;
                }
            },
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            _ = fault_changes.changed() => {
                held = partitioned(inner, client);
                l = lag(inner, client);
            }
        }
    }
}
