//! Test support shared by the integration tests: a fake Kubernetes Lease API
//! server, helpers that run real `leader-gate` processes against it (pods
//! with gates, the chaos harness and its history checker), and a real
//! Prometheus as a collector.

pub mod chaos;
pub mod events;
pub mod fake_apiserver;
pub mod file_gate;
pub mod gate_clients;
pub mod gate_pods;
pub mod health;
pub mod history;
pub mod kubelet;
pub mod monitor;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod sidecar;

/// Reads the head of one HTTP request (up to its blank line, and what came
/// with it), as the tests' stand-ins for a collector do; `None` when the
/// peer closed or failed first.
pub async fn read_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// Raises this process's open-file limit to `wanted` (or the hard limit), for
/// tests and benchmarks that open a thousand connections.
pub fn raise_fd_limit(wanted: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        // Never lowers it: the tests share one process, and another may hold more.
        limit.rlim_cur = limit.rlim_cur.max(limit.rlim_max.min(wanted));
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

#[cfg(test)]
mod tests {
    fn soft_limit() -> u64 {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain getrlimit on this process with a valid struct.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        limit.rlim_cur
    }

    /// The tests share one process: a test asking for fewer files must not
    /// take them from one that raised the limit higher and uses them now.
    #[test]
    fn raising_the_fd_limit_never_lowers_it() {
        super::raise_fd_limit(16_384);
        let raised = soft_limit();
        super::raise_fd_limit(8192);
        assert_eq!(soft_limit(), raised);
    }
}
