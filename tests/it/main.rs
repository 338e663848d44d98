//! The integration tests, one binary: one module per area, sharing `support`
//! (the fake API server, real `leader-gate` processes, a real Prometheus).
//! Run one area with `cargo test --test it chaos::`.

// Also included by path by benches/failover and examples/demo.rs.
#[path = "../support/mod.rs"]
mod support;

mod acknowledged;
mod apiserver_contract;
mod chaos;
mod chaos_several;
mod cli;
mod collector_health;
mod crash_loop;
mod election_scenarios;
mod event_scenarios;
mod event_stream;
mod exec_tree;
mod file_gate;
mod gate_socket;
mod gates;
mod half_close;
mod handover_requests;
mod http_abuse;
mod inject;
mod inject_check;
mod lease_protection;

mod logging;
mod monitoring_files;
mod outage;
mod prestop;
mod prometheus;
mod prometheus_gates;
mod rbac_and_events;
mod readme_commands;
mod resume;
mod routing;
mod safe_defaults;
mod several_leases;
mod successor;
