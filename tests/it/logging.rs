//! What the sidecar writes to its log: never a credential, at any level;
//! a stop that was asked for at INFO, one that was forced at WARN. A pod's
//! log is in one format: under `--log-format json` (or
//! `LEADER_GATE_LOG_FORMAT=json`) every line of every subcommand is a JSON
//! object shaped as `serve`'s; in text the clients' lines stay `leader-gate
//! NAME: …`. Lines say what happened: a release, a shutdown that has
//! nothing to release, an outage of a gate's stream and its outcome.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_apiserver::FakeApiServer;
use support::file_gate::FileGate;
use support::gate_clients::GateClient;
use support::proxy::Proxy;
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

/// A renew deadline long enough that a stream cut for a moment resumes
/// before the validity held through it runs out.
const LONG_VALIDITY: Timing = Timing {
    lease: Duration::from_secs(12),
    renew_deadline: Duration::from_secs(8),
    retry: Duration::from_secs(1),
};

/// Every line of `log` parsed as one JSON object with serve's shape
/// (`timestamp`, `level`, `fields.message`, `target`); panics naming the
/// first line that is not.
fn json_lines(who: &str, log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{who}: not a JSON line ({e}): {line:?}\n{log}"));
            assert!(v["timestamp"].is_string(), "{who}: no timestamp: {line}");
            assert!(
                matches!(
                    v["level"].as_str(),
                    Some("TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR")
                ),
                "{who}: no level: {line}"
            );
            assert!(
                v["fields"]["message"].is_string(),
                "{who}: no message: {line}"
            );
            assert!(
                v["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("leader_gate")),
                "{who}: no target: {line}"
            );
            v
        })
        .collect()
}

fn messages(lines: &[Value]) -> Vec<&str> {
    lines
        .iter()
        .filter_map(|v| v["fields"]["message"].as_str())
        .collect()
}

/// Waits until `log()` has a line for which `pred` holds.
async fn wait_log(
    what: &str,
    timeout: Duration,
    log: impl Fn() -> String,
    pred: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !log().lines().any(&pred) {
        assert!(Instant::now() < deadline, "{what}:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The stderr of `leader-gate ARGS` run to its end with `env`.
fn run_to_end(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(args)
        .env_remove("LEADER_GATE_LOG_FORMAT")
        .env_remove("LEADER_GATE_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A pod whose containers all say `json` (by flag or by variable) logs
/// nothing but JSON lines of serve's shape: the gates through a start, an
/// outage of their stream and its end; a refused command line, a status
/// without an answer. The file gate's outage names the sidecar and says the
/// copy stays for the term, then that the term went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_log_format_json_every_line_of_every_subcommand_is_json() {
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let dir = test_dir("logging-json");
    let sidecar = Sidecar::spawn_with(&api, &dir, "a", LONG_VALIDITY, &["--log-format", "json"]);
    sidecar.wait_serving().await;
    let term = sidecar
        .wait_leading(LONG_VALIDITY.lease * 2)
        .await
        .term()
        .unwrap()
        .to_owned();
    let proxy = Proxy::start(sidecar.gate).await;
    let url = proxy.url();
    let mut exec = GateClient::spawn(
        &dir,
        "exec",
        &[
            "exec",
            "--log-format",
            "json",
            "--url",
            &url,
            "--",
            "sleep",
            "60",
        ],
        &[],
    );
    let (src, dst) = (dir.join("rules.yml"), dir.join("out").join("rules.yml"));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::write(&src, "groups: []\n").unwrap();
    let mut file_gate = FileGate::spawn_env(
        &dir,
        "file-gate",
        proxy.addr,
        &[],
        &[(&src, &dst)],
        &[("LEADER_GATE_LOG_FORMAT", Path::new("json"))],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dst.exists() {
        assert!(Instant::now() < deadline, "copied:\n{}", file_gate.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_log(
        "exec started its child",
        Duration::from_secs(10),
        || exec.stderr(),
        |l| l.contains("started"),
    )
    .await;

    // The stream breaks for a moment, well within the validity.
    proxy.cut();
    let broke = format!("the sidecar at {}", proxy.addr);
    wait_log(
        "the outage is said",
        Duration::from_secs(5),
        || file_gate.log(),
        |l| l.contains(&broke),
    )
    .await;
    proxy.up();
    let resumed = format!(
        "the sidecar at {} confirmed term {term} again after the outage: what this gate keeps for it stays",
        proxy.addr
    );
    wait_log(
        "the resumption is said",
        Duration::from_secs(5),
        || file_gate.log(),
        |l| l.contains(&resumed),
    )
    .await;
    assert!(dst.exists(), "the copy was kept through the outage");

    stop_both(&mut file_gate, &mut exec).await;

    let gate_lines = json_lines("file-gate", &file_gate.log());
    let said = messages(&gate_lines);
    let outage = said
        .iter()
        .find(|m| m.contains(&broke))
        .unwrap_or_else(|| panic!("{said:#?}"));
    assert!(
        outage.contains(&format!(
            "what this gate keeps for term {term} stays for at most "
        )),
        "{outage}"
    );
    assert!(outage.ends_with("; retrying"), "{outage}");
    assert!(said.iter().any(|m| m.contains(&resumed)), "{said:#?}");
    let exec_lines = json_lines("exec", &exec.stderr());
    assert!(exec_lines.len() >= 3, "{}", exec.stderr());
    assert!(
        exec_lines.iter().all(|v| v["target"]
            .as_str()
            .unwrap()
            .starts_with("leader_gate::client")),
        "{}",
        exec.stderr()
    );
    // The sidecar's own lines have the same shape.
    json_lines("serve", &sidecar.log());

    // Refused or unanswered, still one JSON line each.
    let nowhere = "http://127.0.0.1:9";
    for (args, env) in [
        (
            &["exec", "--bogus", "--", "true"][..],
            &[("LEADER_GATE_LOG_FORMAT", "json")][..],
        ),
        (
            &["status", "--log-format", "json", "--url", nowhere][..],
            &[][..],
        ),
        (
            &["wait", "--url", nowhere, "--timeout", "1s"][..],
            &[("LEADER_GATE_LOG_FORMAT", "json")][..],
        ),
        (
            &["serve", "--lease-name", "Bad"][..],
            &[("LEADER_GATE_LOG_FORMAT", "json")][..],
        ),
    ] {
        let (code, stderr) = run_to_end(args, env);
        assert_ne!(code, 0, "{args:?}");
        let lines = json_lines(&args.join(" "), &stderr);
        assert!(!lines.is_empty(), "{args:?} said why");
    }
}

/// Without `--log-format` the clients' lines stay as a person reads them,
/// `leader-gate NAME: …`, and none is JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_log_format_the_clients_lines_stay_text() {
    let (_api, dir, sidecar) = leading_sidecar("logging-text").await;
    let url = format!("http://{}", sidecar.gate);
    let mut exec = GateClient::spawn(
        &dir,
        "exec",
        &["exec", "--url", &url, "--", "sleep", "60"],
        &[],
    );
    let (src, dst) = (dir.join("rules.yml"), dir.join("out").join("rules.yml"));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::write(&src, "groups: []\n").unwrap();
    let mut file_gate = FileGate::spawn(&dir, "file-gate", sidecar.gate, &[], &[(&src, &dst)]);
    wait_log(
        "exec started its child",
        Duration::from_secs(10),
        || exec.stderr(),
        |l| l.contains("started"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dst.exists() {
        assert!(Instant::now() < deadline, "copied:\n{}", file_gate.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_both(&mut file_gate, &mut exec).await;
    let (code, status) = run_to_end(&["status", "--url", "http://127.0.0.1:9"], &[]);
    assert_eq!(code, 2);
    for (who, log) in [
        ("exec", exec.stderr()),
        ("file-gate", file_gate.log()),
        ("status", status),
    ] {
        assert!(log.lines().count() >= 1, "{who} said something");
        for line in log.lines() {
            assert!(
                line.starts_with(&format!("leader-gate {who}: ")),
                "{who}: {line}\n{log}"
            );
            assert!(
                serde_json::from_str::<Value>(line).is_err(),
                "{who}: {line}"
            );
        }
    }
}

/// The shutdown line says what a pod does: a follower has nothing to step
/// down from or release; the leader steps down and releases, and its
/// release reads as one, not as a "changed" leader with no holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_and_release_lines_say_what_each_pod_does() {
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let dir = test_dir("logging-shutdown");
    let json = ["--log-format", "json"];
    let mut a = Sidecar::spawn_with(&api, &dir, "a", Timing::FAST, &json);
    a.wait_serving().await;
    a.wait_leading(Timing::FAST.lease * 3).await;
    let mut b = Sidecar::spawn_with(&api, &dir, "b", Timing::FAST, &json);
    b.wait_serving().await;
    b.wait_for(Duration::from_secs(10), |p| p.holder() == Some("a"))
        .await;

    b.signal(libc::SIGTERM);
    b.wait_exit(Duration::from_secs(10))
        .await
        .expect("b exited");
    let b_log = b.log();
    let b_said = messages(&json_lines("b", &b_log))
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert!(
        b_said.contains(
            &"shutting down: not leading: nothing to step down from or release".to_owned()
        ),
        "{b_log}"
    );
    assert!(!b_log.contains("stepping down"), "{b_log}");

    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(15))
        .await
        .expect("a exited");
    let a_log = a.log();
    let a_lines = json_lines("a", &a_log);
    let a_said = messages(&a_lines);
    assert!(
        a_said.contains(&"shutting down: stepping down, then releasing the lease"),
        "{a_log}"
    );
    assert!(
        a_said.contains(&"the Lease was released by a: no holder"),
        "{a_log}"
    );
    for line in a_lines.iter().chain(json_lines("b", &b_log).iter()) {
        if line["fields"]["message"] == "observed leader changed" {
            assert!(
                line["fields"]["holder"].is_string(),
                "a change names its holder: {line}"
            );
        }
    }
}

/// A gate runs in the collector's container, whose `RUST_LOG` is the
/// collector's: a `warn` there does not silence the gate's lines; a
/// `RUST_LOG` that names `leader_gate` does set their level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_heeds_only_a_rust_log_that_names_leader_gate() {
    let (_api, dir, sidecar) = leading_sidecar("logging-rust-log").await;
    let url = format!("http://{}", sidecar.gate);
    for (name, rust_log, says) in [
        ("collectors-own", "warn", true),
        ("names-leader-gate", "leader_gate=warn", false),
    ] {
        let started = dir.join(format!("{name}.started"));
        let script = format!("touch {}; sleep 60", started.display());
        let mut exec = GateClient::spawn(
            &dir,
            name,
            &["exec", "--url", &url, "--", "sh", "-c", &script],
            &[("RUST_LOG", rust_log)],
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !started.exists() {
            assert!(Instant::now() < deadline, "{name}: {}", exec.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            exec.stderr().contains("started the child"),
            says,
            "RUST_LOG={rust_log}: {}",
            exec.stderr()
        );
        // Not SIGTERM: that would hand the Lease over before the next one.
        exec.signal(libc::SIGKILL);
        exec.wait_exit(Duration::from_secs(10)).await;
    }
}

/// SIGTERM to both gates: the file gate exits, and `exec` exits 0.
async fn stop_both(file_gate: &mut FileGate, exec: &mut GateClient) {
    file_gate.signal(libc::SIGTERM);
    exec.signal(libc::SIGTERM);
    assert!(file_gate.wait_exit(Duration::from_secs(10)).await.is_some());
    assert_eq!(
        exec.exit_code(Duration::from_secs(10)).await,
        0,
        "{}",
        exec.stderr()
    );
}

/// A sidecar `a` that leads, in a test directory of its own (keep the API
/// server for as long as the sidecar).
async fn leading_sidecar(test: &str) -> (FakeApiServer, std::path::PathBuf, Sidecar) {
    let api = FakeApiServer::start("collectors", "cluster-metrics").await;
    let dir = test_dir(test);
    let sidecar = Sidecar::spawn(&api, &dir, "a", Timing::GATES);
    sidecar.wait_serving().await;
    sidecar.wait_leading(Timing::GATES.lease * 2).await;
    (api, dir, sidecar)
}
