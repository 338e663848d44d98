//! `leader-gate inject`: reads Kubernetes YAML (a file or stdin, one
//! document or a stream) and writes it back with its collector workloads
//! gated by leader-gate; `inject --check` reads a gated stream, hand-made or
//! not, and says what would break. It reads the sidecar's and the gates'
//! flags with their own definitions and validation ([`crate::serve::config`],
//! [`crate::client`]) and the pod-wide rules of [`crate::timing`], so a setup
//! it writes or passes is one those accept at start-up.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;

use crate::args::LogArgs;

pub mod check;
pub mod yaml;

/// The image `inject` puts in the pods: this version's.
pub const IMAGE: &str = concat!(
    "ghcr.io/leader-gate/leader-gate:",
    env!("CARGO_PKG_VERSION")
);

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// The Kubernetes YAML to read: a file, or `-` for stdin (one document
    /// or a stream, as `kubectl kustomize` or `helm template` prints it).
    #[arg(value_name = "FILE", default_value = "-")]
    pub input: PathBuf,

    /// Write nothing: check the stream's leader-gate setup (flags as the
    /// sidecar and its gates validate them at start-up, timings, the gate
    /// socket, preStop hooks, RBAC) and print one line per finding; exit 1
    /// when there is any.
    #[arg(long)]
    pub check: bool,

    #[command(flatten)]
    pub log: LogArgs,
}

/// What `inject` ends with: the exit code and the lines for stderr.
#[derive(Debug)]
pub struct Outcome {
    pub code: u8,
    pub stdout: String,
    pub stderr: Vec<String>,
}

/// Runs `inject` on its input (read here) and returns what to print.
pub fn run(args: &InjectArgs) -> Outcome {
    let text = match read_input(&args.input) {
        Ok(text) => text,
        Err(error) => {
            return Outcome {
                code: crate::exit::NOINPUT,
                stdout: String::new(),
                stderr: vec![format!(
                    "leader-gate inject: cannot read {}: {error}",
                    args.input.display()
                )],
            };
        }
    };
    run_on(args, &text)
}

/// Runs `inject` on `text` (the input already read).
pub fn run_on(args: &InjectArgs, text: &str) -> Outcome {
    let docs = match yaml::read_stream(text) {
        Ok(docs) => docs,
        Err(error) => {
            return Outcome {
                code: crate::exit::DATAERR,
                stdout: String::new(),
                stderr: vec![format!(
                    "leader-gate inject: {} is not Kubernetes YAML: {error}",
                    args.input.display()
                )],
            };
        }
    };
    if args.check {
        let findings = check::check_stream(&docs);
        return Outcome {
            code: u8::from(!findings.is_empty()),
            stdout: String::new(),
            stderr: findings,
        };
    }
    Outcome {
        code: 0,
        stdout: yaml::write_stream(&docs),
        stderr: Vec::new(),
    }
}

fn read_input(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
    }
}
