//! The admin routes of one Lease, for the kubelet and Prometheus:
//! `/healthz` (the election loop lives), `/readyz` (the API server
//! answered), `/metrics` (in the format the scraper asks for).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::serve::app_state::AppState;
use crate::serve::exposition::Format;

/// The metrics in the format the scraper asks for: OpenMetrics for
/// Prometheus, classic text 0.0.4 for `promtool` and most other scrapers.
pub async fn metrics(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // Several Accept headers mean the same as one joined by commas.
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let format = Format::negotiate((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    refresh_leading(&app);
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "Accept"),
        ],
        app.metrics.encode(format),
    )
        .into_response()
}

/// Liveness: fails only when the election task ended or is stuck.
pub async fn healthz(State(app): State<Arc<AppState>>) -> (StatusCode, &'static str) {
    if app.heartbeat.is_alive(app.stuck_after) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "election task is not running\n",
        )
    }
}

/// Readiness: the API server answered at least once.
pub async fn readyz(State(app): State<Arc<AppState>>) -> (StatusCode, &'static str) {
    if app.state.borrow().observed {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the API server\n",
        )
    }
}

/// Sets the leading gauge as `/leader` would answer now, not as last
/// published: a stuck election must not keep it at 1 past its deadline (G2).
pub fn refresh_leading(app: &AppState) {
    let state = app.state.borrow().clone();
    app.metrics
        .state(state.leading_now(), state.holder.is_some());
}
