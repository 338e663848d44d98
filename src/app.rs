//! What the HTTP handlers share: the published leadership state, this
//! instance's names, and the `/leader` body judged at read time — used by
//! `/leader` ([`crate::http`]) and the event stream's `state` events
//! ([`crate::event_stream`]) alike.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::events::EventLog;
use crate::metrics::Metrics;
use crate::state::{Heartbeat, LeaderBody, LeaderState, LeaseRef, since_text};

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
        },
        term: state.term.as_deref().filter(|_| leading),
        since: since_text(state),
        valid_for_ms: valid_for.as_millis() as u64,
        seq: state.seq,
        last_stop_reason: state.last_stop,
        collector_healthy: state.collector_healthy,
    };
    (
        leading,
        serde_json::to_value(body).expect("the body serializes"),
    )
}
