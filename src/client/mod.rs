//! The client side: subcommands that ask a sidecar's gate listener whether
//! this pod leads, for collectors that cannot ask themselves.
//!
//! - [`url`]: the flags every client takes (`--url`, `--lease`,
//!   `--log-format`: [`url::ClientArgs`]), and plain HTTP requests.
//! - [`sse_reader`]: the `text/event-stream` parser.
//! - [`feed`]: the one consumer of `/events` that applies the validity rule
//!   (leadership ends at *receive time + valid_for_ms* unless renewed, and at
//!   once on `stopped-leading`); every gate below is built on it.
//! - [`place`]: the Lease a client gates and its shard, as the gated
//!   collector gets them (environment, `${…}` substitution).
//! - [`watch`]: `leader-gate watch`, one line per event.
//! - [`status`]: `leader-gate status` and `leader-gate wait`.
//! - [`exec`]: `leader-gate exec -- COMMAND`, a child that runs only while leading.
//! - [`prestop`]: `leader-gate prestop`, a collector's `preStop` hook that
//!   hands the Lease over before the collector is stopped.
//! - [`process_tree`]: the process group, parent-death signal and reaping `exec` relies on.
//! - [`death_guard`]: a forked process that acts when its parent is killed
//!   (`exec`'s group, `file-gate`'s copies).
//! - [`file_gate`]: `leader-gate file-gate SRC:DST…`, files present only while leading.
//! - [`collector_status`]: `--stopped-when`, a collector's own status read as
//!   the proof that the gated work stopped.
//! - [`install`]: `leader-gate install DEST`'s argument (the copy itself is main's).
//!
//! Each client's own flags are next to it (`WatchArgs` in [`watch`], …).
//!
//! Each client says what it does on stderr through one funnel, `log`, in
//! `tracing` (main.rs sets up the format: `leader-gate NAME: …` or JSON);
//! stdout is the product of `watch` and `status`.
//!
//! Nothing here touches the server side's state: clients know the sidecar
//! only through HTTP, as a collector would.

pub mod collector_status;
pub mod death_guard;
pub mod exec;
pub mod feed;
pub mod file_gate;
pub mod install;
pub mod place;
pub mod prestop;
pub mod process_tree;
pub mod sse_reader;
pub mod status;
pub mod url;
pub mod watch;
