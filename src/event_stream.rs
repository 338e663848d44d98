//! `GET /events`: leadership as a server-sent-events stream.
//!
//! On connect a `state` event (the `/leader` body); with a known
//! `Last-Event-ID`, exactly the missed events instead. Then every transition
//! as it is published, each with its `id:`. A subscriber that falls more than
//! the buffer behind gets a `lagged` event and a fresh `state`, and carries on
//! (it is not disconnected). Streams end on shutdown after the events already
//! published (a final `stopped-leading` with reason `shutdown` among them).
//! At most `max_subscribers` streams are open; beyond that, 503.
//!
//! Validity, so a subscriber fails closed when this process dies: `state`,
//! `started-leading` and `renewed` carry `valid_for_ms`, judged when the event
//! is written to the stream. While leading, a `renewed` event (no `id:`, not
//! in the history) follows every successful renew, and one follows a resumed
//! replay. A subscriber's leadership is valid until *receive time +
//! valid_for_ms* of the latest of these, and ends at once on `stopped-leading`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::app::{AppState, leader_body};
use crate::clock::{BootInstant, wall_micros};
use crate::events::{Event, EventKind, Next, Start, Subscription, event_json};
use crate::state::LeaderState;

/// The handler of `GET /events`.
pub async fn events(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let Ok(permit) = app.subscribers.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many event subscribers\n",
        )
            .into_response();
    };
    // A header that is not visible ASCII is an id we never gave: unknown,
    // not absent (the subscriber did have a position and may miss events).
    let last_event_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or(""));
    let (start, subscription) = app.events.subscribe(last_event_id);
    let mut stream = EventStream {
        queue: VecDeque::new(),
        state: app.state.clone(),
        told: None,
        app: app.clone(),
        ending: false,
        _slot: Slot::new(permit, app.clone()),
        subscription,
    };
    stream.state.mark_unchanged();
    match start {
        Start::Resume(missed) => {
            for event in &missed {
                stream.push_event(event);
            }
            // The subscriber may have lost its validity while away.
            stream.push_renewed();
        }
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
    /// The published state, to see renews (they are not transitions).
    state: watch::Receiver<LeaderState>,
    /// The term and validity this subscriber was last told.
    told: Option<(String, Option<BootInstant>)>,
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
                    // Transitions come first (biased): a renew is told only
                    // for a term the subscriber already knows to be current.
                    Ok(()) = this.state.changed() => this.push_renewed(),
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
            Next::Event(e) => self.push_event(&e),
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

    /// A transition; a start carries the validity of its term as of now
    /// (zero when that term is no longer current: a replay of an old one).
    fn push_event(&mut self, event: &Event) {
        let mut data = event_json(event);
        match event.kind {
            EventKind::StartedLeading => {
                let state = self.state.borrow().clone();
                let valid_for = if state.term == event.term {
                    state.valid_for()
                } else {
                    Duration::ZERO
                };
                data["valid_for_ms"] = json!(valid_for.as_millis() as u64);
                if let Some(term) = event.term.clone().filter(|_| !valid_for.is_zero()) {
                    self.told = Some((term, state.valid_until));
                }
            }
            EventKind::StoppedLeading => self.told = None,
            EventKind::NewLeader => {}
        }
        self.queue
            .push_back(sse_event(&event.id, event.kind.as_str(), data));
    }

    /// A `renewed` event if the current term was renewed since the
    /// subscriber was last told its validity (or it may have lost track).
    fn push_renewed(&mut self) {
        let state = self.state.borrow_and_update().clone();
        let Some(term) = state.term.clone().filter(|_| state.leading_now()) else {
            return;
        };
        match &self.told {
            // Told this very validity already.
            Some((told_term, told_until))
                if *told_term == term && *told_until == state.valid_until =>
            {
                return;
            }
            Some((told_term, _)) if *told_term == term => {}
            // A term not yet announced: its `started-leading` comes first.
            Some(_) => return,
            // Told nothing yet: only after a resume (a fresh stream starts
            // with a `state`, which sets `told`).
            None => {}
        }
        let data = json!({
            "type": "renewed",
            "identity": &*self.app.identity,
            "term": &term,
            "valid_for_ms": state.valid_for().as_millis() as u64,
            "published_at_us": wall_micros(),
        });
        self.told = Some((term, state.valid_until));
        self.queue
            .push_back(SseEvent::default().event("renewed").data(data.to_string()));
    }

    /// A `state` event with the current `/leader` body. Its id is a cursor:
    /// the id of the last event the state reflects, so resuming from it
    /// replays exactly what came after.
    fn push_state(&mut self, missed: bool) {
        let state = self.state.borrow_and_update().clone();
        // Live events up to the state's own seq are already in it.
        self.subscription.skip_to(state.seq);
        let (leading, mut body) = leader_body(&self.app, &state);
        self.told = state
            .term
            .clone()
            .filter(|_| leading)
            .map(|term| (term, state.valid_until));
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
