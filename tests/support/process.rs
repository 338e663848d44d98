//! A child process a test owns: signals, a bounded wait for its exit, and a
//! kill on drop if it is still running, so no test leaves processes behind.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

pub struct Owned {
    child: Child,
    exit: Option<ExitStatus>,
}

impl Owned {
    pub fn new(child: Child) -> Owned {
        Owned { child, exit: None }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid with a valid signal number;
        // the pid is not reused before we reap it.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait");
        }
        self.exit
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
