//! The published leadership state: the one snapshot that readers (`/leader`,
//! the event stream) answer from, and the election task's heartbeat.
//!
//! Only the election driver publishes. The machine fixes each deadline on
//! the boot clock when its renew is sent, so a reader decides at read time
//! whether a "leading" snapshot is still valid, suspend included (G2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::clock::{BootInstant, format_micro_time, wall_micros};
use crate::elector::machine::Snapshot;
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
    /// The API server answered at least once.
    pub observed: bool,
    /// Whether the collector passes its health check; `None` without one.
    pub collector_healthy: Option<bool>,
}

impl LeaderState {
    fn initial() -> Self {
        Self {
            leading: false,
            holder: None,
            term: None,
            since_micros: wall_micros(),
            valid_until: None,
            seq: 0,
            last_stop: None,
            observed: false,
            collector_healthy: None,
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
    pub collector_healthy: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct LeaseRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The election's side of the published state: the snapshot for readers,
/// and one event per transition for subscribers.
pub struct Publisher {
    tx: watch::Sender<LeaderState>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    /// Kubernetes Events for this instance's starts and stops, if recorded.
    recorder: Option<Recorder>,
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
        };
        (publisher, rx)
    }

    /// Also records each start and stop of this instance as a Kubernetes
    /// Event (queued: publishing never waits for the API server).
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Publishes `snapshot` if anything a reader sees changed, with an event
    /// for each transition (stopped before new-leader before started).
    pub fn publish(&self, snapshot: &Snapshot) {
        self.tx.send_if_modified(|state| {
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
                observed: snapshot.observed,
                collector_healthy: snapshot.collector_healthy,
            };
            let changed = *state != next;
            if changed {
                *state = next;
            }
            changed
        });
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

pub fn since_text(state: &LeaderState) -> String {
    format_micro_time(state.since_micros)
}

/// Liveness of the election task: it beats on every turn of its loop (at
/// least once per retry period) and flags its own end.
#[derive(Debug, Default)]
pub struct Heartbeat {
    last_beat_ms: AtomicU64,
    ended: AtomicBool,
}

impl Heartbeat {
    pub fn new() -> Arc<Self> {
        let heartbeat = Arc::new(Self::default());
        heartbeat.beat();
        heartbeat
    }

    pub fn beat(&self) {
        self.last_beat_ms
            .store(BootInstant::now().as_millis(), Ordering::Relaxed);
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Alive: not ended, and beat within `max_silence`.
    pub fn is_alive(&self, max_silence: Duration) -> bool {
        let silence = BootInstant::now()
            .as_millis()
            .saturating_sub(self.last_beat_ms.load(Ordering::Relaxed));
        !self.ended.load(Ordering::Relaxed) && silence <= max_silence.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn a_record_naming_us_while_we_do_not_lead_is_announced() {
        let events = EventLog::new("me", 8, 8);
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
}
