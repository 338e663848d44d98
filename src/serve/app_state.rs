//! What the HTTP handlers share ([`AppState`]): one Lease's published state,
//! this instance's names, the event log, metrics, the gates' registry, and
//! the election's step-aside signal.
//!
//! A lower room: every route reads it, and it imports no route.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::elector::driver::Heartbeat;
use crate::serve::gate_acks::GateAcks;
use crate::serve::metrics::Metrics;
use crate::serve::published::LeaderState;
use crate::serve::transitions::EventLog;

/// The `/events` slots of one process, over every Lease: `--max-subscribers`
/// in each of two pools. Plain readers take theirs from `reads`; a gate that
/// registers over the gate channel (`?gate=ID`) from `gates`. So nothing
/// that merely reads — under `hostNetwork`, any process of the node on the
/// loopback listener — can take the place of the pod's own `exec` or
/// `file-gate` and keep its collector from starting.
#[derive(Clone)]
pub struct StreamSlots {
    pub reads: Arc<Semaphore>,
    pub gates: Arc<Semaphore>,
}

impl StreamSlots {
    /// Two pools of `max` slots each.
    pub fn new(max: usize) -> Self {
        Self {
            reads: Arc::new(Semaphore::new(max)),
            gates: Arc::new(Semaphore::new(max)),
        }
    }
}

/// What the handlers read: one per Lease, behind one `Arc` per router.
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
    pub subscribers: StreamSlots,
    /// Interval of keep-alive comments on `/events`.
    pub keep_alive: Duration,
    /// Ends the event streams (the server's own graceful shutdown waits for them).
    pub shutdown: CancellationToken,
    /// Where `/events?gate=ID` registers and `POST /gates/ID/closed` acknowledges.
    pub gate_acks: Arc<GateAcks>,
    /// `--gate-lag`: what a gate that stops slower is warned of.
    pub gate_lag: Duration,
    /// Where `POST /handover` asks the election to step down and stand
    /// aside, at most once per two lease durations ([`crate::serve::step_down`]).
    pub step_aside: Arc<crate::serve::step_aside::StepAsideRequests>,
}
