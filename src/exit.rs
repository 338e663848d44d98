//! Exit codes (sysexits), one meaning each, shared by `serve` and the
//! clients:
//!
//! - 0: clean shutdown after SIGTERM/SIGINT
//! - 64 ([`USAGE`]): an invalid flag, named in one line
//! - 70 ([`SOFTWARE`]): the election task ended unexpectedly (a bug)
//! - 71 ([`OSERR`]): a listener could not be bound
//! - 65 ([`DATAERR`]): `inject` read input that is not Kubernetes YAML
//! - 66 ([`NOINPUT`]): `inject` could not read its input
//! - 73 ([`CANTCREAT`]): `install` could not write its copy
//! - 78 ([`CONFIG`]): no usable kube configuration (kubeconfig / in-cluster)
//! - 128 + signal: a second signal during shutdown exits at once
//!
//! The clients add their own: `status` 0/1/2, `wait` 0/1, `exec` the
//! child's status (127 for a command that cannot be found), `handover` 0
//! when the candidate asked for holds the Lease, 1 when it does not (another
//! candidate or nobody does, or it could not be asked for), and 64 also for
//! a `--to` refused before anything was written (no pod of that name);
//! `inject --check` 1 when it found anything.

pub const USAGE: u8 = 64;
pub const DATAERR: u8 = 65;
pub const NOINPUT: u8 = 66;
pub const SOFTWARE: u8 = 70;
pub const OSERR: u8 = 71;
pub const CANTCREAT: u8 = 73;
pub const CONFIG: u8 = 78;
