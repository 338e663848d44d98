//! `POST /gates/{gate}/closed?term=TERM`: a gate acknowledges that a term
//! ended for it, so a graceful release may go out before the gate lag
//! ([`crate::serve::gate_acks`] keeps the registry and says what counts).

use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use crate::serve::app_state::AppState;
use crate::serve::gate_acks::Ack;
use crate::serve::gate_channel::GateChannel;
use crate::serve::guards::{not_this_pods_for_this_lease, query_param};
use crate::serve::server::Peer;

/// The handler of `POST /gates/{gate}/closed?term=TERM`: 204 when counted;
/// 409 for a term that is not the current or last one; 404 for a gate not
/// registered for it; 403 from anywhere but the gate channel (an
/// acknowledgement lets a peer start, so only the pod's own containers may
/// give one: [`crate::serve::gate_channel`]).
pub async fn closed(
    State(app): State<Arc<AppState>>,
    Path(gate): Path<String>,
    peer: Option<Extension<Peer>>,
    channel: Option<Extension<Arc<GateChannel>>>,
    uri: Uri,
) -> Response {
    if let Some(refusal) = not_this_pods_for_this_lease(
        &app,
        peer.as_ref(),
        channel.as_ref(),
        uri.query(),
        "acknowledgements are taken",
    ) {
        return refusal;
    }
    let Some(term) = query_param(uri.query(), "term") else {
        return (StatusCode::BAD_REQUEST, "missing ?term=TERM\n").into_response();
    };
    match app.gate_acks.acknowledge(&gate, &term) {
        Ack::Counted => {
            // The target the line had before the handler moved out of the
            // registry's module: `RUST_LOG` filters naming it still match.
            tracing::debug!(
                target: "leader_gate::serve::gate_acks",
                gate,
                term,
                "a gate acknowledged the end of its term"
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Ack::OtherTerm => (
            StatusCode::CONFLICT,
            format!("term {term:?} is neither the current nor the last term of this sidecar\n"),
        )
            .into_response(),
        Ack::UnknownGate => (
            StatusCode::NOT_FOUND,
            format!("no gate {gate:?} is registered for term {term:?}\n"),
        )
            .into_response(),
    }
}
