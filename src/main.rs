//! The `leader-gate` binary: parses flags ([`leader_gate::cli`]) and runs
//! the sidecar ([`leader_gate::serve::sidecar`]) or a client (`watch`,
//! `exec`, `file-gate`, `status`, `wait`, `prestop`, `install`, `handover`),
//! each logging on stderr in its `--log-format` (a refused command line
//! too); exit codes are in [`leader_gate::exit`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::registry::LookupSpan;

use leader_gate::args::LogFormat;
use leader_gate::cli::{Cli, Command, InstallArgs, usage_error};
use leader_gate::client::exec::ExecArgs;
use leader_gate::client::file_gate::FileGateArgs;
use leader_gate::client::status::WaitArgs;
use leader_gate::client::watch::WatchArgs;
use leader_gate::client::{exec, file_gate, status, watch};
use leader_gate::duration::HumanDuration;
use leader_gate::exit;
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
            refuse(format_asked(), error.render().to_string().trim_end());
            return ExitCode::from(exit::USAGE);
        }
        Err(error) => {
            refuse(format_asked(), &usage_error(&error.render().to_string()));
            return ExitCode::from(exit::USAGE);
        }
    };
    let format = cli.command.log_format();
    // The sockets are looked at after every 16 task polls, not tokio's 61:
    // under a load of many connections an answer waits behind fewer others
    // (`/leader` under wrk, interleaved with 61: p99 0.6-1.4 ms against
    // 1.3-2.6, as many requests; the 10,000-subscriber fan-out unchanged:
    // docs/BENCHMARKS.md).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .event_interval(16)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let args = match cli.command {
        Command::Serve(args) => args,
        client => {
            init_logging(format, client_filter(&client), Some(client.name()));
            return runtime.block_on(run_client(client, format));
        }
    };
    let config = match args.validate(|name| std::env::var(name).ok(), hostname) {
        Ok(config) => config,
        Err(error) => {
            refuse(format, &format!("leader-gate: {error}"));
            return ExitCode::from(exit::USAGE);
        }
    };
    // kube's own crates repeat every failed request (a watch refused every
    // 1.5 s, a refused connection every few seconds); leader-gate says each
    // once per episode in its own words. RUST_LOG overrides.
    init_logging(
        config.log_format,
        "info,kube_client=off,kube_runtime=off",
        None,
    );
    runtime.block_on(sidecar::run(config))
}

/// The clients' default filter (RUST_LOG overrides).
fn client_filter(command: &Command) -> &'static str {
    match command {
        // The subcommand says every failure itself, in its own words;
        // RUST_LOG shows the requests underneath.
        Command::Handover(_) => {
            "warn,leader_gate::elector::handover=info,kube_client=off,kube_runtime=off,leader_gate::elector::lease_client=off"
        }
        _ => "info",
    }
}

/// The client subcommands: they know the sidecar only through its gate
/// listener. Every line they write on stderr goes through `tracing`, so it
/// is in the pod's one log format; stdout is their product.
async fn run_client(command: Command, format: LogFormat) -> ExitCode {
    match command {
        Command::Serve(_) => unreachable!("serve is not a client"),
        Command::Handover(args) => leader_gate::elector::handover::run(args).await,
        Command::Inject(args) => {
            let outcome = leader_gate::inject::run(&args);
            print!("{}", outcome.stdout);
            for line in &outcome.stderr {
                eprintln!("{line}");
            }
            ExitCode::from(outcome.code)
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
                Ok(Some(warning)) => tracing::warn!("{warning}"),
                Err(error) => {
                    refuse(format, &format!("leader-gate: {error}"));
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
            status_url,
            stopped_when,
            mode,
            mappings,
        }) => {
            let options = file_gate::FileGateOptions {
                url: client.gate(),
                reload: reload_url,
                status: status_url.zip(stopped_when),
                mode,
                mappings,
            };
            ExitCode::from(file_gate::run(options).await)
        }
        Command::Status(client) => {
            let (verdict, text) = status::status(&client.gate()).await;
            match verdict {
                status::Status::Unknown => tracing::warn!("{text}"),
                _ => println!("{text}"),
            }
            ExitCode::from(verdict as u8)
        }
        Command::Install(InstallArgs { dest, .. }) => match install(&dest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!("cannot copy to {}: {error}", dest.display());
                ExitCode::from(exit::CANTCREAT)
            }
        },
        Command::Wait(WaitArgs { client, timeout }) => {
            if status::wait(client.gate(), timeout).await {
                ExitCode::SUCCESS
            } else {
                match timeout {
                    Some(timeout) => {
                        tracing::warn!("not leading after {}", HumanDuration(timeout));
                    }
                    None => tracing::warn!("not leading"),
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

/// The format `--log-format` or LEADER_GATE_LOG_FORMAT asks for, read
/// from the raw command line when clap refused it: even the refusal of a
/// command line is in the pod's one format.
fn format_asked() -> LogFormat {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let env = std::env::var("LEADER_GATE_LOG_FORMAT").ok();
    format_in(&args, env.as_deref())
}

fn format_in(args: &[String], env: Option<&str>) -> LogFormat {
    let mut value = None;
    for (i, arg) in args.iter().enumerate() {
        if arg == "--" {
            break; // exec's command
        }
        if let Some(v) = arg.strip_prefix("--log-format=") {
            value = Some(v);
        } else if arg == "--log-format" {
            value = args.get(i + 1).map(String::as_str);
        }
    }
    match value.or(env) {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// A refusal before logging is set up (a bad flag, exit 64): `text` as it
/// is, or one JSON line (without the `leader-gate: ` a person reads).
fn refuse(format: LogFormat, text: &str) {
    match format {
        LogFormat::Text => eprintln!("{text}"),
        LogFormat::Json => {
            let subscriber = tracing_subscriber::fmt()
                .json()
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                let message = text.strip_prefix("leader-gate: ").unwrap_or(text);
                tracing::error!("{message}");
            });
        }
    }
}

/// Logging on stderr, filtered by RUST_LOG or else by `default`. A client
/// (`prefix`: its subcommand's name) writes text lines as a person reads
/// them, `leader-gate NAME: message`; in JSON every subcommand writes the
/// same objects as `serve`.
fn init_logging(format: LogFormat, default: &str, prefix: Option<&'static str>) {
    // A client runs in the collector's container, whose RUST_LOG is the
    // collector's (a `warn` there must not silence the gate): it counts
    // for a client only when it names leader_gate.
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|filter| prefix.is_none() || filter.contains("leader_gate"));
    let filter = rust_log
        .and_then(|filter| tracing_subscriber::EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match (format, prefix) {
        (LogFormat::Json, _) => builder.with_ansi(false).json().init(),
        (LogFormat::Text, None) => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        (LogFormat::Text, Some(name)) => {
            builder.with_ansi(false).event_format(Prefixed(name)).init()
        }
    }
}

/// A client's text line: `leader-gate NAME: message key=value…`, as its
/// lines always read; below INFO (RUST_LOG=debug) also the level and where
/// it comes from.
struct Prefixed(&'static str);

impl<S, N> FormatEvent<S, N> for Prefixed
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "leader-gate {}: ", self.0)?;
        let meta = event.metadata();
        if *meta.level() > tracing::Level::INFO {
            write!(writer, "{} {}: ", meta.level(), meta.target())?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_refused_command_line_is_said_in_the_format_it_asked_for() {
        let json = LogFormat::Json;
        assert_eq!(
            format_in(&args("lg exec --log-format json --bad"), None),
            json
        );
        assert_eq!(format_in(&args("lg exec --log-format=json"), None), json);
        assert_eq!(format_in(&args("lg exec --bad"), Some("json")), json);
        assert_eq!(
            format_in(&args("lg exec --log-format text"), Some("json")),
            LogFormat::Text,
            "the flag overrides the variable"
        );
        assert_eq!(
            format_in(&args("lg exec -- cmd --log-format json"), None),
            LogFormat::Text,
            "the command's own arguments are not leader-gate's"
        );
        assert_eq!(format_in(&args("lg exec --bad"), None), LogFormat::Text);
    }
}
