//! The tests' fake Kubernetes Lease API server, on its own, for trying
//! `leader-gate serve` (a local build or the image) without a cluster:
//!
//!     cargo run --example fake_apiserver -- DIR [CLIENT...]
//!
//! It listens on a free port of 127.0.0.1 (real HTTP, modelled on exchanges
//! recorded from a real kube-apiserver; the Role of `manifests/rbac.yaml`
//! for the Lease `demo-leader` in the namespace `demo`), writes
//! `DIR/<CLIENT>.kubeconfig` and `DIR/<CLIENT>.token` for each CLIENT
//! (default: one, `pod-a`), readable by any user (a container running as
//! another user mounts DIR at the same path: the kubeconfig names its token
//! by absolute path), and prints one line
//!
//!     ready url=http://127.0.0.1:PORT kubeconfig=DIR/pod-a.kubeconfig
//!
//! then serves until it gets SIGTERM or SIGINT. scripts/check-image-run.sh
//! runs the image against it.

#[path = "../tests/support"]
mod support {
    pub mod fake_apiserver;
}

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use support::fake_apiserver::FakeApiServer;

const NAMESPACE: &str = "demo";
const LEASE: &str = "demo-leader";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: fake_apiserver DIR [CLIENT...]");
        return ExitCode::from(64);
    };
    let mut clients: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    if clients.is_empty() {
        clients.push("pod-a".to_owned());
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("fake_apiserver: cannot start a tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(&dir, &clients))
}

async fn serve(dir: &Path, clients: &[String]) -> ExitCode {
    if let Err(error) = std::fs::create_dir_all(dir) {
        eprintln!("fake_apiserver: cannot create {}: {error}", dir.display());
        return ExitCode::FAILURE;
    }
    if let Err(error) = chmod(dir, 0o755) {
        eprintln!("fake_apiserver: {error}");
        return ExitCode::FAILURE;
    }
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let mut kubeconfigs = Vec::new();
    for client in clients {
        let kubeconfig = api.write_kubeconfig(client, dir);
        let token = kubeconfig.with_file_name(format!("{client}.token"));
        if let Err(error) = chmod(&kubeconfig, 0o644).and_then(|()| chmod(&token, 0o644)) {
            eprintln!("fake_apiserver: {error}");
            return ExitCode::FAILURE;
        }
        kubeconfigs.push(format!("kubeconfig={}", kubeconfig.display()));
    }
    println!("ready url={} {}", api.url(), kubeconfigs.join(" "));
    let _ = std::io::stdout().flush();

    let Ok(mut terminate) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        eprintln!("fake_apiserver: cannot handle SIGTERM");
        return ExitCode::FAILURE;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    ExitCode::SUCCESS
}

fn chmod(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}
