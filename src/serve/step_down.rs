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
//! [`Input::StepAside`]: crate::elector::machine::Input::StepAside

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::serve::app_state::AppState;
use crate::serve::gate_channel::GateChannel;
use crate::serve::guards::not_this_pods_for_this_lease;
use crate::serve::server::Peer;

/// The handler of `POST /handover[?lease=NAME]`: 202 while leading (the
/// step-down was asked for), 200 otherwise (nothing to hand over; this pod
/// stands aside all the same), 403 from outside the gate channel, 404 for
/// another Lease.
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
    app.step_aside.notify_one();
    let text = if leading {
        tracing::info!("this pod asked to hand the lease over");
        (
            StatusCode::ACCEPTED,
            "stepping down: a peer takes over once the gates closed; follow /leader\n",
        )
    } else {
        (
            StatusCode::OK,
            "not leading: nothing to hand over; standing aside for a lease duration\n",
        )
    };
    (
        text.0,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text.1,
    )
        .into_response()
}
