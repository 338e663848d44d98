//! The death guard: a small forked process that acts once the process that
//! forked it dies without dismissing it (SIGKILL, an OOM kill) — what that
//! process can no longer do itself.
//!
//! It holds the read end of a pipe whose only write end the parent keeps
//! (close-on-exec, so no other program inherits it): a byte dismisses it,
//! EOF alone means the parent died, and it then fires — SIGKILLs a process
//! group (`exec`'s child tree) or unlinks files (`file-gate`'s copies). It
//! blocks every signal but SIGKILL and leaves the parent's process group, so
//! a signal meant for the parent's group does not end it.
//!
//! Limit: it lives in the parent's PID namespace and cgroup. When the parent
//! is PID 1 the kernel kills the whole namespace with it, and an OOM kill of
//! a cgroup v2 group (`memory.oom.group`) kills both: the guard may then
//! never run.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What the guard does when its parent dies.
pub enum OnDeath<'a> {
    /// SIGKILL this process group.
    KillGroup(i32),
    /// Unlink these paths (each may be gone already).
    Unlink(&'a [&'a Path]),
}

/// The parent's side of a running guard.
pub struct Guard {
    pid: i32,
    /// The write end of its pipe.
    pipe: OwnedFd,
}

/// What the forked process needs, prepared before the fork: after it, only
/// async-signal-safe calls, so no allocation.
enum Prepared {
    KillGroup(i32),
    Unlink(Vec<CString>),
}

impl Guard {
    /// Forks the guard.
    pub fn spawn(on_death: OnDeath<'_>) -> io::Result<Guard> {
        let prepared = match on_death {
            OnDeath::KillGroup(pgid) => Prepared::KillGroup(pgid),
            OnDeath::Unlink(paths) => Prepared::Unlink(
                paths
                    .iter()
                    .map(|p| CString::new(p.as_os_str().as_bytes()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
        };
        let mut fds = [0; 2];
        // SAFETY: pipe2 with a valid two-int array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [read_end, write_end] = fds;
        // SAFETY: the forked process makes only async-signal-safe calls
        // (close, close_range, sigprocmask, setpgid, read, kill, unlink,
        // _exit) on memory prepared before the fork, and never returns into
        // Rust code of the parent.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { guard_main(read_end, write_end, &prepared) }
        }
        // SAFETY: both fds are ours; the read end belongs to the guard.
        unsafe { libc::close(read_end) };
        let pipe = unsafe { OwnedFd::from_raw_fd(write_end) };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Guard { pid, pipe })
    }

    /// The guard's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Tells the guard to exit without firing, and reaps it.
    pub fn dismiss(self) {
        // SAFETY: write(2) of one byte to our own pipe; waitpid on our child.
        unsafe {
            libc::write(self.pipe.as_raw_fd(), b"x".as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// The guard's whole life, in the forked process.
///
/// # Safety
///
/// Only to be called in a just-forked child; it never returns.
unsafe fn guard_main(read_end: i32, write_end: i32, on_death: &Prepared) -> ! {
    unsafe {
        libc::close(write_end);
        // Nothing of the parent's but the pipe: its sockets and its copy of
        // the write end must not outlive it here.
        libc::syscall(libc::SYS_close_range, 3u32, (read_end - 1) as u32, 0u32);
        libc::syscall(libc::SYS_close_range, (read_end + 1) as u32, u32::MAX, 0u32);
        // No signal but SIGKILL ends it; its own group, so a signal to the
        // parent's group does not either.
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        libc::setpgid(0, 0);
        let mut byte = 0u8;
        loop {
            let n = libc::read(read_end, (&mut byte as *mut u8).cast(), 1);
            if n == 1 {
                libc::_exit(0);
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            // EOF: the parent died without dismissing us.
            match on_death {
                Prepared::KillGroup(pgid) => {
                    libc::kill(-pgid, libc::SIGKILL);
                }
                Prepared::Unlink(paths) => {
                    for path in paths {
                        libc::unlink(path.as_ptr());
                    }
                }
            }
            libc::_exit(0);
        }
    }
}
