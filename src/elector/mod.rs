//! The elector: contends for the Lease and decides, alone, whether this
//! instance leads.
//!
//! - [`machine`]: the pure state machine — inputs and an `Instant` in,
//!   actions out; the guarantees G1–G7 live here.
//! - [`driver`]: the one task that owns the Lease and runs the machine.
//! - [`lease`]: the Lease object as read and written (whole objects, the
//!   release mark).
//! - [`lease_client`]: the adapter that talks to the API server (kube-rs).
//! - [`api_error`]: classification of API server responses; 403 explained.
//! - [`handover`]: `leader-gate handover`, the operator's hand-over request.
//! - [`incarnation`]: the state directory's record of our last stored
//!   write, with which a restarted sidecar resumes its own term.
//!
//! The elector names nothing of the serving side. What it offers is
//! [`driver::run`], which reports every [`machine::Snapshot`] and request
//! through a [`driver::Outlet`] and beats a [`driver::Heartbeat`]; the serving
//! side implements the one and reads the other (and uses the kube-rs client
//! of [`lease_client`] for Kubernetes Events).

pub mod api_error;
pub mod driver;
pub mod handover;
pub mod incarnation;
pub mod lease;
pub mod lease_client;
pub mod machine;
