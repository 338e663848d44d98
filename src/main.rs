//! The `leader-gate` binary: parses flags ([`leader_gate::cli`]) and runs
//! the sidecar ([`leader_gate::serve::sidecar`]) or a client (`watch`,
//! `exec`, `file-gate`, `status`, `wait`, `prestop`, `install`, `handover`);
//! exit codes are in [`leader_gate::exit`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use leader_gate::cli::{Cli, Command, InstallArgs, usage_error};
use leader_gate::client::exec::ExecArgs;
use leader_gate::client::file_gate::FileGateArgs;
use leader_gate::client::status::WaitArgs;
use leader_gate::client::watch::WatchArgs;
use leader_gate::client::{exec, file_gate, status, watch};
use leader_gate::duration::HumanDuration;
use leader_gate::exit;
use leader_gate::serve::config::LogFormat;
use leader_gate::serve::sidecar;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            // --help, --version
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `leader-gate` alone: the usage, with every subcommand.
            eprint!("{}", error.render());
            return ExitCode::from(exit::USAGE);
        }
        Err(error) => {
            eprintln!("{}", usage_error(&error.render().to_string()));
            return ExitCode::from(exit::USAGE);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let args = match cli.command {
        Command::Serve(args) => args,
        client => return runtime.block_on(run_client(client)),
    };
    let config = match args.validate(|name| std::env::var(name).ok(), hostname) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("leader-gate: {error}");
            return ExitCode::from(exit::USAGE);
        }
    };
    init_logging(config.log_format);
    runtime.block_on(sidecar::run(config))
}

/// The client subcommands: they know the sidecar only through its gate listener.
async fn run_client(command: Command) -> ExitCode {
    match command {
        Command::Serve(_) => unreachable!("serve is not a client"),
        Command::Handover(args) => {
            // The subcommand says every failure itself, in its own words;
            // RUST_LOG shows the requests underneath.
            init_logging_with(
                LogFormat::Text,
                "warn,kube_client=off,kube_runtime=off,leader_gate::elector::lease_client=off",
            );
            leader_gate::elector::handover::run(args).await
        }
        Command::Watch(WatchArgs { client, json }) => {
            // Returns only when the output closed (the reader of a pipe exited).
            let _closed = watch::run(client.gate(), json, std::io::stdout()).await;
            ExitCode::SUCCESS
        }
        Command::Exec(ExecArgs {
            client,
            grace,
            command,
        }) => {
            match exec::check_grace(grace) {
                Ok(None) => {}
                Ok(Some(warning)) => eprintln!("leader-gate exec: {warning}"),
                Err(error) => {
                    eprintln!("leader-gate: {error}");
                    return ExitCode::from(exit::USAGE);
                }
            }
            let options = exec::ExecOptions {
                url: client.gate(),
                grace,
                command,
            };
            match exec::run(options).await {
                Ok(code) => ExitCode::from(code),
                // Said by exec itself, before it told the sidecar.
                Err(error) => ExitCode::from(error.exit_code()),
            }
        }
        Command::Prestop(leader_gate::client::prestop::PrestopArgs {
            client,
            timeout,
            drain,
        }) => {
            // Whatever happened, the pod's deletion goes on: exit 0.
            let _outcome = leader_gate::client::prestop::run(client.gate(), timeout, drain).await;
            ExitCode::SUCCESS
        }
        Command::FileGate(FileGateArgs {
            client,
            reload_url,
            mode,
            mappings,
        }) => {
            let options = file_gate::FileGateOptions {
                url: client.gate(),
                reload: reload_url,
                mode,
                mappings,
            };
            ExitCode::from(file_gate::run(options).await)
        }
        Command::Status(client) => {
            let (verdict, text) = status::status(&client.gate()).await;
            match verdict {
                status::Status::Unknown => eprintln!("leader-gate status: {text}"),
                _ => println!("{text}"),
            }
            ExitCode::from(verdict as u8)
        }
        Command::Install(InstallArgs { dest }) => match install(&dest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!(
                    "leader-gate install: cannot copy to {}: {error}",
                    dest.display()
                );
                ExitCode::from(exit::CANTCREAT)
            }
        },
        Command::Wait(WaitArgs { client, timeout }) => {
            if status::wait(client.gate(), timeout).await {
                ExitCode::SUCCESS
            } else {
                match timeout {
                    Some(timeout) => eprintln!(
                        "leader-gate wait: not leading after {}",
                        HumanDuration(timeout)
                    ),
                    None => eprintln!("leader-gate wait: not leading"),
                }
                ExitCode::FAILURE
            }
        }
    }
}

/// Copies the running executable to `dest` (through a temporary file and a
/// rename, so a container never starts a half-copied binary).
fn install(dest: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe()?;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let temporary = dest.with_file_name(format!(".{name}.tmp"));
    std::fs::copy(&me, &temporary)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&temporary, dest)
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname writes a
    // NUL-terminated name into it (truncated if longer).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

fn init_logging(format: LogFormat) {
    // kube's own crates repeat every failed request (a watch refused every
    // 1.5 s, a refused connection every few seconds); leader-gate says each
    // once per episode in its own words. RUST_LOG overrides.
    init_logging_with(format, "info,kube_client=off,kube_runtime=off");
}

/// Logging on stderr, filtered by RUST_LOG or else by `default`.
fn init_logging_with(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
