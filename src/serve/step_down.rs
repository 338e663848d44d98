//! `POST /handover`: this pod asks its own sidecar to hand the Lease over
//! before its containers are stopped (`leader-gate prestop`, run by the
//! collector container's `preStop` hook, and `exec` once its tree is gone
//! after a SIGTERM).
//!
//! Why a request from the pod, and not the sidecar watching its own Pod for
//! a `deletionTimestamp`: the kubelet runs a container's `preStop` hook
//! *before* it sends that container SIGTERM, and waits for it (bounded by
//! the pod's grace period). A hook that asks for the hand-over and waits
//! for a peer to hold the Lease is therefore the one point where the
//! collector still runs, nobody has told it to stop, and the pod's
//! deletion is certain. A watch of the Pod would cost a `get`/`watch` on
//! pods in every sidecar's RBAC and one more watch per pod on the API
//! server, and would still need a hook on the collector to hold its SIGTERM
//! back.
//!
//! What it does: the election is fed [`Input::StepAside`] through its driver
//! (never a write of the `leader-gate.dev/handover-to` annotation: the
//! driver owns the Lease). A leader steps down with the reason
//! `handover-requested`, its gates close (their lag, or their
//! acknowledgements), and it releases with the mark, naming the successor
//! the Lease already names, as `leader-gate handover` would have it do. Then
//! — leader or follower — it stands aside for one lease duration: no
//! acquisition, no claim of the successor slot, so a peer takes over and
//! this pod, which is going away, does not take the Lease back. After that
//! it contends again (G1): a collector restarted in place (the kubelet runs
//! `preStop` before a liveness restart too) must not leave its pod out of
//! the election for good.
//!
//! The answer comes at once — `202 Accepted` when this sidecar leads (the
//! hand-over is under way: follow `/leader` or `/events` to see it done),
//! `200` when it does not (nothing to hand over) — so that a slow
//! hand-over never holds a connection; the client bounds its own wait.
//!
//! Accepted only from this pod, by the gate channel registrations and
//! acknowledgements use ([`crate::serve::gate_channel`]): the gate socket
//! when the sidecar has one, else a loopback address; never from the node's
//! network (`403`). A step-down takes this pod out of the election for a
//! lease duration: nobody else may ask for it.
//!
//! What requests may cost ([`crate::serve::step_aside`]): where the gate channel
//! is wider than the pod (a mesh, `hostNetwork` without a gate socket),
//! whatever it admits could ask every pod every second, and a stand-aside
//! renewed by each request kept the whole group leaderless for as long as
//! it went on. So a pod stands aside at most once per two lease durations:
//! a request while it stands aside does not extend it (`200`/`202`, "already
//! standing aside"), and one within a lease duration after that is refused
//! (`429`, `Retry-After`) — the pod leads or contends meanwhile. Every pod
//! therefore contends for at least one lease duration in every two, and a
//! group with a pod that can lead is without a leader for at most one lease
//! duration plus two retry periods at a time, whatever the rate of
//! requests (`handover_requests_to_every_pod_every_second_leave_the_group_leaderless_within_a_bound`).
//! A graceful hand-over asks once (`prestop`, then `exec`'s own request
//! after SIGTERM finds the pod already standing aside); a refused one still
//! has the sidecar's own release on SIGTERM (G6).
//!
//! [`Input::StepAside`]: crate::elector::machine::Input::StepAside

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::serve::app_state::AppState;
use crate::serve::gate_channel::GateChannel;
use crate::serve::guards::not_this_pods_for_this_lease;
use crate::serve::server::Peer;
use crate::serve::step_aside::Verdict;

/// The handler of `POST /handover[?lease=NAME]`: 202 while leading (the
/// step-down was asked for), 200 otherwise (nothing to hand over; this pod
/// stands aside all the same), 429 within a lease duration after a
/// stand-aside ended, 403 from outside the gate channel, 404 for another
/// Lease.
pub async fn handover(
    State(app): State<Arc<AppState>>,
    peer: Option<Extension<Peer>>,
    channel: Option<Extension<Arc<GateChannel>>>,
    uri: Uri,
) -> Response {
    if let Some(refusal) = not_this_pods_for_this_lease(
        &app,
        peer.as_ref(),
        channel.as_ref(),
        uri.query(),
        "step-down requests are taken",
    ) {
        return refusal;
    }
    let leading = app.state.borrow().leading_now();
    let text = |status: StatusCode, body: String| {
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            body,
        )
            .into_response()
    };
    match app.step_aside.ask(Instant::now()) {
        Verdict::StandAside if leading => {
            tracing::info!("this pod asked to hand the lease over");
            text(
                StatusCode::ACCEPTED,
                "stepping down: a peer takes over once the gates closed; follow /leader\n".into(),
            )
        }
        Verdict::StandAside => text(
            StatusCode::OK,
            "not leading: nothing to hand over; standing aside for a lease duration\n".into(),
        ),
        // Still to be handled by the election (asked a moment ago).
        Verdict::AlreadyAside { left } if leading => text(
            StatusCode::ACCEPTED,
            format!(
                "stepping down (already asked); standing aside {left:.0?} more, not extended\n"
            ),
        ),
        Verdict::AlreadyAside { left } => text(
            StatusCode::OK,
            format!("not leading: already standing aside, {left:.0?} more (not extended)\n"),
        ),
        Verdict::Refused { retry_after } => {
            let why = "step-down requests refused: this pod stood aside less than two lease durations ago and contends until then";
            if app.step_aside.first_refusal() {
                tracing::info!(retry_after = ?retry_after, "{why}");
            } else {
                tracing::debug!(retry_after = ?retry_after, "{why}");
            }
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            let mut response = text(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "not standing aside again yet: this pod stood aside less than two lease durations ago, \
                     and contends (or leads) for {retry_after:.0?} more, so that requests cannot keep the \
                     group leaderless; on SIGTERM it still hands over\n"
                ),
            );
            if let Ok(value) = seconds.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
    }
}
