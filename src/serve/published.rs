//! The published leadership state: the one snapshot that readers (`/leader`,
//! the event stream) answer from.
//!
//! Only the election driver publishes, through [`Publisher`], the serving
//! side's [`Outlet`]. The machine fixes each deadline on
//! the boot clock when its renew is sent, so a reader decides at read time
//! whether a "leading" snapshot is still valid, suspend included (G2).
//!
//! A lower room: it imports no route. The handlers read the state through
//! [`crate::serve::app_state::AppState`], and the `/leader` body judged from
//! it at read time is [`crate::serve::leader_body`]'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{BootInstant, wall_micros};
use crate::elector::api_error::ApiError;
use crate::elector::driver::Outlet;
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

    fn release_not_before(&self) -> Option<std::time::Instant> {
        self.gate_acks.as_ref()?.release_not_before()
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

    #[tokio::test]
    async fn the_release_waits_until_a_gate_acknowledged_the_term_that_ended() {
        use futures::FutureExt;

        use crate::elector::driver::Outlet;
        use crate::elector::lease::TermId;
        use crate::serve::gate_acks::{Ack, GateAcks};
        let events = EventLog::new("me", LeaseLabel::alone("ns", "l"), 8, 8);
        let metrics = Arc::new(Metrics::new("ns", "l"));
        let gate_acks = GateAcks::new(8);
        let (publisher, _rx) = Publisher::new(events, metrics);
        let publisher = publisher.with_gate_acks(gate_acks.clone());
        let _registration = gate_acks.register("exec-1", false).unwrap();
        publisher.publish(&Snapshot {
            term: Some(TermId::new(Some("uid"), 1)),
            ..snapshot(true, Some("me"))
        });
        publisher.publish(&snapshot(false, None));
        let mut closed = publisher.gates_closed();
        assert_eq!(gate_acks.acknowledge("exec-1", "uid/0"), Ack::OtherTerm);
        assert!(
            (&mut closed).now_or_never().is_none(),
            "another term's ack counted"
        );
        assert_eq!(publisher.gates_still_open(), ["exec-1"]);
        assert_eq!(gate_acks.acknowledge("exec-1", "uid/1"), Ack::Counted);
        tokio::time::timeout(Duration::from_secs(1), closed)
            .await
            .expect("the ended term's ack lets the release go");
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
}
