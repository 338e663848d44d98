//! The serving side: `leader-gate serve` and what it publishes.
//!
//! - [`config`]: `serve`'s flags, validated into a [`config::ServeConfig`].
//! - [`sidecar`]: `serve` as one function — listeners, the Leases, servers,
//!   the shutdown sequence and its signals.
//! - [`lease_stack`]: one Lease of the sidecar — its driver, published
//!   state, gates, health check, Events and routing; [`spreading`]: tells
//!   each of several Leases what the process holds of the others.
//! - [`published`]: the one published leadership state — the driver's
//!   [`published::Publisher`] writes it, the handlers read it through
//!   [`published::AppState`], and the `/leader` body is judged from it.
//! - [`transitions`]: the log of leadership transitions (ids, history, fan-out).
//! - [`sse_route`]: `GET /events`, the transition log as server-sent events.
//! - [`gate_acks`]: the gates registered for a term, and their
//!   acknowledgements that it ended for them (an early release);
//!   [`gate_channel`]: who may register and acknowledge (loopback, or the
//!   pod-local gate socket).
//! - [`step_down`]: `POST /handover`, this pod asking its sidecar to hand
//!   the Lease over before its containers are stopped.
//! - [`kube_events`]: Kubernetes Events about the Lease (`--record-events`).
//! - [`routing`]: the EndpointSlice that routes a Service to the leader
//!   (`--route-service`).
//! - [`metrics`]: Prometheus metrics for `/metrics`; [`exposition`]:
//!   OpenMetrics or classic text, by the scraper's `Accept`.
//! - [`routes`]: the routers; [`server`]: the HTTP server and its limits
//!   against abusive clients.
//! - [`collector_health`]: the collector's health check; [`collector_policy`]:
//!   what its results mean for holding and contending for the Lease.

pub mod collector_health;
pub mod collector_policy;
pub mod config;
pub mod exposition;
pub mod gate_acks;
pub mod gate_channel;
pub mod kube_events;
pub mod lease_stack;
pub mod metrics;
pub mod published;
pub mod routes;
pub mod routing;
pub mod server;
pub mod sidecar;
pub mod spreading;
pub mod sse_route;
pub mod step_down;
pub mod transitions;
