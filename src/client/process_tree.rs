//! The process tree `exec` runs for one term, and its end.
//!
//! - The child gets a process group of its own, and `PR_SET_PDEATHSIG`
//!   (SIGKILL) with a check right after it that `exec` did not die first.
//! - `exec` is a child subreaper (and PID 1 is one anyway), so whatever the
//!   child's processes orphan re-parents to `exec`: it is reaped here
//!   (`waitpid(-1)` on every SIGCHLD, idle or not), and it is still within
//!   reach when a term ends, even if it left the process group.
//! - A term ends when the child is reaped, its process group is empty and
//!   `exec` has no other child left: not before. A group once seen empty
//!   is never signalled again (its id may then name another group).
//! - That end is *proven* only if orphans come back to `exec` (a subreaper,
//!   or PID 1) and `exec` can list its children ([`sees_its_children`]);
//!   otherwise an orphan that left the group may outlive a tree reported
//!   gone, and `exec` must not acknowledge the term (see [`exec`]).
//! - PDEATHSIG reaches only the direct child. For its descendants, unless
//!   `exec` is PID 1 (then the kernel kills the whole PID namespace with
//!   it), a [`death_guard`](crate::client::death_guard) SIGKILLs the
//!   group if `exec` dies without dismissing it.
//!
//! [`exec`]: crate::client::exec

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use crate::client::death_guard::{Guard, OnDeath};

/// Makes this process a child subreaper: orphaned descendants re-parent to
/// it instead of to init, so they can be stopped and reaped.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is PID 1 of its PID namespace.
pub fn is_init() -> bool {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() == 1 }
}

/// Reaps every child that has exited, without waiting: the pid and wait
/// status of each.
pub fn reap_exited() -> Vec<(i32, i32)> {
    let mut reaped = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer to an int.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return reaped;
        }
        reaped.push((pid, status));
    }
}

/// Whether this process can list its own children: /proc is of its own PID
/// namespace (say `unshare --pid` without `--mount-proc`, and /proc names
/// other processes by these numbers: never signal those) and readable.
/// Without it only the process group is within reach, and a tree's end
/// cannot be proven.
pub fn sees_its_children() -> bool {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let own_proc = std::fs::read_link("/proc/self")
        .is_ok_and(|link| link.as_os_str().to_str() == Some(me.to_string().as_str()));
    own_proc && std::fs::read_dir("/proc").is_ok()
}

/// The pids whose parent is this process (from /proc; zombies included),
/// without `except`; none when it [cannot see them](sees_its_children).
fn children(except: Option<i32>) -> Vec<i32> {
    if !sees_its_children() {
        return Vec::new();
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| Some(pid) != except)
        .filter(|&pid| parent_of(pid) == Some(me))
        .collect()
}

/// The parent pid from /proc/PID/stat (the field after the `(comm)`).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

/// One term's child and everything it started.
pub struct Tree {
    /// The child's pid, which is also its process group id.
    pid: i32,
    group: Group,
    status: Option<ExitStatus>,
    guard: Option<Guard>,
    released: bool,
}

impl Tree {
    /// Spawns `command` as the leader of a new process group that dies with
    /// `exec`.
    pub fn spawn(command: &mut Command) -> io::Result<Tree> {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        command.process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // `exec` may have died before the prctl: then nobody would
                // ever send the signal.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            })
        };
        let child = command.spawn()?;
        let pid = child.id() as i32;
        // Never waited for through `child`: reaped by `reap_exited`.
        drop(child);
        let guard = if is_init() {
            None
        } else {
            match Guard::spawn(OnDeath::KillGroup(pid)) {
                Ok(guard) => Some(guard),
                Err(error) => {
                    tracing::warn!("cannot start the guard of process group {pid}: {error}");
                    None
                }
            }
        };
        Ok(Tree {
            pid,
            group: Group::new(pid),
            status: None,
            guard,
            released: false,
        })
    }

    /// The child's pid (and process group id).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The child's exit status, once reaped.
    pub fn child_status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Reaps whatever exited (orphans included), keeping the child's status.
    pub fn reap(&mut self) {
        for (pid, status) in reap_exited() {
            if pid == self.pid {
                self.status = Some(ExitStatus::from_raw(status));
            } else if self.guard.as_ref().is_some_and(|g| g.pid() == pid) {
                tracing::warn!("the guard (pid {pid}) died");
                self.guard = None;
            }
        }
    }

    /// Sends `signal` to the child unless it was reaped already.
    pub fn signal_child(&self, signal: i32) {
        if self.status.is_none() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(self.pid, signal) };
        }
    }

    /// Sends `signal` once to each process of the tree: the child's process
    /// group, and every other child of `exec` (orphans that left the group),
    /// except the guard.
    pub fn signal_all(&mut self, signal: i32) {
        self.group.signal(signal, self.status.is_some());
        for pid in children(self.guard.as_ref().map(Guard::pid)) {
            // SAFETY: getpgid and kill(2) on our own child, not yet reaped
            // (zombies are listed too, so the pid cannot have been reused).
            // Members of the group had this signal already: a second
            // SIGTERM would run a collector's handler twice.
            unsafe {
                if libc::getpgid(pid) != self.pid {
                    libc::kill(pid, signal);
                }
            }
        }
    }

    /// Reaps, then says whether nothing of this tree is left: the child is
    /// reaped, its group is empty and `exec` has no other child.
    pub fn is_gone(&mut self) -> bool {
        self.reap();
        if self.status.is_none() {
            return false;
        }
        !self.group.may_live(true) && children(self.guard.as_ref().map(Guard::pid)).is_empty()
    }

    /// Dismisses the guard once the tree is gone.
    pub fn release(mut self) {
        self.released = true;
        if let Some(guard) = self.guard.take() {
            guard.dismiss();
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if !self.released {
            self.signal_all(libc::SIGKILL);
        }
    }
}

/// The child's process group. Its id cannot be handed to another group
/// while the child (its leader) is unreaped or a member lives; once it is
/// seen empty after the child was reaped, it may be, so it is never
/// signalled again.
struct Group {
    id: i32,
    emptied: bool,
}

impl Group {
    fn new(id: i32) -> Self {
        Self { id, emptied: false }
    }

    /// Sends `signal` to the group unless it was seen empty.
    fn signal(&mut self, signal: i32, leader_reaped: bool) {
        if self.may_live(leader_reaped) {
            // SAFETY: kill(2) on a group whose id is still ours (above).
            unsafe { libc::kill(-self.id, signal) };
        }
    }

    /// Whether a member may still live; once the leader is reaped, an
    /// empty group stays empty for good (as far as we are concerned).
    fn may_live(&mut self, leader_reaped: bool) -> bool {
        if self.emptied {
            return false;
        }
        if !leader_reaped {
            return true;
        }
        // SAFETY: kill(2) with signal 0 only checks for existence.
        let alive = unsafe { libc::kill(-self.id, 0) } == 0
            || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        self.emptied = !alive;
        alive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the group was seen empty, its id may be handed to another
    /// group (here on purpose, through `ns_last_pid`): that group must never
    /// get the signals meant for the term's.
    #[test]
    fn an_emptied_group_is_not_signalled_again_when_its_id_is_reused() {
        use std::process::Command;
        let mut first = Command::new("true").process_group(0).spawn().unwrap();
        let id = first.id() as i32;
        first.wait().unwrap();
        let mut group = Group::new(id);
        assert!(!group.may_live(true), "the group emptied with its leader");
        // The kernel hands out `ns_last_pid + 1` next, if nothing else in
        // this namespace forks first (tests run in parallel): retry.
        let mut bystander = None;
        for _ in 0..100 {
            if let Err(error) = std::fs::write("/proc/sys/kernel/ns_last_pid", (id - 1).to_string())
            {
                eprintln!("skipped: cannot choose the next pid ({error}); needs root");
                return;
            }
            let mut child = Command::new("sleep")
                .arg("30")
                .process_group(0)
                .spawn()
                .unwrap();
            if child.id() as i32 == id {
                bystander = Some(child);
                break;
            }
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let mut bystander = bystander.expect("the id was handed out again");
        group.signal(libc::SIGKILL, true);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let survived = bystander.try_wait().unwrap().is_none();
        bystander.kill().ok();
        bystander.wait().unwrap();
        assert!(survived, "the new group under the old id was killed");
    }

    #[test]
    fn the_parent_is_read_after_the_command_name() {
        // SAFETY: getpid/getppid have no preconditions.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        assert_eq!(parent_of(me), Some(parent));
        assert_eq!(parent_of(-1), None);
    }
}
