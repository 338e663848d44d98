//! What the sidecar writes to its log: never a credential, at any level;
//! a stop that was asked for at INFO, one that was forced at WARN.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::fake_apiserver::FakeApiServer;
use support::sidecar::{Sidecar, Timing, get, test_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_line_carries_the_bearer_token_even_at_trace_level() {
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let dir = test_dir("logging");
    // The fake names a client by its token: this one is the secret.
    let client = "tok-5ecr3t-9q";
    let kubeconfig = api.write_kubeconfig(client, &dir);
    let log_path = dir.join("trace.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "serve",
            "--lease-name",
            "cluster-metrics",
            "--identity",
            "a",
        ])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args([
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "3s",
            "--retry-period",
            "1s",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let admin = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = log();
            if let Some(line) = text.lines().find(|l| l.contains(" listening ")) {
                let rest = &line[line.find("admin=").unwrap() + "admin=".len()..];
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "never listened:\n{}", log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let wait_leading = |what: &str| {
        let what = what.to_owned();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while get(admin, "/leader").await.is_none_or(|p| p.status != 200) {
                assert!(Instant::now() < deadline, "{what}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_leading("leads with the first token").await;
    // A rotated token is read again after the 401: a second credential in play.
    let rotated = api.rotate_token(client);
    assert_eq!(rotated, format!("{client}.1"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_leading("leads with the rotated token").await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();

    let text = log();
    assert!(
        text.lines().count() > 100,
        "a trace-level log: {} lines",
        text.lines().count()
    );
    for line in text.lines() {
        assert!(
            !line.contains(&rotated),
            "the rotated token was logged: {line}"
        );
        assert!(
            !line.contains("Bearer "),
            "an Authorization header was logged: {line}"
        );
        // The first token, other than as part of the token file's path.
        let without_paths = line
            .replace(&format!("{client}.token"), "")
            .replace(&format!("{client}.kubeconfig"), "");
        assert!(
            !without_paths.contains(client),
            "the token was logged: {line}"
        );
    }
}

/// The level of the log line `message` of the JSON log `log`.
fn level_of(log: &str, message: &str) -> Option<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v["fields"]["message"] == message)
        .and_then(|v| v["level"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_is_logged_at_info_and_a_lost_lease_at_warn() {
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let dir = test_dir("logging-stop-levels");
    let json = ["--log-format", "json"];
    // Lost: another holder written into the Lease.
    let a = Sidecar::spawn_with(&api, &dir, "a", Timing::FAST, &json);
    a.wait_serving().await;
    a.wait_leading(Timing::FAST.lease * 3).await;
    api.update_lease("cluster-metrics", |l| {
        l["spec"]["holderIdentity"] = serde_json::json!("ghost");
    });
    a.wait_for(Duration::from_secs(5), |p| !p.leading()).await;
    assert_eq!(
        level_of(&a.log(), "stopped leading").as_deref(),
        Some("WARN"),
        "{}",
        a.log()
    );
    // Asked for: SIGTERM of a leader.
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let mut b = Sidecar::spawn_with(&api, &dir, "b", Timing::FAST, &json);
    b.wait_serving().await;
    b.wait_leading(Timing::FAST.lease * 3).await;
    b.signal(libc::SIGTERM);
    b.wait_exit(Duration::from_secs(10)).await.expect("exited");
    assert_eq!(
        level_of(&b.log(), "stopped leading").as_deref(),
        Some("INFO"),
        "{}",
        b.log()
    );
}
