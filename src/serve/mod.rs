//! The serving side: `leader-gate serve` and what it publishes.
//!
//! The process and its Leases:
//! - [`config`]: `serve`'s flags, validated into a [`config::ServeConfig`].
//! - [`sidecar`]: `serve` as one function — listeners, the Leases, servers,
//!   the shutdown sequence and its signals.
//! - [`lease_stack`]: one Lease of the sidecar — its driver, published
//!   state, gates, health check, Events and routing; [`spreading`]: tells
//!   each of several Leases what the process holds of the others.
//!
//! State and wire formats (they import no route):
//! - [`published`]: the one published leadership state — the driver's
//!   [`published::Publisher`] (its `Outlet`) writes it.
//! - [`app_state`]: what the handlers share ([`app_state::AppState`]): the
//!   published state, this instance's names, the event log, the gates.
//! - [`leader_body`]: the `/leader` JSON body, judged from the state at read
//!   time, and the pieces the event stream's events share with it.
//! - [`transitions`]: the log of leadership transitions (ids, history,
//!   fan-out) and the events' JSON.
//! - [`gate_acks`]: the gates registered for a term, and their
//!   acknowledgements that it ended for them (an early release);
//!   [`gate_channel`]: who may register and acknowledge (loopback, or the
//!   pod-local gate socket).
//! - [`guards`]: request guards the routes share — another Lease's
//!   `?lease=` (404), a request from outside the gate channel (403), query
//!   values.
//! - [`step_aside`]: how often step-down requests make this pod stand
//!   aside (once per two lease durations), bounding what they cost a group.
//! - [`metrics`]: Prometheus metrics; [`exposition`]: OpenMetrics or classic
//!   text, by the scraper's `Accept`.
//!
//! The routes (each imports the rooms above, none another route):
//! - [`leader_route`]: `GET|HEAD /leader`, `/leader/{lease}`.
//! - [`sse_route`]: `GET /events`, the transition log as server-sent events.
//! - [`ack_route`]: `POST /gates/{gate}/closed`, a gate's acknowledgement.
//! - [`step_down`]: `POST /handover`, this pod asking its sidecar to hand
//!   the Lease over before its containers are stopped.
//! - [`admin_routes`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`routes`]: the routers, composing the routes — one Lease's, and
//!   several Leases' from those; [`server`]: the HTTP server and its limits
//!   against abusive clients.
//!
//! Beside the election:
//! - [`kube_events`]: Kubernetes Events about the Lease (`--record-events`).
//! - [`routing`]: the EndpointSlice that routes a Service to the leader
//!   (`--route-service`).
//! - [`collector_health`]: the collector's health check, feeding
//!   [`collector_policy`]: what its results mean for holding and contending
//!   for the Lease.

pub mod ack_route;
pub mod admin_routes;
pub mod app_state;
pub mod collector_health;
pub mod collector_policy;
pub mod config;
pub mod exposition;
pub mod gate_acks;
pub mod gate_channel;
pub mod guards;
pub mod kube_events;
pub mod leader_body;
pub mod leader_route;
pub mod lease_stack;
pub mod metrics;
pub mod published;
pub mod routes;
pub mod routing;
pub mod server;
pub mod sidecar;
pub mod spreading;
pub mod sse_route;
pub mod step_aside;
pub mod step_down;
pub mod transitions;
