//! Test support shared by the integration tests: a fake Kubernetes Lease API
//! server and helpers that run real `leader-gate` processes against it.
#![allow(dead_code)]

pub mod events;
pub mod fake_apiserver;
pub mod monitor;
pub mod proxy;
pub mod sidecar;
