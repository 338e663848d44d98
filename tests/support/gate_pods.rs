//! Pods as the gate tests run them: a sidecar each, against one fake API
//! server (Lease `cluster-metrics` in `collectors`) in one test directory,
//! and, when a test wants them, an `exec` of [`COLLECTOR`] beside each.

use std::path::PathBuf;

use super::fake_apiserver::FakeApiServer;
use super::gate_clients::{COLLECTOR, ChildLog, Entry, GateClient, spawn_exec_under};
use super::sidecar::{Sidecar, Timing, leading_one, test_dir};

pub struct Pods {
    pub api: FakeApiServer,
    pub dir: PathBuf,
    /// One per name, in the order of the names.
    pub sidecars: Vec<Sidecar>,
    names: &'static [&'static str],
    timing: Timing,
}

impl Pods {
    /// A sidecar per name with `flags`, each serving when this returns.
    pub async fn start(
        test: &str,
        names: &'static [&'static str],
        timing: Timing,
        flags: &[&str],
    ) -> Pods {
        let api = FakeApiServer::start("collectors", "cluster-metrics").await;
        let dir = test_dir(test);
        let sidecars = Sidecar::spawn_serving(&api, &dir, names, timing, flags).await;
        Pods {
            api,
            dir,
            sidecars,
            names,
            timing,
        }
    }

    /// The index of the sidecar that leads first.
    pub async fn leader(&self) -> usize {
        leading_one(&self.sidecars, self.timing.lease * 3).await
    }

    /// An `exec --grace 2s` of [`COLLECTOR`] beside each sidecar (under
    /// `wrapper`, see [`GateClient::spawn_under`]), their children logging
    /// to `children.log`; then the first child's start (within three lease
    /// durations) and the index of its pod.
    pub async fn execs(&self, wrapper: &[&str]) -> (Vec<GateClient>, ChildLog, usize, Entry) {
        let log = ChildLog(self.dir.join("children.log"));
        let execs: Vec<GateClient> = self
            .names
            .iter()
            .zip(&self.sidecars)
            .map(|(name, sidecar)| {
                let url = format!("http://{}", sidecar.gate);
                spawn_exec_under(wrapper, &self.dir, name, &url, &log.0, COLLECTOR)
            })
            .collect();
        let first = log
            .wait_for(self.timing.lease * 3, |e| e.what == "start")
            .await;
        let l = self.names.iter().position(|n| *n == first.name).unwrap();
        (execs, log, l, first)
    }
}
