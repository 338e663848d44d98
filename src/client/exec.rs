//! `leader-gate exec -- COMMAND [ARGS…]`: runs an unmodified collector only
//! while the sidecar says this pod leads, by the validity rule of [`feed`].
//!
//! The child starts on leadership, with the term id in `LEADER_GATE_TERM`;
//! when leadership ends or can no longer be confirmed its process group gets
//! SIGTERM, then SIGKILL after the grace period, and is reaped before a new
//! term may start another child, so two terms' children never overlap. A
//! child that exits on its own ends `exec` with its status (the kubelet then
//! restarts the container, and the restart count shows it). SIGTERM or
//! SIGINT stop the child the same way and exit 0; SIGHUP, SIGQUIT, SIGUSR1
//! and SIGUSR2 are forwarded to the child.
//!
//! [`feed`]: crate::client::feed

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::client::feed::Feed;
use crate::client::url::GateUrl;

/// The environment variable that carries the term id to the child.
pub const TERM_ENV: &str = "LEADER_GATE_TERM";

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
}

impl ExecError {
    /// The exit code a shell would use.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoCommand => 64,
            Self::NotFound(_) => 127,
        }
    }
}

/// The running child and the term it runs for.
struct Running {
    child: Child,
    pid: i32,
    term: String,
    /// Set once it was told to stop: when SIGKILL follows.
    kill_at: Option<Instant>,
}

/// Runs the gate until the child exits on its own (its status is returned
/// as an exit code) or a SIGTERM/SIGINT stops it (0).
pub async fn run(options: ExecOptions) -> Result<u8, ExecError> {
    let program = options.command.first().ok_or(ExecError::NoCommand)?;
    resolve(Path::new(program))
        .ok_or_else(|| ExecError::NotFound(program.to_string_lossy().into_owned()))?;
    let mut signals = Signals::new();
    let mut feed = Feed::new(options.url.clone());
    let mut running: Option<Running> = None;
    loop {
        // Reconcile: the child runs exactly while a term is valid here.
        let valid_term = feed.leading().map(|v| v.term.clone());
        match &mut running {
            Some(run) if run.kill_at.is_none() && valid_term.as_ref() != Some(&run.term) => {
                log(&format!(
                    "leadership of term {} ended: stopping the child (pid {})",
                    run.term, run.pid
                ));
                run.stop(options.grace);
            }
            None => {
                if let Some(term) = valid_term {
                    running = Some(start(&options.command, term)?);
                }
            }
            Some(_) => {}
        }
        let kill_at = running.as_ref().and_then(|r| r.kill_at);
        tokio::select! {
            signal = feed.next() => {
                if let Some(line) = signal.log_line() {
                    log(&line);
                }
            }
            status = wait_child(&mut running) => {
                let run = running.take().expect("a child was running");
                if run.kill_at.is_some() {
                    log(&format!("the child of term {} stopped ({})", run.term, describe(&status)));
                } else {
                    log(&format!("the child exited on its own ({}): exiting with its status", describe(&status)));
                    return Ok(exit_code(&status));
                }
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                if let Some(run) = &mut running {
                    log(&format!("the child (pid {}) outlived the grace period: SIGKILL", run.pid));
                    run.kill();
                }
            }
            received = signals.next() => {
                if received == libc::SIGTERM || received == libc::SIGINT {
                    if let Some(run) = running.take() {
                        run.stop_and_reap(options.grace).await;
                    }
                    return Ok(0);
                }
                if let Some(run) = &running {
                    forward(run.pid, received);
                }
            }
        }
    }
}

fn start(command: &[OsString], term: String) -> Result<Running, ExecError> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env(TERM_ENV, &term)
        // Its own process group, so a stop reaches whatever it started.
        .process_group(0)
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|error| {
        log(&format!("cannot start {:?}: {error}", command[0]));
        ExecError::NotFound(command[0].to_string_lossy().into_owned())
    })?;
    let pid = child.id().expect("a just-spawned child has a pid") as i32;
    log(&format!(
        "leading (term {term}): started the child (pid {pid})"
    ));
    Ok(Running {
        child,
        pid,
        term,
        kill_at: None,
    })
}

// === impl Running ===

impl Running {
    /// SIGTERM to the child's process group; SIGKILL follows after `grace`.
    fn stop(&mut self, grace: Duration) {
        signal_group(self.pid, libc::SIGTERM);
        self.kill_at = Some(Instant::now() + grace);
    }

    fn kill(&mut self) {
        signal_group(self.pid, libc::SIGKILL);
        self.kill_at = Some(Instant::now() + Duration::from_secs(3600));
    }

    async fn stop_and_reap(mut self, grace: Duration) {
        if self.kill_at.is_none() {
            self.stop(grace);
        }
        let kill_at = self.kill_at.expect("stopping");
        if tokio::time::timeout_at(kill_at, self.child.wait())
            .await
            .is_err()
        {
            self.kill();
            let _ = self.child.wait().await;
        }
        log(&format!("stopped the child of term {}", self.term));
    }
}

async fn wait_child(running: &mut Option<Running>) -> std::io::Result<ExitStatus> {
    match running {
        Some(run) => run.child.wait().await,
        None => std::future::pending().await,
    }
}

fn signal_group(pid: i32, signal: i32) {
    // SAFETY: kill(2) on the process group of our own unreaped child (its
    // pid cannot have been reused before we reap it).
    unsafe { libc::kill(-pid, signal) };
}

fn forward(pid: i32, signal: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(pid, signal) };
}

/// The shell's convention: the exit code, or 128 + the signal.
fn exit_code(status: &std::io::Result<ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => 128u8.saturating_add(signal as u8),
            (None, None) => 1,
        },
        Err(_) => 1,
    }
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(error) => format!("cannot wait for it: {error}"),
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

fn log(message: &str) {
    eprintln!("leader-gate exec: {message}");
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
    use super::*;

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
    fn exit_codes_follow_the_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(&Ok(ExitStatus::from_raw(3 << 8))), 3);
        assert_eq!(exit_code(&Ok(ExitStatus::from_raw(libc::SIGKILL))), 137);
    }
}
