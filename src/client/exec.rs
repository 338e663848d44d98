//! `leader-gate exec -- COMMAND [ARGS…]`: runs an unmodified collector only
//! while the sidecar says this pod leads, by the validity rule of [`feed`].
//!
//! The child starts on leadership, with the term id in `LEADER_GATE_TERM`
//! and its Lease's shard as [`place`] gives it (also `${…}` in its
//! arguments);
//! when leadership ends or can no longer be confirmed its process group gets
//! SIGTERM, then SIGKILL after the grace period, and is reaped before a new
//! term may start another child, so two terms' children never overlap. A
//! child that exits on its own ends `exec` with its status (the kubelet then
//! restarts the container, and the restart count shows it). SIGTERM or
//! SIGINT stop the child the same way and exit 0 (then, once the
//! tree is gone, `exec` asks the sidecar to hand the Lease over:
//! [`crate::serve::step_down`]); SIGHUP, SIGQUIT, SIGUSR1
//! and SIGUSR2 are forwarded to the child.
//!
//! `exec` is a registered gate ([`Feed::registered`]): once a term's whole
//! tree is reaped and the sidecar said the term stopped — or `exec` is
//! exiting, so it starts nothing more — it acknowledges the term, and the
//! sidecar's graceful release need not wait out its gate lag. "Whole" must
//! be provable: when `exec` is neither a subreaper nor PID 1, or cannot
//! list its children (/proc of another PID namespace), an orphan that left
//! the group could outlive a tree that looks gone, so it registers as a
//! gate that never acknowledges and every release waits the gate lag.
//!
//! "Its process group" is the whole tree of the term (see
//! [`process_tree`]): orphans re-parent to `exec` (a subreaper, or PID 1)
//! and are stopped with the group; the term ends only when nothing of it is
//! left, and every orphan is reaped whenever it exits.
//!
//! Its flags ([`ExecArgs`]) and the check of `--grace` against the default
//! margin ([`check_grace`]) are here too.
//!
//! [`feed`]: crate::client::feed
//! [`place`]: crate::client::place
//! [`process_tree`]: crate::client::process_tree

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::time::{Instant, sleep};

use crate::args::{ConfigError, invalid};
use crate::client::feed::{Feed, Signal};
use crate::client::place::Place;
use crate::client::process_tree::{self, Tree};
use crate::client::url::{ClientArgs, GateUrl};
use crate::duration::{HumanDuration, parse_duration};

/// The environment variable that carries the term id to the child.
pub const TERM_ENV: &str = "LEADER_GATE_TERM";

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Time between SIGTERM and SIGKILL when the command must stop; keep it
    /// within the margin (--lease-duration - --renew-deadline of the sidecar,
    /// 5s with its defaults): 5s or more is warned about, over 5m refused.
    #[arg(long, env = "LEADER_GATE_GRACE", default_value = "3s", value_parser = parse_duration)]
    pub grace: Duration,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The margin `--lease-duration - --renew-deadline` of `serve` with their
/// defaults (15 s - 10 s): what `exec`, which cannot know the sidecar's
/// flags, measures `--grace` against.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(5);
/// `exec --grace` by default: inside [`DEFAULT_MARGIN`] with room for the
/// poll or event that tells `exec` leadership ended.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);
/// The longest `exec --grace`: a collector that needs longer to stop cannot
/// be gated by a lease at all (the margin would have to exceed it, and a
/// crashed leader would be replaced only after that long).
pub const MAX_GRACE: Duration = Duration::from_secs(300);

/// Checks `exec --grace` against the timing rule as far as a client can: it
/// does not know the sidecar's margin, so it measures against the default
/// one. `Ok(Some(warning))` above [`DEFAULT_MARGIN`] (fine only where the
/// sidecar's margin was widened to cover it); an error above [`MAX_GRACE`].
pub fn check_grace(grace: Duration) -> Result<Option<String>, ConfigError> {
    if grace > MAX_GRACE {
        return Err(invalid(
            "--grace",
            format!(
                "must be at most {MAX_GRACE} (got {grace}): the collector may run this long after leadership ended, and no margin (--lease-duration - --renew-deadline of the sidecar) should be that wide",
                MAX_GRACE = HumanDuration(MAX_GRACE),
                grace = HumanDuration(grace),
            ),
        ));
    }
    Ok((grace >= DEFAULT_MARGIN).then(|| {
        format!(
            "warning: --grace {grace} is not below the default margin {DEFAULT_MARGIN} (--lease-duration 15s - --renew-deadline 10s): unless the sidecar's margin is wider than {grace}, a peer's collector may start while this one is still stopping",
            grace = HumanDuration(grace),
            DEFAULT_MARGIN = HumanDuration(DEFAULT_MARGIN),
        )
    }))
}

/// While a term ends: how often to look for what is left of it (and, after
/// the grace period, SIGKILL it again: an orphan may re-parent to `exec`
/// after the first SIGKILL).
const STOP_POLL: Duration = Duration::from_millis(20);

/// What `exec` was asked to do.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    pub url: GateUrl,
    /// Time between SIGTERM and SIGKILL when the child must stop.
    pub grace: Duration,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// The command cannot run at all (say so at once, not at the first term).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("no command given: use `leader-gate exec [OPTIONS] -- COMMAND [ARGS...]`")]
    NoCommand,
    #[error("{0}: command not found")]
    NotFound(String),
    /// The file is there, but the kernel would not run it.
    #[error("cannot start {program}: {why}")]
    CannotStart { program: String, why: String },
}

impl ExecError {
    /// The exit code: 127 for a command that cannot be run, found or not
    /// (as `exec` always has; a crash loop to the kubelet either way).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoCommand => 64,
            Self::NotFound(_) | Self::CannotStart { .. } => 127,
        }
    }
}

/// The running tree and the term it runs for.
struct Running {
    tree: Tree,
    term: String,
    /// Set once the term ended: the tree is being stopped.
    stopping: Option<Stopping>,
    /// The child exited on its own with this status: `exec` exits with it
    /// once the rest of the tree is gone.
    exited: Option<ExitStatus>,
    /// `exec` itself was told to stop: exit 0 once the tree is gone.
    quit: bool,
}

struct Stopping {
    /// When SIGKILL follows the SIGTERM.
    kill_at: Instant,
    killed: bool,
}

/// Runs the gate until the child exits on its own (its status is returned
/// as an exit code) or a SIGTERM/SIGINT stops it (0). An error was said
/// in the log already, and the sidecar told that nothing of its term
/// runs here.
pub async fn run(options: ExecOptions) -> Result<u8, ExecError> {
    let Some(program) = options.command.first() else {
        log(&ExecError::NoCommand.to_string());
        return Err(ExecError::NoCommand);
    };
    let runnable = match resolve(Path::new(program)) {
        None => Err(ExecError::NotFound(program.to_string_lossy().into_owned())),
        Some(path) => match another_architecture(&path) {
            Some(why) => Err(ExecError::CannotStart {
                program: program.to_string_lossy().into_owned(),
                why,
            }),
            None => Ok(()),
        },
    };
    if let Err(error) = runnable {
        // Said at once, on followers too; and a leader's sidecar must hear
        // that nothing of its term runs here, or it counts this gate as
        // running for the whole crash loop (nothing ever started: true
        // whether or not this gate could prove a tree gone).
        tracing::error!("{error}");
        let mut feed = Feed::registered(options.url.clone(), "exec", true);
        end_the_term_here(&mut feed, "the command is not found").await;
        return Err(error);
    }
    let mut signals = Signals::new();
    // A child exited (or stopped): time to reap.
    let mut sigchld = signal(SignalKind::child()).expect("SIGCHLD handler");
    // Orphans of the child's processes re-parent here: reaped, and within
    // reach when the term ends. (PID 1 gets them anyway.)
    let subreaper = match process_tree::become_subreaper() {
        Ok(()) => true,
        Err(error) => {
            log(&format!("cannot become a child subreaper: {error}"));
            false
        }
    };
    // Reaped is not gone unless every orphan comes back here and can be
    // listed: otherwise this gate cannot prove a term's end, and registers
    // as one that never acknowledges (the sidecar waits its gate lag).
    let proves = (subreaper || process_tree::is_init()) && process_tree::sees_its_children();
    if !proves {
        log(
            "cannot prove that a term's whole process tree is gone (not a subreaper, or /proc is not \
             of this PID namespace): never acknowledging a term; the sidecar's release waits its gate lag",
        );
    }
    let mut feed =
        Feed::registered(options.url.clone(), "exec", proves).stopping_within(options.grace);
    let mut running: Option<Running> = None;
    // A term whose tree is gone, to acknowledge once the sidecar says it
    // stopped (only a stop it ran out of here may come back).
    let mut unacknowledged: Option<String> = None;
    let mut said_waiting = false;
    // The sidecar said something (else "not leading" is only "not heard yet").
    let mut heard = false;
    loop {
        if let Some(run) = &mut running {
            run.tree.reap();
            if run.stopping.is_none()
                && let Some(status) = run.tree.child_status()
            {
                log(&format!(
                    "the child exited on its own ({status}): stopping what it left, then exiting with its status"
                ));
                run.exited = Some(status);
                run.stop(options.grace);
            }
            if let Some(stopping) = &mut run.stopping
                && !stopping.killed
                && Instant::now() >= stopping.kill_at
            {
                log(&format!(
                    "the processes of term {} outlived the grace period: SIGKILL",
                    run.term
                ));
                stopping.killed = true;
            }
            if run.stopping.as_ref().is_some_and(|s| s.killed) {
                run.tree.signal_all(libc::SIGKILL);
            }
            if run.stopping.is_some() && run.tree.is_gone() {
                let run = running.take().expect("running");
                let status = run.tree.child_status().expect("reaped");
                log(&format!(
                    "the processes of term {} are gone (the child: {status})",
                    run.term
                ));
                run.tree.release();
                if run.exited.is_some() || run.quit {
                    // Nothing of the term is left, and exec will not start
                    // another child for it: the sidecar may release now.
                    acknowledge(&feed, &run.term).await;
                    if run.quit {
                        // SIGTERM: the pod is going away, its tree is gone.
                        hand_over(&options.url).await;
                        // Stay registered until the sidecar stopped leading:
                        // a gate gone while its pod leads is what a crash
                        // loop looks like to the sidecar's metrics.
                        until_stepped_down(&mut feed, &run.term).await;
                    }
                    return Ok(run.exited.as_ref().map_or(0, exit_code));
                }
                unacknowledged = Some(run.term);
            }
        } else {
            // Idle: orphans re-parented to a subreaper or PID 1 are reaped.
            process_tree::reap_exited();
        }
        // Never for a term this feed says leads again.
        if let Some(term) = unacknowledged.take_if(|term| {
            feed.stopped_term() == Some(term) && feed.leading().is_none_or(|v| &v.term != term)
        }) {
            acknowledge(&feed, &term).await;
        }
        // Reconcile: the tree runs exactly while a term is valid here.
        let valid_term = feed.leading().map(|v| v.term.clone());
        match &mut running {
            Some(run) if run.stopping.is_none() && valid_term.as_ref() != Some(&run.term) => {
                log(&format!(
                    "leadership of term {} ended: stopping the child (pid {}) and its process group",
                    run.term,
                    run.tree.pid()
                ));
                run.stop(options.grace);
            }
            None => {
                if let Some(term) = valid_term {
                    unacknowledged = None;
                    said_waiting = false;
                    match start(&options.command, term.clone(), feed.place()) {
                        Ok(run) => running = Some(run),
                        Err(error) => {
                            // Nothing of the term started, and exec exits:
                            // the sidecar hears it as from a child that
                            // exited, so a crash loop hands the Lease over.
                            tracing::error!("{error}");
                            acknowledge(&feed, &term).await;
                            return Err(error);
                        }
                    }
                } else if !said_waiting && heard {
                    // Once per wait: a follower's exec is otherwise silent.
                    log("not leading: the child starts when this pod leads");
                    said_waiting = true;
                }
            }
            Some(_) => {}
        }
        let stopping = running.as_ref().is_some_and(|r| r.stopping.is_some());
        tokio::select! {
            signal = feed.next() => {
                heard |= matches!(signal, Signal::Event(_));
                if let Some(line) = signal.log_line() {
                    log(&line);
                }
            }
            _ = sigchld.recv() => {}
            () = sleep(STOP_POLL), if stopping => {}
            received = signals.next() => {
                if received == libc::SIGTERM || received == libc::SIGINT {
                    let Some(run) = &mut running else {
                        if let Some(term) = unacknowledged {
                            acknowledge(&feed, &term).await;
                        }
                        return Ok(0);
                    };
                    run.quit = true;
                    if run.stopping.is_none() {
                        run.stop(options.grace);
                    }
                } else if let Some(run) = &running {
                    run.tree.signal_child(received);
                }
            }
        }
    }
}

/// Starts the command for `term`; with the Lease's `place`, in its
/// environment and substituted in its arguments.
fn start(command: &[OsString], term: String, place: Option<&Place>) -> Result<Running, ExecError> {
    let mut cmd = Command::new(&command[0]);
    cmd.env(TERM_ENV, &term);
    match place {
        Some(place) => {
            cmd.envs(place.vars());
            cmd.args(
                command[1..]
                    .iter()
                    .map(|arg| OsString::from_vec(place.substitute(arg.as_bytes()))),
            );
        }
        None => {
            cmd.args(&command[1..]);
        }
    }
    let tree = Tree::spawn(&mut cmd).map_err(|error| ExecError::CannotStart {
        program: command[0].to_string_lossy().into_owned(),
        why: why_not_started(Path::new(&command[0]), &error),
    })?;
    log(&format!(
        "leading (term {term}): started the child (pid {})",
        tree.pid()
    ));
    Ok(Running {
        tree,
        term,
        stopping: None,
        exited: None,
        quit: false,
    })
}

// === impl Running ===

impl Running {
    /// SIGTERM to the whole tree; SIGKILL follows after `grace`.
    fn stop(&mut self, grace: Duration) {
        self.tree.signal_all(libc::SIGTERM);
        self.stopping = Some(Stopping {
            kill_at: Instant::now() + grace,
            killed: false,
        });
    }
}

/// The shell's convention: the exit code, or 128 + the signal.
fn exit_code(status: &ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => 1,
    }
}

/// `program` as the kernel would find it: a path, or a name on `$PATH`.
fn resolve(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

/// Why the kernel would not run `program`, a file that exists, in words
/// that name the likely cause: `execve` says "No such file" for a missing
/// interpreter or loader, and "Exec format error" for another architecture.
fn why_not_started(program: &Path, error: &std::io::Error) -> String {
    let path = resolve(program).unwrap_or_else(|| program.to_owned());
    match error.raw_os_error() {
        Some(libc::ENOENT) => match interpreter(&path) {
            Some(interpreter) => format!(
                "its interpreter {interpreter} (the script's #! line) does not exist in this container"
            ),
            None => "the kernel found no loader for it (a program built for another libc, \
                     or its ELF interpreter is missing from this image)"
                .to_owned(),
        },
        Some(libc::ENOEXEC) => "exec format error: not a program this machine can run \
                                (built for another architecture? an amd64 image on an arm64 node)"
            .to_owned(),
        Some(libc::EACCES) => format!(
            "permission denied ({error}): a filesystem mounted noexec, or not executable by this user"
        ),
        _ => error.to_string(),
    }
}

/// Why `path` cannot run here if it is a program for another architecture
/// (an amd64 image on an arm64 node): said before it is started, because
/// the kernel's "exec format error" never reaches `exec` — glibc's
/// `execvp` hands such a file to `/bin/sh`, which fails with a shell's
/// message of its own, or is missing.
fn another_architecture(path: &Path) -> Option<String> {
    use std::io::Read;
    let native: u16 = if cfg!(target_arch = "x86_64") {
        62 // EM_X86_64
    } else if cfg!(target_arch = "aarch64") {
        183 // EM_AARCH64
    } else {
        return None;
    };
    let mut head = [0u8; 20];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if head[..4] != *b"\x7fELF" {
        return None;
    }
    let machine = match head[5] {
        1 => u16::from_le_bytes([head[18], head[19]]),
        2 => u16::from_be_bytes([head[18], head[19]]),
        _ => return None,
    };
    let name = |machine: u16| match machine {
        3 => "i386".to_owned(),
        40 => "arm".to_owned(),
        62 => "amd64".to_owned(),
        183 => "arm64".to_owned(),
        243 => "riscv64".to_owned(),
        other => format!("ELF machine {other}"),
    };
    (machine != native).then(|| {
        format!(
            "exec format error: a program for {} on this {} machine (an image of another architecture?)",
            name(machine),
            name(native)
        )
    })
}

/// The interpreter a script names on its `#!` line, if it is one.
fn interpreter(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let word = String::from_utf8_lossy(line)
        .split_whitespace()
        .next()?
        .to_owned();
    Some(word)
}

/// Before `exec` exits because its command cannot start: tells the
/// sidecar that nothing of the term it leads runs here (registering, then
/// acknowledging it), so that its collector policy counts this pod's
/// collector as not running. Bounded: it waits for the sidecar's first
/// word only, and gives up at once when the sidecar cannot be reached
/// (then nothing was registered there).
async fn end_the_term_here(feed: &mut Feed, why: &str) {
    let deadline = Instant::now() + TELL_TIMEOUT;
    loop {
        tokio::select! {
            signal = feed.next() => match signal {
                Signal::Event(_) => break,
                Signal::Disconnected(_) => return,
                Signal::Connected | Signal::Expired { .. } | Signal::Resumed(_) => {}
            },
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
    if let Some(term) = feed.leading().map(|v| v.term.clone()) {
        log(&format!(
            "leading, but {why}: nothing of term {term} will run here"
        ));
        acknowledge(feed, &term).await;
    }
}

/// Bound on [`end_the_term_here`]: a local sidecar answers at once.
const TELL_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells the sidecar that `term` is over here (best-effort: without it the
/// sidecar waits its gate lag); nothing when this gate cannot prove it.
async fn acknowledge(feed: &Feed, term: &str) {
    if !feed.acknowledges() {
        return;
    }
    match feed.acknowledgement(term.to_owned()).await {
        Ok(term) => log(&format!(
            "told the sidecar that nothing of term {term} runs here"
        )),
        Err(why) => log(&why),
    }
}

/// After a SIGTERM stopped the whole tree: asks the sidecar to hand over
/// now rather than when the kubelet stops it, after this container exited
/// (best-effort, bounded: a follower has nothing to hand over).
async fn hand_over(url: &crate::client::url::GateUrl) {
    match crate::client::prestop::ask(url, HAND_OVER_TIMEOUT).await {
        Ok(_) => log("asked the sidecar to hand the Lease over"),
        Err(why) => log(&why),
    }
}

/// Waits, for [`HAND_OVER_TIMEOUT`] at most, until the sidecar no longer
/// leads `term` (a step-down it was asked for is published at once).
async fn until_stepped_down(feed: &mut Feed, term: &str) {
    let deadline = Instant::now() + HAND_OVER_TIMEOUT;
    while feed.leading().is_some_and(|v| v.term == term) {
        tokio::select! {
            _ = feed.next() => {}
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// Bound on the step-down request of [`hand_over`].
const HAND_OVER_TIMEOUT: Duration = Duration::from_secs(1);

fn log(message: &str) {
    // Through tracing: `leader-gate exec: message` as text, or the pod's
    // JSON lines (main.rs sets the format up).
    tracing::info!("{message}");
}

/// The signals `exec` handles.
struct Signals(Vec<(i32, UnixSignal)>);

impl Signals {
    fn new() -> Self {
        let kinds = [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ];
        Self(
            kinds
                .into_iter()
                .map(|n| (n, signal(SignalKind::from_raw(n)).expect("signal handler")))
                .collect(),
        )
    }

    /// The next signal received, by number.
    async fn next(&mut self) -> i32 {
        let waits = self.0.iter_mut().map(|(number, stream)| {
            Box::pin(async move {
                stream.recv().await;
                *number
            })
        });
        futures::future::select_all(waits).await.0
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `exec`'s flags alone, as the binary's command line flattens them.
    #[derive(Debug, Parser)]
    struct Exec {
        #[command(flatten)]
        args: ExecArgs,
    }

    fn exec_grace(extra: &[&str]) -> Duration {
        let mut argv = vec!["exec"];
        argv.extend_from_slice(extra);
        argv.extend_from_slice(&["--", "true"]);
        Exec::try_parse_from(argv).unwrap().args.grace
    }

    #[test]
    fn exec_grace_is_warned_about_above_the_default_margin_and_refused_when_absurd() {
        assert_eq!(check_grace(Duration::ZERO), Ok(None));
        assert_eq!(check_grace(Duration::from_millis(4999)), Ok(None));
        let warning = check_grace(Duration::from_secs(5)).unwrap().unwrap();
        assert!(warning.contains("--grace 5s"), "{warning}");
        assert!(warning.contains("default margin 5s"), "{warning}");
        assert!(
            check_grace(exec_grace(&["--grace", "10s"]))
                .unwrap()
                .is_some()
        );
        assert!(check_grace(MAX_GRACE).is_ok());
        let error = check_grace(MAX_GRACE + Duration::from_millis(1)).unwrap_err();
        assert_eq!(error.flag, "--grace");
        assert!(
            error
                .to_string()
                .starts_with("invalid --grace: must be at most 5m (got 5m0.001s)"),
            "{error}"
        );
    }

    #[test]
    fn commands_are_found_as_the_kernel_would_find_them() {
        assert!(resolve(Path::new("sh")).is_some());
        assert!(resolve(Path::new("/bin/sh")).is_some());
        assert!(resolve(Path::new("no-such-collector-xyz")).is_none());
        let plain = std::env::temp_dir().join(format!("leader-gate-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        assert!(resolve(&plain).is_none(), "not executable");
        let _ = std::fs::remove_file(plain);
    }

    #[test]
    fn a_command_that_exists_but_cannot_start_is_said_with_its_likely_cause() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("leader-gate-why-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("script");
        std::fs::write(&script, "#!/bin/bash -e\necho hi\n").unwrap();
        let binary = dir.join("binary");
        std::fs::write(&binary, b"\x7fELF\x02\x01\x01garbage").unwrap();
        for file in [&script, &binary] {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        let why = why_not_started(&script, &enoent);
        assert!(
            why.starts_with("its interpreter /bin/bash (the script's #! line) does not exist"),
            "{why}"
        );
        let why = why_not_started(&binary, &enoent);
        assert!(why.contains("no loader"), "{why}");
        let enoexec = std::io::Error::from_raw_os_error(libc::ENOEXEC);
        assert!(why_not_started(&binary, &enoexec).starts_with("exec format error"));
        // A program for another architecture is told before it is started
        // (glibc's execvp would hand it to /bin/sh).
        let foreign = dir.join("foreign");
        let machine: u16 = if cfg!(target_arch = "aarch64") {
            62
        } else {
            183
        };
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(18, 0);
        elf.extend_from_slice(&machine.to_le_bytes());
        elf.extend_from_slice(b"rest of the header");
        std::fs::write(&foreign, &elf).unwrap();
        let why = another_architecture(&foreign).expect("another architecture");
        assert!(why.starts_with("exec format error: a program for"), "{why}");
        assert_eq!(
            another_architecture(&std::env::current_exe().unwrap()),
            None
        );
        assert_eq!(another_architecture(&script), None);
        let eacces = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(why_not_started(&binary, &eacces).contains("noexec"));
        let error = ExecError::CannotStart {
            program: "collector".into(),
            why: "because".into(),
        };
        assert_eq!(error.to_string(), "cannot start collector: because");
        assert_eq!(error.exit_code(), 127);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(&ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
