//! `GET /events`: leadership as a server-sent-events stream.
//!
//! On connect a `state` event (the `/leader` body); with a known
//! `Last-Event-ID`, exactly the missed events instead. Then every transition
//! as it is published, each with its `id:`. A subscriber that falls more than
//! the buffer behind gets a `lagged` event and a fresh `state`, and carries on
//! (it is not disconnected). Streams end on shutdown after the events already
//! published (a final `stopped-leading` with reason `shutdown` among them).
//! At most `max_subscribers` streams are open; beyond that, 503. With
//! `?gate=ID` the subscriber is a gate that acknowledges the end of each
//! term it was open for ([`crate::serve::gate_acks`]); gates count in a
//! pool of their own ([`crate::serve::app_state::StreamSlots`]).
//!
//! Validity, so a subscriber fails closed when this process dies: `state`,
//! `started-leading` and `renewed` carry `valid_for_ms`, judged when the event
//! is written to the stream, and `valid_until`, the deadline itself on this
//! node's boot clock (`{boot_id, boottime_ms}`, `null` when not leading).
//! While leading, a `renewed` event (no `id:`, not in the history) follows
//! every successful renew, and one follows every resumed replay, also when
//! the replay holds the current term's `started-leading`. A subscriber's
//! leadership is valid until `valid_until` of the latest of these when it
//! shares the boot clock, else *receive time + valid_for_ms*, and ends at once
//! on `stopped-leading`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::{Instant, Sleep};

use crate::clock::{BootInstant, wall_micros};
use crate::serve::app_state::AppState;
use crate::serve::gate_acks::{RegisterError, Registration, slower_than_the_gate_lag};
use crate::serve::gate_channel::GateChannel;
use crate::serve::guards::{not_from_this_pod, not_this_lease, query_param};
use crate::serve::leader_body::{json_str, write_leader_body, write_lease, write_valid_until};
use crate::serve::metrics::Metrics;
use crate::serve::published::LeaderState;
use crate::serve::server::{Peer, ReadClosed};
use crate::serve::transitions::{Event, EventKind, Next, Start, Subscription, event_json};

/// The handler of `GET /events`.
pub async fn events(
    State(app): State<Arc<AppState>>,
    read_closed: Option<Extension<ReadClosed>>,
    peer: Option<Extension<Peer>>,
    channel: Option<Extension<Arc<GateChannel>>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = not_this_lease(&app, uri.query()) {
        return refusal;
    }
    // A gate registers before it reads anything: if it is too late to be
    // counted for a term, what it reads says that term is over.
    let silent = match query_param(uri.query(), "acknowledges").as_deref() {
        None | Some("true") => false,
        Some("false") => true,
        Some(_) => {
            return (
                StatusCode::BAD_REQUEST,
                "acknowledges must be true or false\n",
            )
                .into_response();
        }
    };
    let gate = query_param(uri.query(), "gate");
    // A gate of another pod's could hold this pod's releases: refused
    // before it may take a slot.
    if gate.is_some()
        && let Some(refusal) = not_from_this_pod(peer.as_ref(), channel.as_ref(), "gates register")
    {
        return refusal;
    }
    // Gates and plain readers never compete for a slot (`StreamSlots`).
    let pool = match gate {
        Some(_) => &app.subscribers.gates,
        None => &app.subscribers.reads,
    };
    let Ok(permit) = pool.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many event subscribers\n",
        )
            .into_response();
    };
    let registration = match gate {
        None => None,
        Some(id) => {
            if let Some(warning) = query_param(uri.query(), "stops_within_ms")
                .and_then(|ms| ms.parse().ok())
                .and_then(|ms| {
                    slower_than_the_gate_lag(&id, Duration::from_millis(ms), app.gate_lag)
                })
            {
                // Once per process: every exec of a pod shares its flags.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!("{warning}");
                }
            }
            match app.gate_acks.register(&id, silent) {
                Ok(registration) => Some(registration),
                Err(error @ RegisterError::InvalidId) => {
                    return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response();
                }
                Err(error @ RegisterError::Full) => {
                    return (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response();
                }
            }
        }
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
        ending: false,
        keep_alive: Box::pin(tokio::time::sleep(app.keep_alive)),
        last_frame: Instant::now(),
        read_closed: read_closed.map(|Extension(ReadClosed(token))| token),
        half_closed: false,
        _slot: Slot::new(permit, app.metrics.clone()),
        _registration: registration,
        app,
        subscription,
    };
    stream.state.mark_unchanged();
    match start {
        Start::Resume(missed) => {
            for event in &missed {
                stream.push_event(event);
            }
            // The subscriber may have lost its validity while away: a fresh
            // one, even when the replay just told it (a replayed start is
            // an old message, which an older client ages by its publication).
            stream.push_renewed(true);
        }
        Start::Fresh { missed } => stream.push_state(missed),
    }
    let frames = stream
        .into_stream()
        .map(|frame| Ok::<_, Infallible>(Frame::data(frame)));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::new(StreamBody::new(frames)),
    )
        .into_response()
}

/// One subscriber's stream: what it holds while idle is this, its task and
/// its socket (the server keeps no buffer between events).
struct EventStream {
    subscription: Subscription,
    /// The published state, to see renews (they are not transitions).
    state: watch::Receiver<LeaderState>,
    /// The term and validity this subscriber was last told.
    told: Option<(String, Option<BootInstant>)>,
    /// Frames ready to be sent.
    queue: VecDeque<Bytes>,
    /// A keep-alive comment is due once the interval has passed since the
    /// last frame; the timer is moved only when it fires (not at every
    /// frame: a fan-out to thousands would move thousands of timers).
    keep_alive: Pin<Box<Sleep>>,
    last_frame: Instant,
    /// Cancelled when the client closes its sending side; from then on,
    /// keep-alives come every [`HALF_CLOSED_KEEP_ALIVE`] at most.
    read_closed: Option<tokio_util::sync::CancellationToken>,
    half_closed: bool,
    app: Arc<AppState>,
    ending: bool,
    _slot: Slot,
    /// `?gate=ID`: registered for every term while the stream lasts.
    _registration: Option<Registration>,
}

const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
/// A client that closed its sending side may only have half-closed (it
/// still reads) or may have gone: only a write tells, so one goes out at
/// once and then at least this often, and a client that has gone frees its
/// place within about this long.
const HALF_CLOSED_KEEP_ALIVE: Duration = Duration::from_secs(1);

impl EventStream {
    fn into_stream(self) -> impl Stream<Item = Bytes> {
        futures::stream::unfold(self, |mut this| async move {
            loop {
                if let Some(frame) = this.queue.pop_front() {
                    this.last_frame = Instant::now();
                    return Some((frame, this));
                }
                if this.ending {
                    return None;
                }
                tokio::select! {
                    biased;
                    next = this.subscription.next() => this.push(next),
                    // Transitions come first (biased): a renew is told only
                    // for a term the subscriber already knows to be current.
                    Ok(()) = this.state.changed() => this.push_renewed(false),
                    () = this.app.shutdown.cancelled() => {
                        // Deliver what was published before the end, then end.
                        while let Some(next) = this.subscription.try_next() {
                            this.push(next);
                        }
                        this.ending = true;
                    }
                    () = closed(&this.read_closed), if !this.half_closed => {
                        this.half_closed = true;
                        this.queue.push_back(Bytes::from_static(KEEP_ALIVE));
                        let next = later(Instant::now(), this.keep_alive_interval());
                        this.keep_alive.as_mut().reset(next);
                    }
                    () = this.keep_alive.as_mut() => {
                        let now = Instant::now();
                        let due = later(this.last_frame, this.keep_alive_interval());
                        if due <= now {
                            this.queue.push_back(Bytes::from_static(KEEP_ALIVE));
                            let next = later(now, this.keep_alive_interval());
                            this.keep_alive.as_mut().reset(next);
                        } else {
                            this.keep_alive.as_mut().reset(due);
                        }
                    }
                }
            }
        })
    }

    fn keep_alive_interval(&self) -> Duration {
        if self.half_closed {
            self.app.keep_alive.min(HALF_CLOSED_KEEP_ALIVE)
        } else {
            self.app.keep_alive
        }
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
                    .push_back(format!("event: lagged\ndata: {data}\n\n").into());
                self.app.events.resync(&mut self.subscription);
                self.push_state(true);
            }
            Next::Closed => self.ending = true,
        }
    }

    /// A transition; a start carries the validity of its term as of now
    /// (zero when that term is no longer current: a replay of an old one).
    fn push_event(&mut self, event: &Arc<Event>) {
        let frame = shared_frame(event);
        match event.kind {
            EventKind::StartedLeading => {
                let (valid_for, valid_until) = {
                    let state = self.state.borrow();
                    let valid_for = if state.term == event.term {
                        state.valid_for()
                    } else {
                        Duration::ZERO
                    };
                    (valid_for, state.valid_until)
                };
                if let Some(term) = event.term.clone().filter(|_| !valid_for.is_zero()) {
                    self.told = Some((term, valid_until));
                }
                // The shared frame ends with the data's `}` and the blank
                // line; `valid_for_ms` sorts last among the data's keys.
                let open = &frame[..frame.len() - b"}\n\n".len()];
                let mut out = Vec::with_capacity(frame.len() + 24);
                out.extend_from_slice(open);
                let _ = write!(out, ",\"valid_for_ms\":{}", valid_for.as_millis() as u64);
                write_valid_until(&mut out, valid_until.filter(|_| !valid_for.is_zero()));
                out.extend_from_slice(b"}\n\n");
                self.queue.push_back(out.into());
            }
            EventKind::StoppedLeading => {
                self.told = None;
                self.queue.push_back(frame);
            }
            EventKind::NewLeader => self.queue.push_back(frame),
        }
    }

    /// A `renewed` event if the current term was renewed since the
    /// subscriber was last told its validity (or it may have lost track), or
    /// with `fresh`, whenever it leads in a term the subscriber knows.
    fn push_renewed(&mut self, fresh: bool) {
        let (term, valid_until, valid_for) = {
            let state = self.state.borrow_and_update();
            let valid_for = state.valid_for();
            // Not leading now: nothing to tell (and nothing to copy).
            let Some(term) = state.term.as_ref().filter(|_| !valid_for.is_zero()) else {
                return;
            };
            (term.clone(), state.valid_until, valid_for)
        };
        match &self.told {
            // Told this very validity already.
            Some((told_term, told_until))
                if !fresh && *told_term == term && *told_until == valid_until =>
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
        // The keys in the order a JSON value would sort them.
        let mut out = Vec::with_capacity(160);
        out.extend_from_slice(b"event: renewed\ndata: {\"identity\":");
        json_str(&mut out, Some(&self.app.identity));
        write_lease(&mut out, &self.app);
        let _ = write!(out, ",\"published_at_us\":{},\"term\":", wall_micros());
        json_str(&mut out, Some(&term));
        let _ = write!(
            out,
            ",\"type\":\"renewed\",\"valid_for_ms\":{}",
            valid_for.as_millis() as u64
        );
        write_valid_until(&mut out, valid_until);
        out.extend_from_slice(b"}\n\n");
        self.told = Some((term, valid_until));
        self.queue.push_back(out.into());
    }

    /// A `state` event with the current `/leader` body. Its id is a cursor:
    /// the id of the last event the state reflects, so resuming from it
    /// replays exactly what came after.
    fn push_state(&mut self, missed: bool) {
        let state = self.state.borrow_and_update().clone();
        // Live events up to the state's own seq are already in it.
        self.subscription.skip_to(state.seq);
        let mut out = Vec::with_capacity(400);
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(self.app.events.id_of(state.seq).as_bytes());
        out.extend_from_slice(b"\nevent: state\ndata: ");
        let leading = write_leader_body(&self.app, &state, Some((missed, wall_micros())), &mut out);
        out.extend_from_slice(b"\n\n");
        self.told = state
            .term
            .clone()
            .filter(|_| leading)
            .map(|term| (term, state.valid_until));
        self.queue.push_back(out.into());
    }
}

/// Resolves once `token` is cancelled; never without one.
async fn closed(token: &Option<tokio_util::sync::CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

/// `at + interval`, or a time that never comes if that overflows.
fn later(at: Instant, interval: Duration) -> Instant {
    at.checked_add(interval)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// The frame of `event` as every subscriber gets it (a start's validity
/// aside), rendered once: a transition goes to every subscriber in a row,
/// and rendering it for each would cost more than writing it. The few
/// latest renderings are kept, by the identity of the event.
fn shared_frame(event: &Arc<Event>) -> Bytes {
    /// Weak: the key's allocation outlives the entry, so no other event can
    /// take its address while it is here.
    static RENDERED: Mutex<VecDeque<(Weak<Event>, Bytes)>> = Mutex::new(VecDeque::new());
    let mut rendered = RENDERED.lock().expect("rendered events");
    if let Some((_, frame)) = rendered
        .iter()
        .find(|(key, _)| std::ptr::eq(key.as_ptr(), Arc::as_ptr(event)))
    {
        return frame.clone();
    }
    let mut out = Vec::with_capacity(320);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(event.id.as_bytes());
    out.extend_from_slice(b"\nevent: ");
    out.extend_from_slice(event.kind.as_str().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut out, &event_json(event)).expect("events serialize");
    out.extend_from_slice(b"\n\n");
    let frame = Bytes::from(out);
    if rendered.len() == 4 {
        rendered.pop_front();
    }
    rendered.push_back((Arc::downgrade(event), frame.clone()));
    frame
}

/// A subscriber slot: holds the cap's permit and the gauge while open.
struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Self {
        metrics.subscribers().inc();
        Self {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.subscribers().dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::transitions::{EventLog, LeaseLabel, Transition};

    #[test]
    fn a_shared_frame_is_the_event_as_a_value_would_render_it_and_is_rendered_once() {
        let log = EventLog::new("me \"quoted\"", LeaseLabel::alone("ns", "demo"), 8, 8);
        let event = log.publish(Transition {
            kind: EventKind::StoppedLeading,
            term: Some("uid/1".into()),
            reason: Some("shutdown"),
            holder: None,
        });
        let frame = shared_frame(&event);
        let expected = format!(
            "id: {}\nevent: stopped-leading\ndata: {}\n\n",
            event.id,
            event_json(&event)
        );
        assert_eq!(std::str::from_utf8(&frame).unwrap(), expected);
        // The same bytes, not a second rendering.
        assert_eq!(shared_frame(&event).as_ptr(), frame.as_ptr());
        // Another event with the same content is another frame.
        let other = log.publish(Transition {
            kind: EventKind::StoppedLeading,
            term: Some("uid/1".into()),
            reason: Some("shutdown"),
            holder: None,
        });
        assert!(
            std::str::from_utf8(&shared_frame(&other))
                .unwrap()
                .contains(&other.id)
        );
    }
}
