//! leader-gate keeps one pod of a group "the leader" through a Kubernetes
//! `coordination.k8s.io/v1` Lease and tells the collector next to it, over
//! plain HTTP, whether it may do cluster-wide work right now.
//!
//! Three sides, one folder each: [`elector`] (the state machine, the driver
//! and the Lease protocol), [`serve`] (`leader-gate serve`: what the sidecar
//! publishes over HTTP) and [`client`] (the commands that ask a sidecar over
//! HTTP). [`config`], [`duration`] and [`exit`] are the binary's glue; [`clock`] and
//! [`backoff`] are shared by all three sides.
//!
//! The serving side reads the elector through [`elector::driver::Outlet`] and
//! [`elector::driver::Heartbeat`]; the elector names nothing of the other
//! sides, and the clients know a sidecar only over HTTP.

pub mod backoff;
pub mod client;
pub mod clock;
pub mod config;
pub mod duration;
pub mod elector;
pub mod exit;
pub mod serve;
