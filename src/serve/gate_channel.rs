//! Who may register a gate and acknowledge a term: the gate channel.
//!
//! An acknowledgement lets a graceful release skip the gate lag, so it must
//! come from this pod's own containers and from nowhere else. Loopback
//! means "this pod" only while the pod has a network namespace of its own:
//! under `hostNetwork: true` every pod and process of the node shares
//! `127.0.0.1`. A Unix socket in a directory only this pod mounts (an
//! `emptyDir`, `--gate-socket`) is pod-local by construction, whatever the
//! networking. So:
//!
//! - with `--gate-socket`, registrations and acknowledgements are taken from
//!   the socket alone ([`GateChannel::Socket`]);
//! - without it, from a loopback address ([`GateChannel::Loopback`]) —
//!   unless the pod uses the node's network (its IP is the node's, from the
//!   downward API): then from nobody ([`GateChannel::HostNetwork`]), with a
//!   message that names the fix.
//!
//! Reads (`/leader`, `/events` without `gate=`) are not this module's:
//! they are answered on every listener.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::serve::server::Peer;

/// Where registrations and acknowledgements are taken from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateChannel {
    /// A loopback address (or the gate socket, had one been given).
    Loopback,
    /// The gate socket at this path, and nothing else.
    Socket(PathBuf),
    /// Nowhere: the pod uses the node's network (this IP is both the pod's
    /// and the node's) and has no gate socket.
    HostNetwork(IpAddr),
}

impl GateChannel {
    /// The channel for a sidecar with `socket` (`--gate-socket`) in a pod
    /// with `pod_ip` on a node with `host_ip` (each from the downward API,
    /// when given).
    pub fn new(socket: Option<&Path>, pod_ip: Option<IpAddr>, host_ip: Option<IpAddr>) -> Self {
        match (socket, pod_ip, host_ip) {
            (Some(socket), _, _) => Self::Socket(socket.to_path_buf()),
            (None, Some(pod), Some(host)) if pod == host => Self::HostNetwork(pod),
            _ => Self::Loopback,
        }
    }

    /// Whether a gate may register or acknowledge from `peer`; if not, the
    /// words of the refusal (`what`: "gates register", "acknowledgements
    /// are taken").
    pub fn admits(&self, peer: Option<&Peer>, what: &str) -> Result<(), String> {
        match (self, peer) {
            (Self::Loopback, Some(Peer::UnixSocket)) => Ok(()),
            (Self::Loopback, Some(Peer::Network(addr)))
                if addr.ip().to_canonical().is_loopback() =>
            {
                Ok(())
            }
            (Self::Loopback, _) => Err(format!("{what} from this pod only (a loopback address)\n")),
            (Self::Socket(_), Some(Peer::UnixSocket)) => Ok(()),
            (Self::Socket(path), _) => Err(format!(
                "{what} over the gate socket only: give the gate --url unix:{}\n",
                path.display()
            )),
            (Self::HostNetwork(ip), _) => Err(format!(
                "{what} from nowhere: this pod uses the node's network ({ip} is both the pod's \
                 and the node's IP), so a loopback address is any pod or process of the node. \
                 Give the sidecar --gate-socket PATH in an emptyDir shared with the gates, and \
                 the gates --url unix:PATH\n"
            )),
        }
    }

    /// What the sidecar says about it at start-up.
    pub fn log(&self) {
        match self {
            Self::Loopback => {}
            Self::Socket(path) => tracing::info!(
                socket = %path.display(),
                "gates register and acknowledge over the gate socket only"
            ),
            Self::HostNetwork(ip) => tracing::error!(
                pod_ip = %ip,
                "this pod uses the node's network and has no --gate-socket: every gate's registration and acknowledgement will be refused (loopback is shared by every pod and process of the node); give the sidecar --gate-socket PATH in an emptyDir shared with the gates, and the gates --url unix:PATH"
            ),
        }
    }
}

/// Binds the gate socket at `path`, replacing a socket left by a process
/// that died (nothing answers on it), never one in use or another file.
pub async fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} is in use by another running process: give each sidecar its own socket",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = UnixListener::bind(path)?;
    // The gates may run as another user: the directory (mounted by this
    // pod's containers only) is what keeps others out, not the mode.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(addr: &str) -> Peer {
        Peer::Network(addr.parse().unwrap())
    }

    #[test]
    fn without_a_socket_loopback_and_a_socket_peer_may_register_and_nothing_else() {
        let channel = GateChannel::new(None, None, None);
        assert_eq!(channel, GateChannel::Loopback);
        for peer in [
            network("127.0.0.1:5000"),
            network("[::1]:5000"),
            network("[::ffff:127.0.0.1]:5000"),
            Peer::UnixSocket,
        ] {
            assert_eq!(channel.admits(Some(&peer), "gates register"), Ok(()));
        }
        let refused = channel.admits(Some(&network("10.0.0.7:5000")), "gates register");
        assert_eq!(
            refused,
            Err("gates register from this pod only (a loopback address)\n".into())
        );
        assert!(channel.admits(None, "gates register").is_err());
    }

    #[test]
    fn with_a_socket_loopback_is_refused_with_the_socket_to_use() {
        let channel = GateChannel::new(Some(Path::new("/run/leader-gate/gate.sock")), None, None);
        assert_eq!(
            channel.admits(Some(&Peer::UnixSocket), "gates register"),
            Ok(())
        );
        let refused = channel
            .admits(Some(&network("127.0.0.1:5000")), "gates register")
            .unwrap_err();
        assert!(
            refused.contains("--url unix:/run/leader-gate/gate.sock"),
            "{refused}"
        );
    }

    #[test]
    fn host_networking_without_a_socket_refuses_everyone_and_names_the_fix() {
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let node: IpAddr = "10.0.0.8".parse().unwrap();
        assert_eq!(
            GateChannel::new(None, Some(ip), Some(node)),
            GateChannel::Loopback,
            "a pod with an IP of its own"
        );
        let channel = GateChannel::new(None, Some(ip), Some(ip));
        assert_eq!(channel, GateChannel::HostNetwork(ip));
        for peer in [network("127.0.0.1:5000"), network("10.0.0.9:5000")] {
            let refused = channel
                .admits(Some(&peer), "acknowledgements are taken")
                .unwrap_err();
            assert!(refused.contains("--gate-socket"), "{refused}");
            assert!(refused.contains("node's network"), "{refused}");
        }
        // The socket fixes it.
        let socket = Path::new("/run/leader-gate/gate.sock");
        assert_eq!(
            GateChannel::new(Some(socket), Some(ip), Some(ip)),
            GateChannel::Socket(socket.to_path_buf())
        );
    }

    #[tokio::test]
    async fn a_socket_left_by_a_dead_process_is_replaced_and_one_in_use_is_not() {
        let dir = std::env::temp_dir().join(format!("leader-gate-socket-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gate.sock");
        // A dead process's socket: bound, then its listener dropped.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = bind_socket(&path).await.expect("the stale socket replaced");
        let in_use = bind_socket(&path).await.unwrap_err();
        assert_eq!(in_use.kind(), io::ErrorKind::AddrInUse, "{in_use}");
        drop(listener);
        // Another kind of file is never removed.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "data").unwrap();
        let error = bind_socket(&path).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists, "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
