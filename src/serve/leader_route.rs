//! `GET|HEAD /leader` of one Lease, and `/leader/{lease}` naming it: 200
//! while this instance leads at this very moment, 503 otherwise, with the
//! body of [`crate::serve::leader_body`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use crate::serve::app_state::AppState;
use crate::serve::guards::no_such_lease;
use crate::serve::leader_body::write_leader_body;

/// 200 when leading at this very moment, 503 otherwise (HEAD: same, no body).
/// The body is written straight from the published state (no JSON value in
/// between): this is the route a collector may poll in a tight loop.
pub async fn leader(State(app): State<Arc<AppState>>) -> Response {
    leader_now(&app)
}

/// `GET /leader`'s answer now: also the listener's shortcut (see
/// [`crate::serve::routes::shortcut`]).
pub fn leader_now(app: &AppState) -> Response {
    let mut body = Vec::with_capacity(512);
    let leading = write_leader_body(app, &app.state.borrow(), None, &mut body);
    leader_response(leading, body)
}

/// The answer of a `/leader`, one Lease's or several's: the JSON `body`,
/// with 200 when `leading`, 503 otherwise. Built as it is sent, one header
/// written once (a tuple's `into_response` sets the body's own content
/// type first and then replaces it).
pub fn leader_response(leading: bool, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    if !leading {
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `/leader/{lease}` beside a Lease alone: its `/leader` when named, so a
/// client may name the Lease it gates whatever the sidecar contends for.
pub async fn named_leader(State(app): State<Arc<AppState>>, Path(lease): Path<String>) -> Response {
    if lease == *app.lease_name {
        leader(State(app)).await
    } else {
        no_such_lease(&app, &lease)
    }
}
