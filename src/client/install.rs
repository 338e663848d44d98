//! `leader-gate install DEST`'s one argument: where to copy this static
//! binary (an init container's step, for an image without `cp`: `exec` and
//! the preStop hook reach the collector's container through a shared volume).

use clap::Args;

use crate::args::LogArgs;

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where to put the copy (mode 0755), e.g. /gate/leader-gate.
    #[arg(value_name = "DEST")]
    pub dest: std::path::PathBuf,

    #[command(flatten)]
    pub log: LogArgs,
}
