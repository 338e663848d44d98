//! The death guard: a small forked process that acts once the process that
//! forked it dies without dismissing it (SIGKILL, an OOM kill) — what that
//! process can no longer do itself.
//!
//! It holds the read end of a pipe whose only write end the parent keeps
//! (close-on-exec, so no other program inherits it): a byte dismisses it,
//! EOF alone means the parent died, and it then fires — SIGKILLs a process
//! group (`exec`'s child tree) or unlinks files (`file-gate`'s copies, then,
//! given a [`Post`], tells the collector with a reload POST). It blocks
//! every signal but SIGKILL and leaves the parent's process group, so a
//! signal meant for the parent's group does not end it.
//!
//! Being a fork of a multi-threaded process, it may make only
//! async-signal-safe calls: everything it needs is prepared before the fork
//! (C strings, the resolved socket address, the whole request), and the
//! POST is plain syscalls on those buffers — `socket`, `setsockopt` (5 s
//! send and receive timeouts, which also bound `connect`), `connect`,
//! `write`, `read` of the status line, `close` — tried up to
//! [`POST_TRIES`] times, 200 ms doubling to 3 s apart, until the answer's
//! status is 2xx. It proves nothing to the sidecar (the dead gate cannot
//! acknowledge; its restart sends its own reload): it only shortens the
//! time a collector keeps a removed copy loaded.
//!
//! Limit: it lives in the parent's PID namespace and cgroup. When the parent
//! is PID 1 the kernel kills the whole namespace with it, and an OOM kill of
//! a cgroup v2 group (`memory.oom.group`) kills both: the guard may then
//! never run.

use std::ffi::CString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How many times the guard tries its POST.
pub const POST_TRIES: u32 = 6;

/// What the guard does when its parent dies.
pub enum OnDeath<'a> {
    /// SIGKILL this process group.
    KillGroup(i32),
    /// Unlink these paths (each may be gone already), then send the POST
    /// if one is given.
    Unlink(&'a [&'a Path], Option<Post>),
}

/// An HTTP/1.1 request to send as it is (a collector's reload).
pub struct Post {
    pub addr: SocketAddr,
    /// The whole request, head and (empty) body.
    pub request: Vec<u8>,
}

/// A [`Post`] as raw parts, ready for the syscalls.
struct PreparedPost {
    family: libc::c_int,
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
    request: Vec<u8>,
}

impl PreparedPost {
    fn new(post: Post) -> Self {
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let (family, len) = match post.addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than sockaddr_in.
                unsafe { std::ptr::write((&mut addr as *mut libc::sockaddr_storage).cast(), sin) };
                (libc::AF_INET, std::mem::size_of::<libc::sockaddr_in>())
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than sockaddr_in6.
                unsafe { std::ptr::write((&mut addr as *mut libc::sockaddr_storage).cast(), sin6) };
                (libc::AF_INET6, std::mem::size_of::<libc::sockaddr_in6>())
            }
        };
        Self {
            family,
            addr,
            len: len as libc::socklen_t,
            request: post.request,
        }
    }
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
    Unlink(Vec<CString>, Option<PreparedPost>),
}

impl Guard {
    /// Forks the guard.
    pub fn spawn(on_death: OnDeath<'_>) -> io::Result<Guard> {
        let prepared = match on_death {
            OnDeath::KillGroup(pgid) => Prepared::KillGroup(pgid),
            OnDeath::Unlink(paths, post) => Prepared::Unlink(
                paths
                    .iter()
                    .map(|p| CString::new(p.as_os_str().as_bytes()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
                post.map(PreparedPost::new),
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
        // socket, setsockopt, connect, write, nanosleep, _exit) on memory
        // prepared before the fork, and never returns into Rust code of the
        // parent.
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
                Prepared::Unlink(paths, post) => {
                    for path in paths {
                        libc::unlink(path.as_ptr());
                    }
                    if let Some(post) = post {
                        post_until_2xx(post);
                    }
                }
            }
            libc::_exit(0);
        }
    }
}

/// Sends `post` until it is answered 2xx, [`POST_TRIES`] times at most.
///
/// # Safety
///
/// Async-signal-safe calls only, on memory prepared before the fork.
unsafe fn post_until_2xx(post: &PreparedPost) {
    let mut delay_ms: libc::c_long = 200;
    for _ in 0..POST_TRIES {
        if unsafe { post_once(post) } {
            return;
        }
        let pause = libc::timespec {
            tv_sec: (delay_ms / 1000) as libc::time_t,
            tv_nsec: (delay_ms % 1000) * 1_000_000,
        };
        unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        delay_ms = (delay_ms * 2).min(3000);
    }
}

/// One POST: whether its answer's status is 2xx.
///
/// # Safety
///
/// Async-signal-safe calls only, on memory prepared before the fork.
unsafe fn post_once(post: &PreparedPost) -> bool {
    unsafe {
        let fd = libc::socket(post.family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        // Bounds connect(2) too, on Linux.
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        for option in [libc::SO_SNDTIMEO, libc::SO_RCVTIMEO] {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        let answered_2xx = libc::connect(
            fd,
            (&post.addr as *const libc::sockaddr_storage).cast(),
            post.len,
        ) == 0
            && write_all(fd, &post.request)
            && status_is_2xx(fd);
        libc::close(fd);
        answered_2xx
    }
}

/// Writes all of `bytes` to `fd`.
///
/// # Safety
///
/// `fd` is an open socket; write(2) only.
unsafe fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Reads the start of the answer: `HTTP/1.x 2…`.
///
/// # Safety
///
/// `fd` is an open socket; read(2) only, into a buffer on the stack.
unsafe fn status_is_2xx(fd: i32) -> bool {
    let mut head = [0u8; 12];
    let mut got = 0;
    while got < head.len() {
        let n = unsafe { libc::read(fd, head[got..].as_mut_ptr().cast(), head.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    is_2xx_status_line(&head[..got])
}

/// Whether `head` starts a status line with a 2xx status.
fn is_2xx_status_line(head: &[u8]) -> bool {
    head.starts_with(b"HTTP/1.") && head.len() >= 10 && head[8] == b' ' && head[9] == b'2'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_2xx_status_line_counts() {
        assert!(is_2xx_status_line(b"HTTP/1.1 200 OK\r\n"));
        assert!(is_2xx_status_line(b"HTTP/1.0 204"));
        for other in [
            &b"HTTP/1.1 500 Internal"[..],
            b"HTTP/1.1 302 Found",
            b"HTTP/1.1 ",
            b"",
            b"garbage 200 OK",
        ] {
            assert!(!is_2xx_status_line(other), "{other:?}");
        }
    }
}
