//! The published leadership state: the one snapshot that readers (`/leader`,
//! the event stream) answer from.
//!
//! Only the election driver publishes, through [`Publisher`], the serving
//! side's [`Outlet`]. The machine fixes each deadline on
//! the boot clock when its renew is sent, so a reader decides at read time
//! whether a "leading" snapshot is still valid, suspend included (G2).
//!
//! What the HTTP handlers share ([`AppState`]): the published state, this
//! instance's names, and the `/leader` body judged at read time — used by
//! `/leader` ([`crate::serve::routes`]) and the event stream's `state` events
//! ([`crate::serve::sse_route`]) alike.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::{BootInstant, boot_clock_id, format_micro_time, wall_micros};
use crate::elector::api_error::ApiError;
use crate::elector::driver::{Heartbeat, Outlet};
use crate::elector::incarnation::{RecordWriter, Recorded};
use crate::elector::machine::Snapshot;
use crate::serve::gate_acks::GateAcks;
use crate::serve::kube_events::Recorder;
use crate::serve::metrics::Metrics;
use crate::serve::transitions::{EventKind, EventLog, Transition};

/// What is published after every change.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderState {
    /// The machine says "leading"; readers must also check [`Self::valid_for`].
    pub leading: bool,
    pub holder: Option<String>,
    pub term: Option<String>,
    /// Wall clock (µs) at which the current leading/holder state began.
    pub since_micros: i64,
    /// The forced step-down instant on the boot clock, while leading.
    pub valid_until: Option<BootInstant>,
    /// The seq of the last event published (counts transitions).
    pub seq: u64,
    /// Why the last term ended.
    pub last_stop: Option<&'static str>,
    /// The last term that ended here: over for good (it never starts
    /// again), so a gate that missed its `stopped-leading` may acknowledge it.
    pub last_term: Option<String>,
    /// The API server answered at least once.
    pub observed: bool,
    /// Whether the collector passes its health check; `None` without one.
    pub collector_healthy: Option<bool>,
    /// The successor named in the Lease, as observed: what spreading several
    /// Leases needs to know of the others (not in the `/leader` body).
    pub successor: Option<String>,
    /// The live record is this process's own write (leading, or stepping
    /// down until the release): what spreading counts as held (not in the
    /// `/leader` body).
    pub own_record: bool,
}

impl LeaderState {
    pub(crate) fn initial() -> Self {
        Self {
            leading: false,
            holder: None,
            term: None,
            since_micros: wall_micros(),
            valid_until: None,
            seq: 0,
            last_stop: None,
            last_term: None,
            observed: false,
            collector_healthy: None,
            successor: None,
            own_record: false,
        }
    }

    /// Time left before a forced step-down, judged now; zero when not leading.
    pub fn valid_for(&self) -> Duration {
        match (self.leading, self.valid_until) {
            (true, Some(until)) => until.remaining(),
            _ => Duration::ZERO,
        }
    }

    /// Leading, and still within the deadline at this very moment.
    pub fn leading_now(&self) -> bool {
        !self.valid_for().is_zero()
    }
}

/// The body of `GET /leader`.
#[derive(Debug, Serialize)]
pub struct LeaderBody<'a> {
    pub leading: bool,
    pub identity: &'a str,
    pub holder: Option<&'a str>,
    pub lease: LeaseRef<'a>,
    pub term: Option<&'a str>,
    pub since: String,
    pub valid_for_ms: u64,
    pub seq: u64,
    pub last_stop_reason: Option<&'a str>,
    pub last_term: Option<&'a str>,
    pub collector_healthy: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct LeaseRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub shard: usize,
    pub shards: usize,
}

/// The election's side of the published state: the snapshot for readers,
/// and one event per transition for subscribers.
pub struct Publisher {
    tx: watch::Sender<LeaderState>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    /// Kubernetes Events for this instance's starts and stops, if recorded.
    recorder: Option<Recorder>,
    /// `--state-dir`: where our last stored write is kept for a restart,
    /// written by a thread of its own (never on the election's).
    state_dir: Option<RecordWriter>,
    /// The gates registered for each term, told of every publication; their
    /// acknowledgements may end the gate lag early.
    gate_acks: Option<Arc<GateAcks>>,
}

// === impl Publisher ===

impl Publisher {
    pub fn new(
        events: Arc<EventLog>,
        metrics: Arc<Metrics>,
    ) -> (Self, watch::Receiver<LeaderState>) {
        let (tx, rx) = watch::channel(LeaderState::initial());
        let publisher = Self {
            tx,
            events,
            metrics,
            recorder: None,
            state_dir: None,
            gate_acks: None,
        };
        (publisher, rx)
    }

    /// Also records each start and stop of this instance as a Kubernetes
    /// Event (queued: publishing never waits for the API server).
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Also keeps the write a restart of this pod may resume, through
    /// `state_dir`'s thread.
    pub fn with_state_dir(mut self, state_dir: RecordWriter) -> Self {
        self.state_dir = Some(state_dir);
        self
    }

    /// Tells `gate_acks` of every publication, and lets a release go out
    /// once every gate registered for the term has acknowledged its end.
    pub fn with_gate_acks(mut self, gate_acks: Arc<GateAcks>) -> Self {
        self.gate_acks = Some(gate_acks);
        self
    }

    /// Publishes `snapshot` if anything a reader sees changed, with an event
    /// for each transition (stopped before new-leader before started).
    pub fn publish(&self, snapshot: &Snapshot) {
        let changed = self.tx.send_if_modified(|state| {
            let term = snapshot.term.as_ref().map(|t| t.to_string());
            let transitions = self.transitions(state, snapshot, &term);
            for transition in &transitions {
                let event = self.events.publish(transition.clone());
                self.metrics.transition(&event);
                if let Some(recorder) = &self.recorder {
                    recorder.record(&event);
                }
            }
            self.metrics
                .state(snapshot.leading, snapshot.holder.is_some());
            self.metrics.collector_healthy(snapshot.collector_healthy);
            let ended = transitions
                .iter()
                .find(|t| t.kind == EventKind::StoppedLeading)
                .and_then(|t| t.term.clone());
            let next = LeaderState {
                leading: snapshot.leading,
                holder: snapshot.holder.clone(),
                term,
                since_micros: if transitions.is_empty() {
                    state.since_micros
                } else {
                    wall_micros()
                },
                // Fixed on the boot clock when the renew was sent (G2): it
                // moves only on a successful renew, which `renewed` tells.
                valid_until: snapshot.valid_until,
                seq: self.events.last_seq(),
                last_stop: snapshot.last_stop.map(|r| r.as_str()),
                last_term: ended.or_else(|| state.last_term.clone()),
                observed: snapshot.observed,
                collector_healthy: snapshot.collector_healthy,
                successor: snapshot.successor.clone(),
                own_record: snapshot.own_record,
            };
            let changed = *state != next;
            if changed {
                *state = next;
            }
            changed
        });
        // Only now, with the new state visible to every reader (see
        // [`crate::serve::gate_acks`] for why the order matters).
        if changed && let Some(gate_acks) = &self.gate_acks {
            let state = self.tx.borrow();
            gate_acks.term_changed(state.term.as_deref(), state.leading);
        }
    }

    fn transitions(
        &self,
        state: &LeaderState,
        snapshot: &Snapshot,
        term: &Option<String>,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        let term_changed = state.term != *term;
        if state.leading && (!snapshot.leading || term_changed) {
            out.push(Transition {
                kind: EventKind::StoppedLeading,
                term: state.term.clone(),
                // A stop always has a reason; the machine records one first.
                reason: Some(snapshot.last_stop.map_or("unknown", |r| r.as_str())),
                holder: None,
            });
        }
        // Who leads, for followers' subscribers; our own start says it for us
        // (a record naming us while we do not lead is news, though).
        if state.holder != snapshot.holder && !snapshot.leading {
            out.push(Transition {
                kind: EventKind::NewLeader,
                term: None,
                reason: None,
                holder: snapshot.holder.clone(),
            });
        }
        if snapshot.leading && (!state.leading || term_changed) {
            out.push(Transition {
                kind: EventKind::StartedLeading,
                term: term.clone(),
                reason: None,
                holder: snapshot.holder.clone(),
            });
        }
        out
    }
}

/// The driver's reports: its snapshots published, its requests counted.
impl Outlet for Publisher {
    fn publish(&self, snapshot: &Snapshot) {
        Publisher::publish(self, snapshot);
    }

    fn api_request(&self, verb: &'static str, result: Result<(), &ApiError>) {
        self.metrics.api_request(verb, result);
    }

    fn renewed(&self, sent: BootInstant, latency: Duration) {
        self.metrics.renewed(sent, latency);
    }

    fn renew_conflict(&self) {
        self.metrics.renew_conflict();
    }

    fn identity_conflicts(&self, new: u64) {
        self.metrics.identity_conflicts(new);
    }

    fn gates_closed(&self) -> futures::future::BoxFuture<'static, ()> {
        match &self.gate_acks {
            Some(gate_acks) => Box::pin(gate_acks.clone().all_closed()),
            None => Box::pin(std::future::pending()),
        }
    }

    fn gates_still_open(&self) -> Vec<String> {
        self.gate_acks
            .as_ref()
            .map_or_else(Vec::new, |acks| acks.still_open())
    }

    fn whole_gate_lag_reason(&self) -> Option<&'static str> {
        self.gate_acks.as_ref()?.whole_lag_reason()
    }

    fn resumable(&self, write: Option<&Recorded>) {
        // Handed to the writer's thread: the election never waits on the
        // disk, and the thread says (once) when it cannot write.
        let Some(state_dir) = &self.state_dir else {
            return;
        };
        match write {
            Some(write) => state_dir.record(write),
            None => state_dir.clear(),
        }
    }
}

pub fn since_text(state: &LeaderState) -> String {
    format_micro_time(state.since_micros)
}

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub state: watch::Receiver<LeaderState>,
    pub identity: Arc<str>,
    pub namespace: Arc<str>,
    pub lease_name: Arc<str>,
    pub heartbeat: Arc<Heartbeat>,
    /// `/healthz` fails when the election loop was silent this long.
    pub stuck_after: Duration,
    pub events: Arc<EventLog>,
    pub metrics: Arc<Metrics>,
    /// One permit per open `/events` stream.
    pub subscribers: Arc<Semaphore>,
    /// Interval of keep-alive comments on `/events`.
    pub keep_alive: Duration,
    /// Ends the event streams (the server's own graceful shutdown waits for them).
    pub shutdown: CancellationToken,
    /// Where `/events?gate=ID` registers and `POST /gates/ID/closed` acknowledges.
    pub gate_acks: Arc<GateAcks>,
    /// `--gate-lag`: what a gate that stops slower is warned of.
    pub gate_lag: Duration,
    /// Where `POST /handover` asks the election to step down and stand
    /// aside ([`crate::serve::step_down`]).
    pub step_aside: Arc<tokio::sync::Notify>,
}

/// The `/leader` body for `state`, judged now, written into `out`: the same
/// bytes as [`leader_body`]'s value serialized (keys in the same, sorted,
/// order), without building the value. `extras` are a `state` event's
/// `may_have_missed_events` and `published_at_us`, written where they sort.
/// Returns whether this instance leads at this very moment.
pub fn write_leader_body(
    app: &AppState,
    state: &LeaderState,
    extras: Option<(bool, i64)>,
    out: &mut Vec<u8>,
) -> bool {
    // Decided now, against the boot-clock deadline, not when published (G2).
    let valid_for = state.valid_for();
    let leading = !valid_for.is_zero();
    out.extend_from_slice(b"{\"collector_healthy\":");
    out.extend_from_slice(match state.collector_healthy {
        None => b"null",
        Some(true) => b"true",
        Some(false) => b"false",
    });
    out.extend_from_slice(b",\"holder\":");
    json_str(out, state.holder.as_deref());
    out.extend_from_slice(b",\"identity\":");
    json_str(out, Some(&app.identity));
    out.extend_from_slice(b",\"last_stop_reason\":");
    json_str(out, state.last_stop);
    out.extend_from_slice(b",\"last_term\":");
    json_str(out, state.last_term.as_deref());
    out.extend_from_slice(b",\"leading\":");
    out.extend_from_slice(if leading { b"true" } else { b"false" });
    write_lease(out, app);
    if let Some((missed, published_at_us)) = extras {
        out.extend_from_slice(b",\"may_have_missed_events\":");
        out.extend_from_slice(if missed { b"true" } else { b"false" });
        out.extend_from_slice(b",\"published_at_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(published_at_us).as_bytes());
    }
    out.extend_from_slice(b",\"seq\":");
    out.extend_from_slice(itoa::Buffer::new().format(state.seq).as_bytes());
    out.extend_from_slice(b",\"since\":");
    write_since(out, state.since_micros);
    out.extend_from_slice(b",\"term\":");
    json_str(out, state.term.as_deref().filter(|_| leading));
    out.extend_from_slice(b",\"valid_for_ms\":");
    let valid_for_ms = valid_for.as_millis() as u64;
    out.extend_from_slice(itoa::Buffer::new().format(valid_for_ms).as_bytes());
    if extras.is_some() {
        // A `state` event: also the deadline itself, on the boot clock.
        write_valid_until(out, state.valid_until.filter(|_| leading));
    }
    out.push(b'}');
    leading
}

/// `,"lease":{…}`: which Lease this is, and its place among the sidecar's
/// ([`LeaseLabel`](crate::serve::transitions::LeaseLabel), keys sorted).
pub fn write_lease(out: &mut Vec<u8>, app: &AppState) {
    let place = app.events.lease();
    out.extend_from_slice(b",\"lease\":{\"name\":");
    json_str(out, Some(&app.lease_name));
    out.extend_from_slice(b",\"namespace\":");
    json_str(out, Some(&app.namespace));
    out.extend_from_slice(b",\"shard\":");
    out.extend_from_slice(itoa::Buffer::new().format(place.shard).as_bytes());
    out.extend_from_slice(b",\"shards\":");
    out.extend_from_slice(itoa::Buffer::new().format(place.shards).as_bytes());
    out.push(b'}');
}

/// `,"valid_until":…`: the step-down deadline on this node's boot clock,
/// `{"boot_id":…,"boottime_ms":…}` (rounded down), for a subscriber on the
/// same boot clock to judge as is (no transit time, no wall clock); `null`
/// when not leading or when the boot clock has no id here.
pub fn write_valid_until(out: &mut Vec<u8>, until: Option<BootInstant>) {
    out.extend_from_slice(b",\"valid_until\":");
    match (until, boot_clock_id()) {
        (Some(until), Some(boot_id)) => {
            out.extend_from_slice(b"{\"boot_id\":");
            json_str(out, Some(boot_id));
            out.extend_from_slice(b",\"boottime_ms\":");
            out.extend_from_slice(itoa::Buffer::new().format(until.as_millis()).as_bytes());
            out.push(b'}');
        }
        _ => out.extend_from_slice(b"null"),
    }
}

/// `since` as a JSON string: formatted once per value (it changes only at a
/// transition), not once per request.
fn write_since(out: &mut Vec<u8>, micros: i64) {
    thread_local! {
        static SINCE: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    SINCE.with_borrow_mut(|(at, text)| {
        if *at != micros {
            *at = micros;
            *text = format_micro_time(micros);
        }
        json_str(out, Some(text));
    });
}

/// A JSON string (escaped as serde_json does), or `null`.
pub fn json_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) => serde_json::to_writer(&mut *out, value).expect("a string serializes"),
        None => out.extend_from_slice(b"null"),
    }
}

/// The `/leader` body for `state`, judged now: whether this instance leads
/// at this very moment, and the JSON.
pub fn leader_body(app: &AppState, state: &LeaderState) -> (bool, serde_json::Value) {
    // Decided now, against the boot-clock deadline, not when published (G2).
    let valid_for = state.valid_for();
    let leading = state.leading_now();
    let body = LeaderBody {
        leading,
        identity: &app.identity,
        holder: state.holder.as_deref(),
        lease: LeaseRef {
            namespace: &app.namespace,
            name: &app.lease_name,
            shard: app.events.lease().shard,
            shards: app.events.lease().shards,
        },
        term: state.term.as_deref().filter(|_| leading),
        since: since_text(state),
        valid_for_ms: valid_for.as_millis() as u64,
        seq: state.seq,
        last_stop_reason: state.last_stop,
        last_term: state.last_term.as_deref(),
        collector_healthy: state.collector_healthy,
    };
    (
        leading,
        serde_json::to_value(body).expect("the body serializes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::transitions::LeaseLabel;

    fn snapshot(leading: bool, holder: Option<&str>) -> Snapshot {
        Snapshot {
            leading,
            term: None,
            holder: holder.map(str::to_owned),
            deadline: None,
            valid_until: None,
            last_stop: None,
            observed: true,
            collector_healthy: None,
            successor: None,
            own_record: leading,
        }
    }

    #[test]
    fn a_record_naming_us_while_we_do_not_lead_is_announced() {
        let events = EventLog::new("me", LeaseLabel::alone("ns", "l"), 8, 8);
        let metrics = Arc::new(Metrics::new("ns", "l"));
        let (publisher, _rx) = Publisher::new(events.clone(), metrics);
        let (_, mut sub) = events.subscribe(None);
        publisher.publish(&snapshot(false, Some("other")));
        publisher.publish(&snapshot(false, Some("me")));
        let holders: Vec<_> = std::iter::from_fn(|| match sub.try_next() {
            Some(crate::serve::transitions::Next::Event(e)) => Some((e.kind, e.holder.clone())),
            _ => None,
        })
        .collect();
        assert_eq!(
            holders,
            [
                (EventKind::NewLeader, Some("other".to_owned())),
                (EventKind::NewLeader, Some("me".to_owned())),
            ]
        );
    }

    #[test]
    fn the_last_ended_term_is_published_until_another_ends() {
        use crate::elector::lease::TermId;
        let events = EventLog::new("me", LeaseLabel::alone("ns", "l"), 8, 8);
        let metrics = Arc::new(Metrics::new("ns", "l"));
        let (publisher, rx) = Publisher::new(events, metrics);
        let leading_in = |transitions| Snapshot {
            term: Some(TermId::new(Some("uid"), transitions)),
            ..snapshot(true, Some("me"))
        };
        publisher.publish(&leading_in(1));
        assert_eq!(rx.borrow().last_term, None);
        publisher.publish(&snapshot(false, None));
        assert_eq!(rx.borrow().last_term.as_deref(), Some("uid/1"));
        publisher.publish(&leading_in(2));
        assert_eq!(rx.borrow().last_term.as_deref(), Some("uid/1"));
        // A term that follows another at once ends the first as well.
        publisher.publish(&leading_in(3));
        assert_eq!(rx.borrow().last_term.as_deref(), Some("uid/2"));
    }

    fn app(identity: &str) -> AppState {
        let (_, state) = watch::channel(LeaderState {
            leading: false,
            holder: None,
            term: None,
            since_micros: 0,
            valid_until: None,
            seq: 0,
            last_stop: None,
            last_term: None,
            observed: false,
            collector_healthy: None,
            successor: None,
            own_record: false,
        });
        AppState {
            state,
            identity: identity.into(),
            namespace: "ns \"quoted\"".into(),
            lease_name: "demo".into(),
            heartbeat: Heartbeat::new(),
            stuck_after: Duration::from_secs(15),
            events: EventLog::new(identity, LeaseLabel::alone("ns", "demo"), 4, 4),
            metrics: Arc::new(Metrics::new("ns", "demo")),
            subscribers: Arc::new(Semaphore::new(1)),
            keep_alive: Duration::from_secs(15),
            shutdown: CancellationToken::new(),
            gate_acks: crate::serve::gate_acks::GateAcks::new(8),
            gate_lag: Duration::from_secs(4),
            step_aside: Default::default(),
        }
    }

    #[test]
    fn the_written_body_is_the_serialized_value_byte_for_byte() {
        let states = [
            LeaderState {
                leading: true,
                holder: Some("me".into()),
                term: Some("uid/1".into()),
                since_micros: 1_795_979_297_250_658,
                valid_until: Some(BootInstant::after(Duration::from_secs(3600))),
                seq: 7,
                last_stop: Some("shutdown"),
                last_term: None,
                observed: true,
                collector_healthy: Some(true),
                successor: None,
                own_record: false,
            },
            LeaderState {
                leading: false,
                holder: Some("other\u{e9}\n\"pod\"".into()),
                term: Some("uid/1".into()),
                since_micros: 0,
                valid_until: None,
                seq: 0,
                last_stop: None,
                last_term: None,
                observed: false,
                collector_healthy: Some(false),
                successor: None,
                own_record: false,
            },
            // Published as leading, past its deadline: no term, not leading.
            LeaderState {
                leading: true,
                holder: Some("me".into()),
                term: Some("uid/2".into()),
                since_micros: 5,
                valid_until: Some(BootInstant::now()),
                seq: 3,
                last_stop: None,
                last_term: None,
                observed: true,
                collector_healthy: None,
                successor: None,
                own_record: false,
            },
        ];
        for identity in ["me", "a\\b\u{1}"] {
            let app = app(identity);
            for state in &states {
                let (leading, value) = leader_body(&app, state);
                let mut out = Vec::new();
                assert_eq!(write_leader_body(&app, state, None, &mut out), leading);
                // The valid_for_ms may differ by the time between the two.
                let mut expected = value.clone();
                let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
                expected["valid_for_ms"] = written["valid_for_ms"].clone();
                assert_eq!(String::from_utf8(out).unwrap(), expected.to_string());

                let mut with_extras = expected.clone();
                with_extras["may_have_missed_events"] = true.into();
                with_extras["published_at_us"] = 1_795_979_297_250_658_i64.into();
                let mut out = Vec::new();
                write_leader_body(&app, state, Some((true, 1_795_979_297_250_658)), &mut out);
                let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
                with_extras["valid_for_ms"] = written["valid_for_ms"].clone();
                // A state event also carries the deadline on the boot clock.
                with_extras["valid_until"] = if leading {
                    serde_json::json!({
                        "boot_id": crate::clock::boot_clock_id().unwrap(),
                        "boottime_ms": state.valid_until.unwrap().as_millis(),
                    })
                } else {
                    serde_json::Value::Null
                };
                assert_eq!(String::from_utf8(out).unwrap(), with_extras.to_string());
            }
        }
    }
}
