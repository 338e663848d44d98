//! `leader-gate exec` and the whole process tree of a term, as real
//! processes against the fake Lease API server: children that ignore
//! SIGTERM, grandchildren that ignore it too, a daemon that double-forks
//! out of the process group, `exec` SIGKILLed, and `exec` as PID 1 of a new
//! PID namespace. No process of term N may be alive when term N+1's child
//! starts, and no zombie may remain.
//!
//! Each process of a term appends `<what> <term> <pid>` to `$LOG`. Each
//! term's child first looks up every pid of an earlier term in /proc and
//! logs `overlap <term> <pid>` for one still there (zombies included):
//! checked at the very moment a new term's child starts.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_apiserver::FakeApiServer;
use support::gate_clients::spawn_exec;
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
/// As in tests/it/gates.rs: a margin of 3 s covers `--grace 2s`.
const TIMING: Timing = Timing {
    lease: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(3),
    retry: Duration::from_secs(1),
};

/// The start of every term's child: the overlap check, then its own line.
const PROLOGUE: &str = r#"
me=$LEADER_GATE_TERM
while read -r what term pid; do
    [ "$term" = "$me" ] || [ ! -e "/proc/$pid" ] || echo "overlap $me $pid" >> "$LOG"
done < "$LOG"
echo "child $me $$" >> "$LOG"
"#;

/// A grandchild that ignores SIGTERM, in the child's process group, and a
/// daemon that ignores it too and double-forks into a session of its own.
const DESCENDANTS: &str = r#"
sh -c 'trap "" TERM; echo "grandchild $LEADER_GATE_TERM $$" >> "$LOG"; exec sleep 301' &
setsid sh -c 'sh -c '\''trap "" TERM; echo "daemon $LEADER_GATE_TERM $$" >> "$LOG"; exec sleep 302'\'' &'
"#;

/// Keeps the child running (without looking at its parent).
const FOREVER: &str = "while :; do sleep 0.05; done\n";

/// One line of the log.
#[derive(Clone, Debug, PartialEq)]
struct Line {
    what: String,
    term: String,
    pid: i32,
}

/// The shared log. Unless its pids are of another PID namespace, every
/// pid in it is SIGKILLed on drop, so a test that fails (or the old `exec`)
/// leaves nothing behind.
struct Log(PathBuf, bool);

impl Log {
    fn new(dir: &Path) -> Log {
        let path = dir.join("tree.log");
        std::fs::write(&path, "").unwrap();
        Log(path, true)
    }

    /// For pids of another PID namespace: never signalled from here.
    fn of_namespace(dir: &Path) -> Log {
        let mut log = Log::new(dir);
        log.1 = false;
        log
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }

    fn lines(&self) -> Vec<Line> {
        self.text()
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                if f.len() != 3 {
                    return None;
                }
                Some(Line {
                    what: f[0].into(),
                    term: f[1].into(),
                    pid: f[2].parse().ok()?,
                })
            })
            .collect()
    }

    /// Waits until lines `whats` were all logged in one term other than
    /// `not`; returns that term's lines.
    async fn wait_term(&self, whats: &[&str], not: Option<&str>, timeout: Duration) -> Vec<Line> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.lines();
            let term = lines
                .iter()
                .rev()
                .find(|l| l.what == "child" && Some(l.term.as_str()) != not)
                .map(|l| l.term.clone());
            if let Some(term) = term {
                let of_term: Vec<Line> = lines.into_iter().filter(|l| l.term == term).collect();
                if whats.iter().all(|w| of_term.iter().any(|l| l.what == *w)) {
                    return of_term;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no term with {whats:?} within {timeout:?}; log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn overlaps(&self) -> Vec<Line> {
        self.lines()
            .into_iter()
            .filter(|l| l.what == "overlap")
            .collect()
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !self.1 {
            return;
        }
        for line in self.lines() {
            if line.what != "overlap" && alive(line.pid) {
                // SAFETY: kill(2); at worst a leftover of this test.
                unsafe { libc::kill(line.pid, libc::SIGKILL) };
            }
        }
    }
}

/// `/proc/PID/stat`: the state letter and the parent pid.
fn stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Running, or dead but not reaped: anything but gone from /proc.
fn exists(pid: i32) -> bool {
    stat(pid).is_some()
}

/// Running (not a zombie; for processes that re-parented to an init
/// outside the test, which may not reap them).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The pids whose parent is `parent`, and whether each is a zombie.
fn children_of(parent: i32) -> Vec<(i32, bool)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let (state, ppid) = stat(pid)?;
            (ppid == parent).then_some((pid, state == 'Z'))
        })
        .collect()
}

async fn one_sidecar(test: &str) -> (FakeApiServer, Sidecar, PathBuf) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(test);
    let sidecar = Sidecar::spawn(&api, &dir, "a", TIMING);
    sidecar.wait_serving().await;
    (api, sidecar, dir)
}

/// Ends the term by an external holder edit: the sidecar sees it, `exec`
/// stops its tree; the ghost never renews, and after its expiry the
/// sidecar takes the Lease again in a new term.
fn end_term(api: &FakeApiServer) -> Instant {
    api.update_lease(LEASE, |lease| {
        lease["spec"]["holderIdentity"] = json!("ghost")
    });
    Instant::now()
}

/// Term 1's tree (`child_trap` for the child), then a new term: when its
/// child starts, nothing of term 1 is left.
async fn no_process_of_a_term_outlives_it(test: &str, child_trap: &str) {
    let (api, sidecar, dir) = one_sidecar(test).await;
    let log = Log::new(&dir);
    let script = format!("{PROLOGUE}{child_trap}\n{DESCENDANTS}{FOREVER}");
    let exec = spawn_exec(
        &dir,
        "a",
        &format!("http://{}", sidecar.gate),
        &log.0,
        &script,
    );
    let first = log
        .wait_term(&["child", "grandchild", "daemon"], None, TIMING.lease * 2)
        .await;
    let term1 = first[0].term.clone();

    let edited = end_term(&api);
    let second = log
        .wait_term(&["child"], Some(&term1), TIMING.lease * 3)
        .await;
    let started = edited.elapsed();
    assert_eq!(
        log.overlaps(),
        vec![],
        "a process of term {term1} was alive when term {}'s child started; log:\n{}\nexec:\n{}",
        second[0].term,
        log.text(),
        exec.stderr()
    );
    for line in &first {
        assert!(
            !exists(line.pid),
            "{line:?} of the ended term is still there; log:\n{}",
            log.text()
        );
    }
    println!(
        "MEASURE exec tree ({child_trap}): term 2's child started {:.3}s after the holder edit, nothing of term 1 left",
        started.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_ends_with_its_whole_tree_when_the_child_ignores_sigterm() {
    no_process_of_a_term_outlives_it("exec-tree-ignores", "trap '' TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_ends_with_its_whole_tree_when_the_child_exits_on_sigterm() {
    // The issue's case: the child is reaped at once, the grandchild that
    // ignores SIGTERM ran on into the next term.
    no_process_of_a_term_outlives_it("exec-tree-exits", "trap 'exit 0' TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_and_grandchild_die_when_exec_is_sigkilled() {
    let (_api, sidecar, dir) = one_sidecar("exec-tree-sigkill").await;
    let log = Log::new(&dir);
    // No daemon here: what leaves the process group is out of reach once
    // `exec` is gone (README).
    let script = format!(
        "{PROLOGUE}trap '' TERM\n\
         sh -c 'trap \"\" TERM; echo \"grandchild $LEADER_GATE_TERM $$\" >> \"$LOG\"; exec sleep 301' &\n\
         {FOREVER}"
    );
    let mut exec = spawn_exec(
        &dir,
        "a",
        &format!("http://{}", sidecar.gate),
        &log.0,
        &script,
    );
    let tree = log
        .wait_term(&["child", "grandchild"], None, TIMING.lease * 2)
        .await;
    let killed = Instant::now();
    exec.signal(libc::SIGKILL);
    assert!(exec.wait_exit(SECOND * 5).await.is_some(), "exec is gone");
    let deadline = killed + SECOND * 2;
    while tree.iter().any(|l| alive(l.pid)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let gone_after = killed.elapsed();
    for line in &tree {
        assert!(
            !alive(line.pid),
            "{line:?} runs on {gone_after:?} after exec was SIGKILLed; log:\n{}",
            log.text()
        );
    }
    println!(
        "MEASURE exec SIGKILLed: child and grandchild dead {:.1} ms later",
        gone_after.as_secs_f64() * 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_dies_by_its_parent_death_signal_even_without_the_guard() {
    let (_api, sidecar, dir) = one_sidecar("exec-tree-pdeathsig").await;
    let log = Log::new(&dir);
    let script = format!("{PROLOGUE}trap '' TERM\n{FOREVER}");
    let mut exec = spawn_exec(
        &dir,
        "a",
        &format!("http://{}", sidecar.gate),
        &log.0,
        &script,
    );
    let child = log.wait_term(&["child"], None, TIMING.lease * 2).await[0].pid;
    // The guard: exec's other child. Killed first, so only the child's
    // PR_SET_PDEATHSIG is left to act.
    let exec_pid = exec.pid();
    let deadline = Instant::now() + SECOND * 2;
    let guards = loop {
        // Forked just after the child: it may not be there yet.
        let guards: Vec<i32> = children_of(exec_pid)
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|&pid| pid != child)
            .collect();
        if guards.len() == 1 || Instant::now() > deadline {
            break guards;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(guards.len(), 1, "one guard beside the child: {guards:?}");
    // SAFETY: kill(2) on exec's guard, a process of this test.
    unsafe { libc::kill(guards[0], libc::SIGKILL) };
    while alive(guards[0]) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    exec.signal(libc::SIGKILL);
    assert!(exec.wait_exit(SECOND * 5).await.is_some(), "exec is gone");
    let deadline = Instant::now() + SECOND * 2;
    while alive(child) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!alive(child), "the child (pid {child}) outlived exec");
}

/// Whether a new PID namespace can be made here (root, or no seccomp or
/// user-namespace rules against it).
fn pid_namespaces_allowed() -> bool {
    if std::env::var_os("LEADER_GATE_SKIP_PIDNS").is_some_and(|v| v == "1") {
        eprintln!("SKIP: LEADER_GATE_SKIP_PIDNS=1");
        return false;
    }
    let ok = std::process::Command::new("unshare")
        .args(["--fork", "--pid", "--mount-proc", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIP: `unshare --fork --pid --mount-proc` is not permitted here (needs root or CAP_SYS_ADMIN); \
             set LEADER_GATE_SKIP_PIDNS=1 to skip on purpose"
        );
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_exec_reaps_every_orphan_and_ends_each_term_with_its_tree() {
    if !pid_namespaces_allowed() {
        return;
    }
    let (api, sidecar, dir) = one_sidecar("exec-tree-pid1").await;
    // The namespace dies with its PID 1 (unshare --kill-child).
    let log = Log::of_namespace(&dir);
    // Besides the tree of the other tests, a burst of double forks whose
    // orphans exit at once: PID 1 must reap them.
    let script = format!(
        "{PROLOGUE}trap '' TERM\n{DESCENDANTS}\
         for i in 1 2 3 4 5 6; do sh -c 'sleep 0.1 & exit 0'; done\n\
         echo \"forked $LEADER_GATE_TERM $$\" >> \"$LOG\"\n{FOREVER}"
    );
    let stderr = dir.join("exec-pid1.err");
    let mut unshare = tokio::process::Command::new("unshare")
        .args(["--fork", "--pid", "--mount-proc", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["exec", "--url", &format!("http://{}", sidecar.gate)])
        .args(["--grace", "2s", "--", "sh", "-c", &script])
        .env("LOG", log.path())
        .env_remove("LEADER_GATE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn unshare");
    let unshare_pid = unshare.id().unwrap() as i32;
    let exec_stderr = || std::fs::read_to_string(&stderr).unwrap_or_default();

    let first = log
        .wait_term(
            &["child", "grandchild", "daemon", "forked"],
            None,
            TIMING.lease * 2,
        )
        .await;
    let term1 = first[0].term.clone();
    // `exec` on this side of the namespace: unshare's one child.
    let exec_pid = match children_of(unshare_pid).as_slice() {
        [(pid, false)] => *pid,
        other => panic!("unshare's children: {other:?}; exec:\n{}", exec_stderr()),
    };
    let no_zombies = |when: &str| {
        let deadline = Instant::now() + SECOND;
        loop {
            let zombies: Vec<i32> = children_of(exec_pid)
                .into_iter()
                .filter_map(|(pid, zombie)| zombie.then_some(pid))
                .collect();
            if zombies.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{when}: zombies {zombies:?} under exec (PID 1); log:\n{}\nexec:\n{}",
                log.text(),
                exec_stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // The orphans of the burst have exited by now (sleep 0.1).
    tokio::time::sleep(SECOND / 2).await;
    no_zombies("in term 1");

    end_term(&api);
    let second = log
        .wait_term(&["child", "forked"], Some(&term1), TIMING.lease * 3)
        .await;
    assert_eq!(
        log.overlaps(),
        vec![],
        "a process of term {term1} was alive when term {}'s child started; log:\n{}\nexec:\n{}",
        second[0].term,
        log.text(),
        exec_stderr()
    );
    tokio::time::sleep(SECOND / 2).await;
    no_zombies("in term 2");

    // SIGTERM to PID 1 ends it all the usual way.
    // SAFETY: kill(2) on a process of this test (inside its namespace).
    unsafe { libc::kill(exec_pid, libc::SIGTERM) };
    let status = tokio::time::timeout(SECOND * 10, unshare.wait())
        .await
        .expect("exec (PID 1) exits within the grace period")
        .unwrap();
    assert_eq!(status.code(), Some(0), "exec:\n{}", exec_stderr());
}
