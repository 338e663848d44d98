//! A stand-in for the kubelet's restarts: runs a container's process again
//! whenever it exits, after a delay that doubles up to a cap (as
//! CrashLoopBackOff's, scaled down), and keeps the exit codes it saw.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The restart loop; dropping it stops the loop (and whatever the current
/// run owns, dropped with its task).
pub struct Kubelet {
    task: tokio::task::JoinHandle<()>,
    exits: Arc<Mutex<Vec<i32>>>,
}

impl Kubelet {
    /// Calls `run(restart)` (0, 1, …) whenever the previous run ended,
    /// waiting `first`, then doubling up to `cap`, in between. A run returns
    /// its exit code, if it has one.
    pub fn start<F, Fut>(first: Duration, cap: Duration, mut run: F) -> Kubelet
    where
        F: FnMut(usize) -> Fut + Send + 'static,
        Fut: Future<Output = Option<i32>> + Send + 'static,
    {
        let exits = Arc::new(Mutex::new(Vec::new()));
        let seen = exits.clone();
        let task = tokio::spawn(async move {
            let mut delay = first;
            for restart in 0.. {
                if let Some(code) = run(restart).await {
                    seen.lock().unwrap().push(code);
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(cap);
            }
        });
        Kubelet { task, exits }
    }

    /// The exit codes so far.
    pub fn exits(&self) -> Vec<i32> {
        self.exits.lock().unwrap().clone()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}
