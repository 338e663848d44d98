//! leader-gate keeps one pod of a group "the leader" through a Kubernetes
//! `coordination.k8s.io/v1` Lease and tells the collector next to it, over
//! plain HTTP, whether it may do cluster-wide work right now.
//!
//! Three sides, one folder each: [`elector`] (the state machine, the driver
//! and the Lease protocol), [`serve`] (`leader-gate serve`: what the sidecar
//! publishes over HTTP) and [`client`] (the commands that ask a sidecar over
//! HTTP). Each side owns its flags: `serve`'s in [`serve::config`], each
//! client's next to it, `handover`'s in [`elector::handover`]; [`cli`]
//! composes them into the one command line. [`args`] (what several sides'
//! flags share: Kubernetes names, the namespace, a bad flag's error, the
//! log format),
//! [`duration`], [`exit`], [`clock`], [`backoff`] and [`timing`] (the rules
//! that tie a pod's containers' timings together) are shared by all three
//! sides and import nothing of them.
//!
//! The serving side reads the elector through [`elector::driver::Outlet`] and
//! [`elector::driver::Heartbeat`]; the elector names nothing of the other
//! sides, and the clients know a sidecar only over HTTP.
//!
//! [`inject`] (`leader-gate inject`, and `--check`) works on manifests, not
//! on a running pod: a side above the others, it reads their flag
//! definitions and validation to write and to check gated pods, and only
//! [`cli`] names it.

pub mod args;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod clock;
pub mod duration;
pub mod elector;
pub mod exit;
pub mod inject;
pub mod serve;
pub mod timing;
