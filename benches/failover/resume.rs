//! A sidecar SIGKILLed and restarted at once with its state directory
//! (`--state-dir`): from the kill to the restarted process answering 200,
//! in the same term, while a peer watches (it must not take over).

use std::time::{Duration, Instant};

use crate::program::{DEFAULTS, LEASE, NAMESPACE};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::sidecar::{Sidecar, test_dir};

/// `rounds` kills and restarts of the leader (defaults 15 s / 10 s / 2 s).
pub async fn run(rounds: usize) -> Vec<Duration> {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("bench-resume");
    let state = dir.join("state-a");
    let args = ["--state-dir", state.to_str().expect("a UTF-8 path")];
    let mut a = Sidecar::spawn_with(&api, &dir, "a", DEFAULTS, &args);
    a.wait_serving().await;
    let term = a
        .wait_leading(DEFAULTS.lease * 2)
        .await
        .term()
        .map(str::to_owned);
    let peer = Sidecar::spawn_with(&api, &dir, "b", DEFAULTS, &[]);
    peer.wait_serving().await;
    peer.wait_for(Duration::from_secs(5), |p| p.holder() == Some("a"))
        .await;
    let mut out = Vec::new();
    for round in 0..rounds {
        // After a renew, as a crash would come at any time of the period.
        tokio::time::sleep(Duration::from_millis(300 + 97 * round as u64 % 1500)).await;
        a.signal(libc::SIGKILL);
        a.wait_exit(Duration::from_secs(5)).await;
        let killed = Instant::now();
        a = Sidecar::spawn_logged(&api, &dir, "a", &format!("a-{round}.log"), DEFAULTS, &args);
        loop {
            if let Some(p) = a.leader().await
                && p.leading()
            {
                assert_eq!(p.term().map(str::to_owned), term, "the same term");
                break;
            }
            assert!(killed.elapsed() < DEFAULTS.lease, "not resumed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        out.push(killed.elapsed());
        assert!(
            !peer.leader().await.is_some_and(|p| p.leading()),
            "the peer took over"
        );
    }
    out
}
