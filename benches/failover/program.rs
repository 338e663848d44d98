//! What a scenario runs: the program (leader-gate or the peer), the Lease
//! it contends for and its timings. The other modules build on this one and
//! on `support`; it imports none of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::fake_apiserver::{FakeApiServer, PolicyRule, Role};
use crate::support::sidecar::{Sidecar, Timing};

pub const NAMESPACE: &str = "bench";
pub const LEASE: &str = "bench";
pub const RELEASED_TERM: &str = "leader-gate.dev/released-term";

pub const DEFAULTS: Timing = Timing {
    lease: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry: Duration::from_secs(2),
};
pub const FAST: Timing = Timing::FAST;

/// The peer as `scripts/build-peer.sh` builds it.
pub const DEFAULT_PEER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/bench-peer/target/release/klm-gate"
);

/// What the candidates of a scenario run.
#[derive(Clone, Debug)]
pub enum Program {
    /// This repository's binary (or `LEADER_GATE_BIN`).
    LeaderGate,
    /// Another program with leader-gate's `serve` flags and `/leader` contract.
    Peer(PathBuf),
}

impl Program {
    /// Gives the program's candidates the permissions it needs on the fake:
    /// the peer patches the Lease (server-side apply, strategic merge
    /// patches), which the Role of `manifests/rbac.yaml` does not allow.
    pub fn prepare(&self, api: &FakeApiServer) {
        if let Program::Peer(_) = self {
            let mut role = Role::from_repository_manifest(LEASE);
            role.rules.push(PolicyRule::new(
                &["coordination.k8s.io"],
                &["leases"],
                &[LEASE],
                &["patch"],
            ));
            api.set_role(role);
        }
    }

    pub fn spawn(
        &self,
        api: &FakeApiServer,
        dir: &Path,
        name: &str,
        timing: Timing,
        extra: &[&str],
    ) -> Sidecar {
        match self {
            Program::LeaderGate => Sidecar::spawn_with(api, dir, name, timing, extra),
            Program::Peer(path) => Sidecar::spawn_program(path, api, dir, name, timing, extra),
        }
    }

    /// Keeps the two programs' test directories apart.
    pub fn suffix(&self) -> &'static str {
        match self {
            Program::LeaderGate => "",
            Program::Peer(_) => "-peer",
        }
    }
}

/// The peer binary to run: `flag` (`--peer`), `PEER_BIN`, or the default
/// build if it exists. `Err` is the one-line note printed instead.
pub fn resolve(flag: Option<&str>) -> Result<PathBuf, String> {
    let chosen = flag
        .map(str::to_string)
        .or_else(|| std::env::var("PEER_BIN").ok().filter(|p| !p.is_empty()));
    match chosen {
        Some(p) if Path::new(&p).is_file() => Ok(PathBuf::from(p)),
        Some(p) => Err(format!("peer: {p} is not a file; peer rows skipped")),
        None if Path::new(DEFAULT_PEER).is_file() => Ok(PathBuf::from(DEFAULT_PEER)),
        None => Err(format!(
            "peer: {DEFAULT_PEER} not built (scripts/build-peer.sh, or --peer PATH / PEER_BIN); peer rows skipped"
        )),
    }
}
