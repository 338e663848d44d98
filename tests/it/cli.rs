//! The command line of the real binary: bad input exits 64 with a message
//! naming the flag and the rule, before any I/O (G8): one line for a rule
//! broken, clap's lines each on its own for a flag clap refused.

use crate::support;

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(args)
        // Any attempt to read the kube configuration would fail differently
        // (exit 78): validation must come first.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("LEADER_GATE_URL")
        .output()
        .expect("run leader-gate");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Exit 64 and `leader-gate: ` with the message naming the flag first; a
/// message clap wrote goes on with its further lines, each on its own and
/// none run into another ("…syntax For more information…").
fn assert_usage_error(args: &[&str], code: Option<i32>, stderr: &str, expected: &str) {
    assert_eq!(code, Some(64), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].starts_with("leader-gate: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(expected),
        "{args:?}: {:?} lacks {expected:?}",
        lines[0]
    );
    for line in &lines {
        assert!(
            !line.trim().is_empty(),
            "{args:?}: a blank line in\n{stderr}"
        );
        for start in ["For more information", "Usage:", "tip:"] {
            assert!(
                !line.contains(start) || line.starts_with(start),
                "{args:?}: {start:?} runs into another line: {line:?}"
            );
        }
    }
    if lines.len() > 1 {
        assert_eq!(
            lines.last(),
            Some(&"For more information, try '--help'."),
            "{args:?}: clap's lines end with its pointer to --help:\n{stderr}"
        );
    }
}

#[test]
fn bad_flags_exit_64_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "--lease-name"),
        (
            &["--lease-name", "Demo"],
            "invalid --lease-name: \"Demo\" must be a DNS-1123 subdomain",
        ),
        (
            &["--lease-name", "demo", "--lease-duration", "1.5s"],
            "invalid --lease-duration: must be whole seconds",
        ),
        (
            &["--lease-name", "demo", "--lease-duration", "soon"],
            "--lease-duration",
        ),
        (
            &["--lease-name", "demo", "--renew-deadline", "20s"],
            "invalid --renew-deadline: must be less than --lease-duration",
        ),
        (
            &["--lease-name", "demo", "--retry-period", "9s"],
            "invalid --retry-period: 1.2 x --retry-period must be less than --renew-deadline",
        ),
        (
            &["--lease-name", "demo", "--lease-namespace", "Kube_System"],
            "invalid --lease-namespace",
        ),
        (
            &["--lease-name", "demo", "--identity", ""],
            "invalid --identity: must not be empty",
        ),
        (
            &["--lease-name", "demo", "--listen", "localhost"],
            "--listen",
        ),
        (
            &["--lease-name", "demo", "--log-format", "xml"],
            "--log-format",
        ),
        (
            &["--lease-name", "demo", "--release-on-shutdown", "maybe"],
            "--release-on-shutdown",
        ),
        (
            &["--lease-name", "demo", "--shutdown-timeout", "0s"],
            "invalid --shutdown-timeout",
        ),
        (
            &["--lease-name", "demo", "--no-such-flag"],
            "--no-such-flag",
        ),
        (
            &["--lease-name", "demo", "--gate-lag", "6s"],
            "invalid --gate-lag: must be less than the margin",
        ),
        (
            &[
                "--lease-name",
                "demo",
                "--collector-health-url",
                "https://127.0.0.1:5066/stats",
            ],
            "invalid --collector-health-url: \"https://127.0.0.1:5066/stats\" must be an http:// URL",
        ),
        (
            &[
                "--lease-name",
                "demo",
                "--collector-health-url",
                "localhost:5066",
            ],
            "invalid --collector-health-url",
        ),
        (
            &[
                "--lease-name",
                "demo",
                "--collector-health-url",
                "http://127.0.0.1:5066/stats",
                "--collector-health-failures",
                "0",
            ],
            "invalid --collector-health-failures: must be at least 1",
        ),
        (
            &[
                "--lease-name",
                "demo",
                "--collector-health-failures",
                "many",
            ],
            "--collector-health-failures",
        ),
        (
            &[
                "--lease-name",
                "demo",
                "--collector-health-url",
                "http://127.0.0.1:5066/stats",
                "--collector-health-grace",
                "3s",
            ],
            "invalid --collector-health-grace: must be at least 2 x --retry-period (3s < 2 x 2s)",
        ),
    ];
    for (args, expected) in cases {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(args);
        let (code, stderr) = run(&argv);
        assert_usage_error(&argv, code, &stderr, expected);
        if expected.starts_with("invalid --") {
            // A rule of leader-gate's own: that one line only.
            assert_eq!(stderr.lines().count(), 1, "{args:?}: one line:\n{stderr}");
        }
    }
}

#[test]
fn clap_refusals_put_each_of_its_lines_on_its_own() {
    let (code, stderr) = run(&["serve", "--lease-name", "demo", "--listen", "localhost"]);
    assert_usage_error(&["--listen"], code, &stderr, "--listen");
    assert_eq!(
        stderr,
        "leader-gate: invalid value 'localhost' for '--listen <LISTEN>': invalid socket address syntax\n\
         For more information, try '--help'.\n"
    );
    // A missing flag: clap's list joined into the first line, then its usage.
    let (code, stderr) = run(&["serve"]);
    assert_usage_error(&["serve"], code, &stderr, "--lease-name <LEASE_NAME>");
    assert_eq!(
        stderr,
        "leader-gate: the following required arguments were not provided: --lease-name <LEASE_NAME>\n\
         Usage: leader-gate serve --lease-name <LEASE_NAME>\n\
         For more information, try '--help'.\n"
    );
}

#[test]
fn no_arguments_print_the_usage_with_every_subcommand() {
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("Usage: leader-gate <COMMAND>"), "{stderr}");
    for command in [
        "serve",
        "watch",
        "exec",
        "file-gate",
        "status",
        "wait",
        "install",
        "handover",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "{command} missing from the usage:\n{stderr}"
        );
    }
}

#[test]
fn wait_says_how_long_it_waited_as_the_flag_is_written() {
    // Nothing listens on port 9: never leading.
    for (timeout, said) in [("300ms", "300ms"), ("1.5s", "1.5s")] {
        let (code, stderr) = run(&["wait", "--url", "http://127.0.0.1:9", "--timeout", timeout]);
        assert_eq!(code, Some(1), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert_eq!(
            last,
            format!("leader-gate wait: not leading after {said}"),
            "{stderr}"
        );
    }
}

#[test]
fn a_valid_command_line_gets_past_validation_to_the_kube_configuration() {
    // With every flag valid, the first failure is the missing kubeconfig.
    let (code, stderr) = run(&[
        "serve",
        "--lease-name",
        "demo",
        "--identity",
        "a",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("no kube configuration"), "{stderr}");
}

#[test]
fn help_documents_every_flag_and_its_environment_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--lease-name",
        "--lease-namespace",
        "--identity",
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
        "--listen",
        "--admin-listen",
        "--release-on-shutdown",
        "--shutdown-timeout",
        "--gate-lag",
        "--log-format",
        "--collector-health-url",
        "--collector-health-failures",
        "--record-events",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    for env in [
        "LEADER_GATE_LEASE_NAME",
        "LEADER_GATE_IDENTITY",
        "LEADER_GATE_LEASE_DURATION",
        "LEADER_GATE_RECORD_EVENTS",
    ] {
        assert!(help.contains(env), "{env} missing from --help");
    }
}

#[test]
fn install_copies_a_runnable_binary_for_images_without_cp() {
    let dir = std::env::temp_dir().join(format!("leader-gate-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dest = dir.join("leader-gate");
    let (code, stderr) = run(&["install", dest.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    let version = Command::new(&dest).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("leader-gate "));
    let (code, stderr) = run(&["install", "/nonexistent-dir/leader-gate"]);
    assert_eq!(code, Some(73), "{stderr}");
    assert!(
        stderr.contains("cannot copy to /nonexistent-dir/leader-gate"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_command_lines_exit_64_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["exec", "--url", "http://127.0.0.1:4040"], "<COMMAND>"),
        (
            &["exec", "--url", "http://127.0.0.1:4040", "--"],
            "<COMMAND>",
        ),
        (
            &["exec", "--url", "https://127.0.0.1:4040", "--", "true"],
            "--url",
        ),
        (&["exec", "--grace", "soon", "--", "true"], "--grace"),
        (&["status", "--url", "127.0.0.1:4040"], "--url"),
        (&["wait", "--url", "ftp://127.0.0.1:4040"], "--url"),
        (&["wait", "--timeout", "soon"], "--timeout"),
        (&["watch", "--url", ""], "--url"),
        (&["file-gate", "--url", "localhost", "a:b"], "--url"),
    ];
    for (args, expected) in cases {
        let (code, stderr) = run(args);
        assert_usage_error(args, code, &stderr, expected);
    }
}

#[test]
fn file_gate_rejects_a_bad_mapping_or_mode_with_exit_64_naming_it() {
    let dir =
        std::env::temp_dir().join(format!("leader-gate-cli-file-gate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = format!("/etc/hostname:{}/dst.yml", dir.display());
    let into_dir = format!("/etc/hostname:{}", dir.display());
    let cases: &[(&[&str], &str)] = &[
        (
            &["nocolon"],
            "invalid SRC:DST \"nocolon\": expected SRC:DST",
        ),
        (
            &["/etc/hostname:/nonexistent-dir-xyz/dst.yml"],
            "DST's directory /nonexistent-dir-xyz does not exist",
        ),
        (&[":x.yml"], "SRC and DST must both be file paths"),
        (&[&into_dir], "is a directory"),
        (&["--mode", "999", &dst], "--mode"),
        (
            &["--mode", "u+rw", &dst],
            "\"u+rw\" is not an octal file mode",
        ),
        (&["--mode", "01777", &dst], "--mode"),
        (&["--url", "https://127.0.0.1:4040", &dst], "--url"),
        (&[], "SRC:DST"),
    ];
    for (args, expected) in cases {
        let mut argv = vec!["file-gate"];
        argv.extend_from_slice(args);
        let (code, stderr) = run_bounded(&argv);
        assert_usage_error(&argv, code, &stderr, expected);
    }
    // Nothing was written: validation comes before any I/O.
    assert!(!dir.join("dst.yml").exists());
}

/// [`run`] for a client that would run for ever if its arguments were
/// accepted: killed (and the test failed) if it has not exited in 10 s.
fn run_bounded(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(args)
        .env_remove("LEADER_GATE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run leader-gate");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().expect("try_wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{args:?} was accepted and ran on: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Issue 14 item 3: the defaults follow the timing rule (gate lag and exec
/// grace within the margin), and combinations that break it are refused,
/// exit 64, naming the flags.
#[test]
fn timing_combinations_that_break_the_rule_exit_64_naming_the_flags() {
    let cases: &[(&[&str], &[&str])] = &[
        // The derived gate lag (80% of the 5 s margin: 4 s) needs a longer
        // shutdown timeout, or the release never happens.
        (
            &["serve", "--lease-name", "demo", "--shutdown-timeout", "3s"],
            &[
                "invalid --shutdown-timeout: must be more than --gate-lag (3s <= 4s, the default: 80% of the margin)",
            ],
        ),
        (
            &[
                "serve",
                "--lease-name",
                "demo",
                "--gate-lag",
                "2s",
                "--shutdown-timeout",
                "1s",
            ],
            &["invalid --shutdown-timeout", "--gate-lag"],
        ),
        (
            &[
                "serve",
                "--lease-name",
                "demo",
                "--lease-duration",
                "30s",
                "--renew-deadline",
                "15s",
                "--gate-lag",
                "15s",
            ],
            &[
                "invalid --gate-lag: must be less than the margin --lease-duration - --renew-deadline (15s >= 15s)",
            ],
        ),
        (
            &["exec", "--grace", "10m", "--", "true"],
            &["invalid --grace: must be at most 5m (got 10m)"],
        ),
        (
            &["exec", "--grace", "1h", "--", "true"],
            &["invalid --grace"],
        ),
    ];
    for (args, expected) in cases {
        let (code, stderr) = run_bounded(args);
        assert_usage_error(args, code, &stderr, expected[0]);
        for part in *expected {
            assert!(stderr.contains(part), "{args:?}: {stderr:?} lacks {part:?}");
        }
    }
}

#[test]
fn exec_warns_of_a_grace_beyond_the_default_margin_and_not_of_its_default() {
    let missing = "/nonexistent-dir/collector";
    // A command that cannot be found exits 127 at once: what `exec` said
    // before trying it is all on stderr.
    let (code, stderr) = run(&["exec", "--url", "http://127.0.0.1:9", "--", missing]);
    assert_eq!(code, Some(127), "{stderr}");
    assert!(!stderr.contains("warning"), "the default grace: {stderr}");
    for grace in ["5s", "20s"] {
        let (code, stderr) = run(&[
            "exec",
            "--url",
            "http://127.0.0.1:9",
            "--grace",
            grace,
            "--",
            missing,
        ]);
        assert_eq!(code, Some(127), "{grace}: still runs: {stderr}");
        let warning = stderr
            .lines()
            .find(|l| l.starts_with("leader-gate exec: warning: --grace"))
            .unwrap_or_else(|| panic!("{grace}: no warning in {stderr:?}"));
        assert!(warning.contains(&format!("--grace {grace}")), "{warning}");
        assert!(warning.contains("default margin 5s"), "{warning}");
    }
}

/// The demo (`examples/demo.rs`, the README's first command), built by
/// `cargo test` with the examples, next to this test's own directory.
fn demo_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let demo = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/deps")
        .join("examples")
        .join("demo");
    assert!(
        demo.exists(),
        "{} is missing: `cargo test` builds it; alone, run `cargo build --example demo` first",
        demo.display()
    );
    demo
}

#[test]
fn the_demo_reports_a_sidecar_that_cannot_start_in_one_line_and_exits_1() {
    // pod-a's gate port is held here, and the demo is told to use it as is.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = busy.local_addr().expect("its address");
    let output = Command::new(demo_binary())
        .args(["--duration", "1s"])
        .env("LEADER_GATE_DEMO_GATE_A", addr.to_string())
        .env_remove("RUST_LOG")
        .output()
        .expect("run the demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Not a panic (101): one clear line, exit 1.
    assert_eq!(output.status.code(), Some(1), "stderr:\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
    let line = stderr.trim_end();
    assert!(
        line.starts_with(
            "demo: pod-a cannot start: it exited (exit status: 71) before listening on "
        ),
        "{line}"
    );
    assert!(line.contains(&addr.to_string()), "{line}");
    assert!(line.contains("cannot bind a listener"), "{line}");
    assert!(line.contains("Address already in use"), "{line}");
    drop(busy);
}

/// A port in use names its flag and the way out: under `hostNetwork` a
/// second workload on the node that runs leader-gate needs ports of its own.
#[test]
fn a_port_in_use_names_its_flag_and_the_way_out() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = busy.local_addr().expect("its address").to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["serve", "--lease-name", "demo", "--lease-namespace", "ns"])
        .args([
            "--identity",
            "a",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            &addr,
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(71), "{stderr}");
    assert!(stderr.contains("cannot bind a listener"), "{stderr}");
    assert!(stderr.contains("flag=\"--admin-listen\""), "{stderr}");
    assert!(stderr.contains("ports of its own"), "{stderr}");
    assert!(
        stderr.contains("the probes' port and the containerPort"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--host-port-base"),
        "inject's way out too: {stderr}"
    );
    drop(busy);
}

#[test]
fn the_demo_restarts_a_sidecar_whose_gate_port_was_taken_on_a_new_port() {
    // The demo binds each gate port itself between stop and restart, as any
    // other program might: the restart must move, say so, and the demo end well.
    let output = Command::new(demo_binary())
        .args(["--duration", "1s"])
        .env("LEADER_GATE_DEMO_TAKE_PORT_ON_RESTART", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let moved: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("gate moved: it now listens on http://127.0.0.1:"))
        .collect();
    assert_eq!(moved.len(), 2, "both restarts moved:\n{stdout}");
    assert!(stdout.contains("done: "), "{stdout}");
    assert_the_demo_explains_itself(&stdout);
}

/// Beside the graceful hand-over the demo says why the release waited (the
/// gate lag) and how soon the Lease was taken; its suggested `kill` names the
/// pod that leads when it is printed, whichever that is.
fn assert_the_demo_explains_itself(stdout: &str) {
    assert!(
        stdout.contains("the release went out ") && stdout.contains("it waits the gate lag"),
        "{stdout}"
    );
    assert!(stdout.contains(" took the Lease "), "{stdout}");
    let (before, after) = stdout
        .split_once("The three sidecars keep running")
        .expect("the next steps");
    let leader = before
        .lines()
        .rfind(|l| l.contains(": started-leading"))
        .and_then(|l| l.split("] ").nth(1)?.split(':').next())
        .expect("a leader before the next steps");
    let kill = after
        .lines()
        .find(|l| l.trim_start().starts_with("kill "))
        .expect("a kill line");
    assert!(
        kill.contains(&format!("# SIGTERM {leader}, the leader now")),
        "the leader is {leader}: {kill}"
    );
    // The clients it suggests run from the build it already made.
    let watch = after
        .lines()
        .find(|l| l.contains(" watch --url "))
        .expect("a watch line");
    let program = watch.split_whitespace().next().expect("a program");
    assert!(
        std::path::Path::new(program).is_file() && !watch.contains("cargo "),
        "{watch}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_watch_hint_runs_the_client_from_the_demo_build() {
    let api = support::fake_apiserver::FakeApiServer::start("collectors", "demo").await;
    let dir = support::sidecar::test_dir("demo-watch-hint");
    let a = support::sidecar::Sidecar::spawn(&api, &dir, "a", support::sidecar::Timing::FAST);
    a.wait_serving().await;
    a.wait_leading(support::sidecar::Timing::FAST.lease * 3)
        .await;
    let mut watch = tokio::process::Command::new(demo_binary())
        .args(["watch", "--url", &format!("http://{}", a.gate)])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run demo watch");
    let mut out = tokio::io::BufReader::new(watch.stdout.take().unwrap());
    let mut line = String::new();
    use tokio::io::AsyncBufReadExt;
    tokio::time::timeout(std::time::Duration::from_secs(10), out.read_line(&mut line))
        .await
        .expect("a line within 10 s")
        .unwrap();
    assert!(line.contains("leading"), "{line}");
}
