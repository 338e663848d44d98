//! `GET /events`: leadership as a server-sent-events stream.
//!
//! On connect a `state` event (the `/leader` body); with a known
//! `Last-Event-ID`, exactly the missed events instead. Then every transition
//! as it is published, each with its `id:`. A subscriber that falls more than
//! the buffer behind gets a `lagged` event and a fresh `state`, and carries on
//! (it is not disconnected). Streams end on shutdown after the events already
//! published (a final `stopped-leading` with reason `shutdown` among them).
//! At most `max_subscribers` streams are open; beyond that, 503.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use crate::clock::wall_micros;
use crate::events::{Next, Start, Subscription, event_json};
use crate::http::{AppState, leader_body};

/// The handler of `GET /events`.
pub async fn events(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let Ok(permit) = app.subscribers.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many event subscribers\n",
        )
            .into_response();
    };
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let (start, subscription) = app.events.subscribe(last_event_id);
    let mut stream = EventStream {
        queue: VecDeque::new(),
        app: app.clone(),
        ending: false,
        _slot: Slot::new(permit, app.clone()),
        subscription,
    };
    match start {
        Start::Resume(missed) => stream.queue.extend(
            missed
                .iter()
                .map(|e| sse_event(&e.id, e.kind.as_str(), event_json(e))),
        ),
        Start::Fresh { missed } => stream.push_state(missed),
    }
    let keep_alive = KeepAlive::new().interval(app.keep_alive).text("keep-alive");
    Sse::new(stream.into_stream())
        .keep_alive(keep_alive)
        .into_response()
}

/// One subscriber's stream.
struct EventStream {
    subscription: Subscription,
    queue: VecDeque<SseEvent>,
    app: AppState,
    ending: bool,
    _slot: Slot,
}

impl EventStream {
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        futures::stream::unfold(self, |mut this| async move {
            loop {
                if let Some(event) = this.queue.pop_front() {
                    return Some((Ok(event), this));
                }
                if this.ending {
                    return None;
                }
                let shutdown = this.app.shutdown.clone();
                tokio::select! {
                    biased;
                    next = this.subscription.next() => this.push(next),
                    () = shutdown.cancelled() => {
                        // Deliver what was published before the end, then end.
                        while let Some(next) = this.subscription.try_next() {
                            this.push(next);
                        }
                        this.ending = true;
                    }
                }
            }
        })
    }

    fn push(&mut self, next: Next) {
        match next {
            Next::Event(e) => {
                self.queue
                    .push_back(sse_event(&e.id, e.kind.as_str(), event_json(&e)))
            }
            Next::Lagged(missed) => {
                let data = json!({
                    "missed": missed,
                    "published_at_us": wall_micros(),
                    "note": "this stream fell behind; a fresh state follows",
                });
                self.queue
                    .push_back(SseEvent::default().event("lagged").data(data.to_string()));
                self.app.events.resync(&mut self.subscription);
                self.push_state(true);
            }
            Next::Closed => self.ending = true,
        }
    }

    /// A `state` event with the current `/leader` body. Its id is a cursor:
    /// the id of the last event the state reflects, so resuming from it
    /// replays exactly what came after.
    fn push_state(&mut self, missed: bool) {
        let state = self.app.state.borrow().clone();
        // Live events up to the state's own seq are already in it.
        self.subscription.skip_to(state.seq);
        let (_, mut body) = leader_body(&self.app, &state);
        body["may_have_missed_events"] = json!(missed);
        body["published_at_us"] = json!(wall_micros());
        let id = self.app.events.id_of(state.seq);
        self.queue.push_back(sse_event(&id, "state", body));
    }
}

fn sse_event(id: &str, kind: &str, data: serde_json::Value) -> SseEvent {
    SseEvent::default()
        .id(id)
        .event(kind)
        .data(data.to_string())
}

/// A subscriber slot: holds the cap's permit and the gauge while open.
struct Slot {
    _permit: OwnedSemaphorePermit,
    app: AppState,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, app: AppState) -> Self {
        app.metrics.subscribers().inc();
        Self {
            _permit: permit,
            app,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.app.metrics.subscribers().dec();
    }
}
