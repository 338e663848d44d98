//! The command line as a whole: [`Cli`] composes each side's flags — `serve`'s
//! ([`ServeArgs`]), the clients' (next to each client in [`crate::client`]),
//! `handover`'s ([`HandoverArgs`]) — into one `leader-gate` command with a
//! subcommand each; `install`'s one argument is the binary's own. A command
//! line clap refuses prints as [`usage_error`] says (exit 64).

use clap::{Parser, Subcommand};

use crate::args::LogFormat;
use crate::client::exec::ExecArgs;
use crate::client::file_gate::FileGateArgs;
pub use crate::client::install::InstallArgs;
use crate::client::prestop::PrestopArgs;
use crate::client::status::WaitArgs;
use crate::client::url::ClientArgs;
use crate::client::watch::WatchArgs;
use crate::elector::handover::HandoverArgs;
use crate::inject::InjectArgs;
use crate::serve::config::ServeArgs;

/// leader-gate: contends for a Kubernetes Lease and tells the collector next
/// to it, over HTTP, whether it may do cluster-wide work right now.
#[derive(Debug, Parser)]
#[command(name = "leader-gate", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up: the size difference between variants is moot.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar: contend for the Lease and serve /leader and /events.
    Serve(ServeArgs),
    /// Subscribe to a sidecar's /events and print one line per event.
    Watch(WatchArgs),
    /// Run COMMAND only while this pod leads; stop it when leadership ends.
    Exec(ExecArgs),
    /// Keep copies of files at DST only while this pod leads.
    FileGate(FileGateArgs),
    /// Print whether this pod leads: exit 0 leading, 1 not, 2 no valid answer.
    Status(ClientArgs),
    /// Wait until this pod leads: exit 0 then, 1 on --timeout.
    Wait(WaitArgs),
    /// A collector container's preStop hook: ask this pod's sidecar to hand
    /// the Lease over, wait for another holder (--timeout), then --drain;
    /// always exit 0.
    Prestop(PrestopArgs),
    /// Copy this binary to DEST (for an image without `cp`: the exec gate
    /// reaches the collector's container through a shared volume).
    Install(InstallArgs),
    /// Ask the holder of the Lease to hand it over (to --to, or to the named
    /// successor) and wait for the new holder.
    Handover(HandoverArgs),
    /// Gate the collector workloads of Kubernetes YAML (a file or stdin) and
    /// print the result; with --check, say what would break in a gated one.
    Inject(InjectArgs),
}

impl Command {
    /// The subcommand's name, as its text log lines begin: `leader-gate NAME: `.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Serve(_) => "serve",
            Self::Watch(_) => "watch",
            Self::Exec(_) => "exec",
            Self::FileGate(_) => "file-gate",
            Self::Status(_) => "status",
            Self::Wait(_) => "wait",
            Self::Prestop(_) => "prestop",
            Self::Install(_) => "install",
            Self::Handover(_) => "handover",
            Self::Inject(_) => "inject",
        }
    }

    /// `--log-format`, which every subcommand takes.
    pub fn log_format(&self) -> LogFormat {
        let log = match self {
            Self::Serve(args) => args.log,
            Self::Watch(args) => args.client.log,
            Self::Exec(args) => args.client.log,
            Self::FileGate(args) => args.client.log,
            Self::Status(client) => client.log,
            Self::Wait(args) => args.client.log,
            Self::Prestop(args) => args.client.log,
            Self::Install(args) => args.log,
            Self::Handover(args) => args.log,
            Self::Inject(args) => args.log,
        };
        log.log_format
    }
}

/// What a command line clap refused prints (`rendered`: clap's own text):
/// `leader-gate: ` and clap's message, naming the flag, on the first line
/// (a list of missing arguments joined into it), then each of clap's further
/// lines on its own (a tip, the usage, "For more information, try
/// '--help'."), without clap's blank lines.
pub fn usage_error(rendered: &str) -> String {
    let mut paragraphs = rendered.trim().split("\n\n");
    let message: Vec<&str> = paragraphs
        .next()
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let mut lines = vec![format!(
        "leader-gate: {}",
        message.join(" ").trim_start_matches("error: ")
    )];
    lines.extend(
        paragraphs
            .flat_map(str::lines)
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(str::to_owned),
    );
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::exec::{DEFAULT_GRACE, DEFAULT_MARGIN, check_grace};
    use crate::serve::config::ServeConfig;
    use crate::timing::SHUTDOWN_SLACK;

    fn args(extra: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["leader-gate", "serve", "--lease-name", "demo"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Serve(args) = cli.command else {
            unreachable!()
        };
        args.validate(|_| None, || Some("host-1".into()))
            .map_err(|e| e.to_string())
    }

    fn exec_grace(extra: &[&str]) -> Duration {
        let mut argv = vec!["leader-gate", "exec"];
        argv.extend_from_slice(extra);
        argv.extend_from_slice(&["--", "true"]);
        let Command::Exec(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        args.grace
    }

    /// The timing rule (README "Timing"): whatever runs after "not leading"
    /// must end within the margin, and a graceful hand-over must wait for it
    /// inside the shutdown timeout. Checked on the defaults as parsed.
    #[test]
    fn every_default_satisfies_the_timing_rule() {
        let config = args(&[]).unwrap();
        let margin = config.lease_duration - config.renew_deadline;
        assert_eq!(margin, DEFAULT_MARGIN, "exec measures --grace against this");
        let lag = config.shutdown.gate_lag;
        assert!(!lag.is_zero(), "a graceful release waits for the gates");
        assert!(
            lag < margin,
            "gate lag {lag:?} within the margin {margin:?}"
        );
        assert_eq!(lag, Duration::from_secs(4), "80% of the default margin");
        let timeout = config.shutdown.timeout;
        assert!(timeout > lag, "the release happens: {timeout:?} > {lag:?}");
        assert_eq!(timeout, lag + SHUTDOWN_SLACK);
        // The release write gets its usual request timeout (half the renew
        // deadline) after the lag.
        assert!(timeout - lag >= config.renew_deadline / 2);

        let grace = exec_grace(&[]);
        assert_eq!(grace, DEFAULT_GRACE);
        assert!(grace < margin, "exec --grace {grace:?} within {margin:?}");
        assert_eq!(check_grace(grace), Ok(None), "no warning by default");
    }
}
