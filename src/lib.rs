//! leader-gate keeps one pod of a group "the leader" through a Kubernetes
//! `coordination.k8s.io/v1` Lease and tells the collector next to it, over
//! plain HTTP, whether it may do cluster-wide work right now.
//!
//! # Layout
//!
//! - [`config`]: the command line and its validation (bad input exits 64).
//! - [`election`]: the pure state machine — inputs and an `Instant` in,
//!   actions out; the guarantees G1–G7 live here.
//! - [`lease`]: the Lease object as read and written (whole objects, the
//!   release mark).
//! - [`api_error`]: classification of API server responses; 403 explained.
//! - [`lease_client`]: the adapter that talks to the API server (kube-rs).
//! - [`driver`]: the one task that owns the Lease and runs the machine.
//! - [`collector_health`]: the collector's health check, which gates contention.
//! - [`state`]: the published leadership snapshot and the task's heartbeat.
//! - [`events`]: the event log of transitions (ids, history, fan-out).
//! - [`recorder`]: Kubernetes Events about the Lease (`--record-events`),
//!   best-effort, from a bounded queue.
//! - [`app`]: what the handlers share — the published state, the `/leader` body.
//! - [`event_stream`]: `GET /events`, the log as server-sent events.
//! - [`metrics`]: Prometheus metrics for `/metrics`.
//! - [`exposition`]: OpenMetrics or classic text, by the scraper's `Accept`.
//! - [`http`]: the routers.
//! - [`server`]: the HTTP server and its limits against abusive clients.
//! - [`client`]: the client side — `watch`, `status`, `wait`, and the gates
//!   `exec` and `file-gate`, all on one consumer of `/events` that applies
//!   the validity rule.
//! - [`clock`]: boot clock for read-time validity, MicroTime formatting.
//! - [`backoff`]: exponential, capped, jittered backoff for retry loops.
//! - [`sidecar`]: `serve` as one function — listeners, driver, servers, the
//!   shutdown sequence and its signals.
//! - [`exit`]: the exit codes.
//! - [`handover`]: `leader-gate handover`, the operator's hand-over request.
//!
//! `src/main.rs` parses the command line and runs the sidecar or a client.

pub mod api_error;
pub mod app;
pub mod backoff;
pub mod client;
pub mod clock;
pub mod collector_health;
pub mod config;
pub mod driver;
pub mod election;
pub mod event_stream;
pub mod events;
pub mod exit;
pub mod exposition;
pub mod handover;
pub mod http;
pub mod lease;
pub mod lease_client;
pub mod metrics;
pub mod recorder;
pub mod server;
pub mod sidecar;
pub mod state;
