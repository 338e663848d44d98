//! The leadership event log: every transition, in order, with an id that is
//! unique across restarts (`<boot id>-<seq>`), kept in a bounded history for
//! resumption and fanned out to subscribers through a bounded broadcast.
//!
//! Publishing never waits for a subscriber: a subscriber that falls more than
//! the broadcast buffer behind is told so ([`Next::Lagged`]) and starts again
//! from a fresh state. The history and the broadcast change under one lock,
//! so a resuming subscriber sees every event exactly once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::clock::{format_micro_time, wall_micros};

/// The kinds of transitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    StartedLeading,
    StoppedLeading,
    NewLeader,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StartedLeading => "started-leading",
            Self::StoppedLeading => "stopped-leading",
            Self::NewLeader => "new-leader",
        }
    }
}

/// One published transition.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// `<boot id>-<seq>`: the SSE `id:`.
    pub id: String,
    #[serde(skip)]
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// This instance's identity.
    pub identity: String,
    /// The term that started or stopped (`started-`/`stopped-leading`).
    pub term: Option<String>,
    /// Why the term stopped (`stopped-leading`).
    pub reason: Option<&'static str>,
    /// The observed holder after the transition (`new-leader`; `null` when
    /// no live holder is observed).
    pub holder: Option<String>,
    /// Wall-clock publication time, microseconds since the epoch.
    pub published_at_us: i64,
    /// The same, as RFC 3339.
    pub published_at: String,
    /// The Lease it happened to.
    pub lease: LeaseLabel,
}

/// The Lease an event or a `/leader` body speaks for, and its place among
/// the sidecar's Leases (`--lease-name a,b` or `--shards`, from 0): the
/// shard a gated collector takes (0 of 1 for a Lease alone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseLabel {
    pub name: String,
    pub namespace: String,
    pub shard: usize,
    pub shards: usize,
}

impl LeaseLabel {
    /// The only Lease of its sidecar.
    pub fn alone(namespace: &str, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            shard: 0,
            shards: 1,
        }
    }
}

/// What a new transition says, before it gets an id and a time.
#[derive(Clone, Debug)]
pub struct Transition {
    pub kind: EventKind,
    pub term: Option<String>,
    pub reason: Option<&'static str>,
    pub holder: Option<String>,
}

/// Where a new subscriber starts.
pub enum Start {
    /// Replay these missed events, then go live.
    Resume(Vec<Arc<Event>>),
    /// Begin with a fresh state: no id was given (`missed: false`), or it is
    /// unknown or too old (`missed: true`).
    Fresh { missed: bool },
}

/// A subscriber's live feed and position.
pub struct Subscription {
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The seq of the last event the subscriber has (or is about to replay).
    pub last_seq: u64,
}

/// What the live feed yields next.
pub enum Next {
    Event(Arc<Event>),
    /// Fell behind the buffer by this many events; resume from a fresh state.
    Lagged(u64),
    /// The log is gone (shutdown).
    Closed,
}

/// The event log of one process.
pub struct EventLog {
    boot_id: String,
    identity: String,
    lease: LeaseLabel,
    history_len: usize,
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
}

struct Inner {
    history: VecDeque<Arc<Event>>,
    last_seq: u64,
}

// === impl EventLog ===

impl EventLog {
    /// A log keeping `history_len` events for resumption; each subscriber
    /// may fall `buffer` events behind before it is told it lagged.
    pub fn new(identity: &str, lease: LeaseLabel, history_len: usize, buffer: usize) -> Arc<Self> {
        Arc::new(Self {
            boot_id: format!("{:016x}", fastrand::u64(..)),
            identity: identity.to_owned(),
            lease,
            history_len: history_len.max(1),
            inner: Mutex::new(Inner {
                history: VecDeque::new(),
                last_seq: 0,
            }),
            tx: broadcast::channel(buffer.max(1)).0,
        })
    }

    /// The Lease this log is of.
    pub fn lease(&self) -> &LeaseLabel {
        &self.lease
    }

    /// The id of the event with `seq` (also of a `state` as of that seq).
    pub fn id_of(&self, seq: u64) -> String {
        format!("{}-{seq}", self.boot_id)
    }

    pub fn last_seq(&self) -> u64 {
        self.inner.lock().expect("event log lock").last_seq
    }

    /// Appends a transition and hands it to every subscriber; never blocks.
    pub fn publish(&self, transition: Transition) -> Arc<Event> {
        let mut inner = self.inner.lock().expect("event log lock");
        inner.last_seq += 1;
        let published_at_us = wall_micros();
        let event = Arc::new(Event {
            id: self.id_of(inner.last_seq),
            seq: inner.last_seq,
            kind: transition.kind,
            identity: self.identity.clone(),
            term: transition.term,
            reason: transition.reason,
            holder: transition.holder,
            published_at_us,
            published_at: format_micro_time(published_at_us),
            lease: self.lease.clone(),
        });
        if inner.history.len() == self.history_len {
            inner.history.pop_front();
        }
        inner.history.push_back(event.clone());
        // No receivers is fine: nobody listens yet.
        let _ = self.tx.send(event.clone());
        event
    }

    /// Subscribes after the event `last_event_id`, if given.
    pub fn subscribe(&self, last_event_id: Option<&str>) -> (Start, Subscription) {
        let inner = self.inner.lock().expect("event log lock");
        let subscription = Subscription {
            live: self.tx.subscribe(),
            last_seq: inner.last_seq,
        };
        let start = match last_event_id.map(|id| self.seq_of(id)) {
            None => Start::Fresh { missed: false },
            // Resumable if we still hold every event after it.
            Some(Some(seq))
                if seq <= inner.last_seq
                    && seq + 1 >= inner.history.front().map_or(inner.last_seq + 1, |e| e.seq) =>
            {
                Start::Resume(
                    inner
                        .history
                        .iter()
                        .filter(|e| e.seq > seq)
                        .cloned()
                        .collect(),
                )
            }
            Some(_) => Start::Fresh { missed: true },
        };
        (start, subscription)
    }

    /// After a lag: a fresh live feed from the present, taken under the lock
    /// so no event falls between the old position and the new one.
    pub fn resync(&self, subscription: &mut Subscription) {
        let inner = self.inner.lock().expect("event log lock");
        subscription.live = self.tx.subscribe();
        subscription.last_seq = inner.last_seq;
    }

    fn seq_of(&self, id: &str) -> Option<u64> {
        let (boot, seq) = id.rsplit_once('-')?;
        (boot == self.boot_id).then(|| seq.parse().ok()).flatten()
    }
}

// === impl Subscription ===

impl Subscription {
    /// The next live event after what the subscriber already has.
    pub async fn next(&mut self) -> Next {
        loop {
            match self.live.recv().await {
                Ok(event) if event.seq <= self.last_seq => continue,
                Ok(event) => {
                    self.last_seq = event.seq;
                    return Next::Event(event);
                }
                Err(broadcast::error::RecvError::Lagged(n)) => return Next::Lagged(n),
                Err(broadcast::error::RecvError::Closed) => return Next::Closed,
            }
        }
    }

    /// A live event already waiting, without waiting for one.
    pub fn try_next(&mut self) -> Option<Next> {
        loop {
            match self.live.try_recv() {
                Ok(event) if event.seq <= self.last_seq => continue,
                Ok(event) => {
                    self.last_seq = event.seq;
                    return Some(Next::Event(event));
                }
                Err(broadcast::error::TryRecvError::Lagged(n)) => return Some(Next::Lagged(n)),
                Err(broadcast::error::TryRecvError::Closed) => return Some(Next::Closed),
                Err(broadcast::error::TryRecvError::Empty) => return None,
            }
        }
    }

    /// Skips live events up to `seq`, which a `state` already reflects.
    pub fn skip_to(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }
}

/// The `data:` of an event, as JSON.
pub fn event_json(event: &Event) -> Value {
    serde_json::to_value(event).expect("events serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(term: &str) -> Transition {
        Transition {
            kind: EventKind::StoppedLeading,
            term: Some(term.into()),
            reason: Some("shutdown"),
            holder: None,
        }
    }

    #[tokio::test]
    async fn a_known_id_replays_exactly_the_missed_events_then_goes_live() {
        let log = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 16, 16);
        let first = log.publish(stop("t1"));
        log.publish(stop("t2"));
        log.publish(stop("t3"));
        let (start, mut sub) = log.subscribe(Some(&first.id));
        let Start::Resume(missed) = &start else {
            panic!("resumes")
        };
        let terms: Vec<_> = missed.iter().map(|e| e.term.clone().unwrap()).collect();
        assert_eq!(terms, ["t2", "t3"]);
        log.publish(stop("t4"));
        let Next::Event(live) = sub.next().await else {
            panic!()
        };
        assert_eq!(
            live.term.as_deref(),
            Some("t4"),
            "no replayed event twice, none lost"
        );
    }

    #[tokio::test]
    async fn unknown_old_or_foreign_ids_start_fresh_and_say_events_may_be_missed() {
        let log = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 2, 16);
        let first = log.publish(stop("t1"));
        let second = log.publish(stop("t2"));
        log.publish(stop("t3"));
        log.publish(stop("t4"));
        // t3 and t4 are kept: after t2 nothing is missing, after t1 t2 is.
        assert!(matches!(log.subscribe(Some(&second.id)).0, Start::Resume(ref v) if v.len() == 2));
        for id in [first.id.as_str(), "bogus", "deadbeef-2", &log.id_of(99)] {
            let (start, _) = log.subscribe(Some(id));
            assert!(matches!(start, Start::Fresh { missed: true }), "{id}");
        }
        assert!(matches!(
            log.subscribe(None).0,
            Start::Fresh { missed: false }
        ));
        // The newest id is resumable: nothing missed.
        let latest = log.id_of(log.last_seq());
        assert!(matches!(log.subscribe(Some(&latest)).0, Start::Resume(ref v) if v.is_empty()));
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_and_publishing_never_waits() {
        let log = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 8, 4);
        let (_, mut slow) = log.subscribe(None);
        for i in 0..100 {
            log.publish(stop(&format!("t{i}")));
        }
        let Next::Lagged(n) = slow.next().await else {
            panic!("told it lagged")
        };
        assert!(n >= 90);
        log.resync(&mut slow);
        log.publish(stop("after"));
        let Next::Event(e) = slow.next().await else {
            panic!()
        };
        assert_eq!(e.term.as_deref(), Some("after"));
    }

    #[test]
    fn ids_are_unique_across_restarts() {
        let a = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 4, 4);
        let b = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 4, 4);
        assert_ne!(a.publish(stop("t")).id, b.publish(stop("t")).id);
    }
}
