//! The routes of a sidecar elected for several Leases, composed of the
//! one-Lease routes: each Lease keeps the router of a Lease alone
//! ([`crate::serve::routes::lease_gate_router`]), reached by name —
//! `/leader/{lease}` for its `/leader`, `?lease=NAME` for its `/events`,
//! gate acknowledgements and `/handover` — and the process answers for all
//! of them: `/leader` and `/leases` (what this pod holds, each Lease's body
//! written by [`crate::serve::leader_body`]), `/healthz` and `/readyz` (each
//! Lease's handler, every one must pass) and `/metrics` (one registry for
//! all, each Lease's gauge refreshed).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use tower::ServiceExt;

use crate::serve::admin_routes::{healthz, metrics, readyz, refresh_leading};
use crate::serve::app_state::AppState;
use crate::serve::leader_body::{json_str, write_leader_body};
use crate::serve::leader_route::leader_response;

/// Each Lease's own routes, by name, in the order of the Leases.
struct Group {
    apps: Vec<Arc<AppState>>,
    routers: Vec<Router>,
}

impl Group {
    fn new(routers: Vec<Router>, apps: &[AppState]) -> Arc<Self> {
        Arc::new(Self {
            apps: apps.iter().cloned().map(Arc::new).collect(),
            routers,
        })
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.apps.iter().map(|a| &*a.lease_name).collect();
        names.join(", ")
    }

    /// `request`, sent to the routes of Lease `name` at `path` (its query kept).
    async fn forward(&self, name: Option<&str>, path: &str, request: Request) -> Response {
        let Some(name) = name else {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!(
                    "this sidecar contends for several Leases: name one with ?lease=NAME ({})\n",
                    self.names()
                ),
            );
        };
        let Some(i) = self.apps.iter().position(|a| &*a.lease_name == name) else {
            return refuse(
                StatusCode::NOT_FOUND,
                format!(
                    "no Lease {name:?} here: this sidecar contends for {}\n",
                    self.names()
                ),
            );
        };
        let (mut parts, body) = request.into_parts();
        let path_and_query = match parts.uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path.to_owned(),
        };
        parts.uri = Uri::try_from(path_and_query).unwrap_or_else(|_| Uri::from_static("/"));
        let request = Request::from_parts(parts, body);
        match self.routers[i].clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

fn refuse(status: StatusCode, text: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
}

/// The `lease` of a query string (names are DNS-1123: nothing to decode).
fn lease_param(uri: &Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("lease="))
        .map(str::to_owned)
}

/// The gate listener: `/leader`, `/leases`, `/leader/{lease}`, and each
/// Lease's `/events`, `/gates/{gate}/closed` and `/handover` by `?lease=`.
pub(super) fn gate_router(routers: Vec<Router>, apps: &[AppState]) -> Router {
    Router::new()
        .route("/leader", get(holdings))
        .route("/leases", get(leases))
        .route("/leader/{lease}", get(lease_leader))
        .route("/events", get(by_query))
        .route("/gates/{gate}/closed", any(by_query))
        .route("/handover", any(by_query))
        .with_state(Group::new(routers, apps))
}

/// The admin listener: `/leader`, `/leases`, `/leader/{lease}`, and
/// `/healthz`, `/readyz`, `/metrics` for every Lease.
pub(super) fn admin_router(routers: Vec<Router>, apps: &[AppState]) -> Router {
    Router::new()
        .route("/leader", get(holdings))
        .route("/leases", get(leases))
        .route("/leader/{lease}", get(lease_leader))
        .route("/healthz", get(all_healthy))
        .route("/readyz", get(all_ready))
        .route("/metrics", get(all_metrics))
        .with_state(Group::new(routers, apps))
}

async fn lease_leader(
    State(group): State<Arc<Group>>,
    Path(lease): Path<String>,
    request: Request,
) -> Response {
    group.forward(Some(&lease), "/leader", request).await
}

async fn by_query(State(group): State<Arc<Group>>, request: Request) -> Response {
    let lease = lease_param(request.uri());
    let path = request.uri().path().to_owned();
    group.forward(lease.as_deref(), &path, request).await
}

/// What this pod holds, and every Lease's `/leader` body:
/// `{"held":[names],"identity":…,"leading":any held,"leases":[bodies]}`;
/// whether it holds any.
fn write_holdings(group: &Group, out: &mut Vec<u8>) -> bool {
    let mut bodies = Vec::with_capacity(320 * group.apps.len());
    let mut held = Vec::new();
    for (i, app) in group.apps.iter().enumerate() {
        if i > 0 {
            bodies.push(b',');
        }
        if write_leader_body(app, &app.state.borrow(), None, &mut bodies) {
            held.push(&*app.lease_name);
        }
    }
    out.extend_from_slice(b"{\"held\":[");
    for (i, name) in held.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_str(out, Some(name));
    }
    out.extend_from_slice(b"],\"identity\":");
    json_str(out, group.apps.first().map(|a| &*a.identity));
    out.extend_from_slice(if held.is_empty() {
        b",\"leading\":false"
    } else {
        b",\"leading\":true"
    });
    out.extend_from_slice(b",\"leases\":[");
    out.extend_from_slice(&bodies);
    out.extend_from_slice(b"]}");
    !held.is_empty()
}

/// `/leader` with several Leases: 200 while this pod leads at least one.
async fn holdings(State(group): State<Arc<Group>>) -> Response {
    let mut body = Vec::new();
    let leading = write_holdings(&group, &mut body);
    leader_response(leading, body)
}

/// `/leases`: the same list, always 200.
async fn leases(State(group): State<Arc<Group>>) -> Response {
    let mut body = Vec::new();
    write_holdings(&group, &mut body);
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Live while every Lease's election is: one stuck election fails it.
async fn all_healthy(State(group): State<Arc<Group>>) -> Response {
    for app in &group.apps {
        let (status, text) = healthz(State(app.clone())).await;
        if status != StatusCode::OK {
            return refuse(status, format!("{}: {text}", app.lease_name));
        }
    }
    (StatusCode::OK, "ok\n").into_response()
}

/// Ready once the API server answered for every Lease.
async fn all_ready(State(group): State<Arc<Group>>) -> Response {
    for app in &group.apps {
        let (status, text) = readyz(State(app.clone())).await;
        if status != StatusCode::OK {
            return refuse(status, format!("{}: {text}", app.lease_name));
        }
    }
    (StatusCode::OK, "ready\n").into_response()
}

/// Every Lease's metrics, in one exposition: the Leases share one registry,
/// each series labelled by its Lease.
async fn all_metrics(State(group): State<Arc<Group>>, headers: HeaderMap) -> Response {
    for app in &group.apps[1..] {
        refresh_leading(app);
    }
    let first = group.apps[0].clone();
    metrics(State(first), headers).await
}
