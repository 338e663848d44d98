//! A group of candidate processes against one fake API server, observed
//! from outside: who answers 200, the fake's log of writes.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::program::Program;
use crate::program::{LEASE, NAMESPACE, RELEASED_TERM};
use crate::support::fake_apiserver::{FakeApiServer, RequestRecord, Verb, lease_holder};
use crate::support::sidecar::{Sidecar, Timing, test_dir};

pub struct Group {
    pub api: FakeApiServer,
    pub dir: std::path::PathBuf,
    pub timing: Timing,
    pub sidecars: Vec<Sidecar>,
    pub next: usize,
    /// What the candidates run: leader-gate, or the peer elector.
    pub program: Program,
    /// The extra flags every candidate gets, replacements too.
    pub extra: Vec<String>,
}

impl Group {
    pub async fn start(name: &str, timing: Timing, size: usize) -> Group {
        Self::start_with(name, timing, size, &[]).await
    }

    pub async fn start_with(name: &str, timing: Timing, size: usize, extra: &[&str]) -> Group {
        Self::start_program(&Program::LeaderGate, name, timing, size, extra).await
    }

    /// A group of `size` candidates running `program`.
    pub async fn start_program(
        program: &Program,
        name: &str,
        timing: Timing,
        size: usize,
        extra: &[&str],
    ) -> Group {
        let api = FakeApiServer::start(NAMESPACE, LEASE).await;
        program.prepare(&api);
        let dir = test_dir(&format!("bench-{name}{}", program.suffix()));
        let mut group = Group {
            api,
            dir,
            timing,
            sidecars: Vec::new(),
            next: 0,
            program: program.clone(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for _ in 0..size {
            group.spawn(extra);
        }
        for s in &group.sidecars {
            s.wait_serving().await;
        }
        group
    }

    pub fn spawn(&mut self, extra: &[&str]) -> usize {
        let name = format!("p{}", self.next);
        self.next += 1;
        self.sidecars.push(
            self.program
                .spawn(&self.api, &self.dir, &name, self.timing, extra),
        );
        self.sidecars.len() - 1
    }

    /// Replaces the (exited) instance `i` with a fresh candidate.
    pub async fn replace(&mut self, i: usize) {
        let mut old = self.sidecars.remove(i);
        old.wait_exit(Duration::from_secs(15)).await;
        drop(old);
        let extra = self.extra.clone();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let j = self.spawn(&extra);
        self.sidecars[j].wait_serving().await;
        // Let it list and watch before the next round.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Index of an instance answering 200 (not `old`), polled every millisecond.
    pub async fn leader_other_than(
        &self,
        old: Option<&str>,
        timeout: Duration,
    ) -> (usize, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, s) in self.sidecars.iter().enumerate() {
                if Some(s.name.as_str()) != old && s.leader().await.is_some_and(|p| p.leading()) {
                    return (i, Instant::now());
                }
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for the next successful renew (PUT, or PATCH for the peer) of
    /// `leader`; returns its record.
    pub async fn wait_renew(&self, leader: usize) -> RequestRecord {
        let name = self.sidecars[leader].name.clone();
        let before = self.successful_updates(&name).len();
        loop {
            let updates = self.successful_updates(&name);
            if updates.len() > before {
                return updates.last().cloned().expect("one");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The successful updates of `name`: PUTs, and PATCHes (the peer renews
    /// with strategic merge patches; leader-gate never patches).
    pub fn successful_updates(&self, name: &str) -> Vec<RequestRecord> {
        let mut writes = self.api.requests_of(name, Verb::Update);
        writes.extend(self.api.requests_of(name, Verb::Patch));
        writes.retain(|r| r.status == Some(200));
        writes.sort_by_key(|r| r.at);
        writes
    }

    /// Polls `i`'s `/leader` every millisecond until it answers 503.
    pub async fn wait_503(&self, i: usize, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            if self.sidecars[i]
                .leader()
                .await
                .is_some_and(|p| !p.leading())
            {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "no step-down within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Like an operator: clears the holder with the release mark of the
    /// current term, so every candidate may take the Lease at once.
    pub fn operator_release(&self) {
        self.api.update_lease(LEASE, |l| {
            let uid = l["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let transitions = l["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
            if let Some(spec) = l["spec"].as_object_mut() {
                spec.remove("holderIdentity");
            }
            if !l["metadata"]["annotations"].is_object() {
                l["metadata"]["annotations"] = json!({});
            }
            l["metadata"]["annotations"][RELEASED_TERM] = json!(format!("{uid}/{transitions}"));
        });
    }

    pub fn holder(&self) -> Option<String> {
        self.api.lease(LEASE).as_ref().and_then(lease_holder)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == name)
    }
}
