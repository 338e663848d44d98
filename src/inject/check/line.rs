//! A leader-gate command line of a pod, read as the binary reads it at
//! start-up: which containers and preStop hooks run leader-gate, their
//! argv after Kubernetes' `$(VAR)` expansion, the environment the container
//! gives them, and the parse by each side's own clap definitions
//! ([`ServeArgs`], the clients' args) followed by the validation start-up
//! runs ([`ServeArgs::validate`], [`exec::check_grace`]).
//!
//! Clap's `env =` fallbacks read the process environment when the command
//! is built: that would be the environment of whoever runs `--check`. So
//! every fallback is taken off the command, and the container's own
//! variables are given back as flags — only for flags its command line
//! does not set, which a first parse (with nothing required) tells.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use super::workload::{Container, Pod};
use crate::client::exec::{self, ExecArgs};
use crate::client::file_gate::{FileGateArgs, Mapping, MappingError};
use crate::client::install::InstallArgs;
use crate::client::prestop::PrestopArgs;
use crate::client::status::WaitArgs;
use crate::client::url::ClientArgs;
use crate::client::watch::WatchArgs;
use crate::elector::handover::HandoverArgs;
use crate::exit;
use crate::inject::InjectArgs;
use crate::inject::yaml::{Map, Node};
use crate::serve::config::{ServeArgs, ServeConfig};

/// The binary's command line, subcommand by subcommand, as `crate::cli`
/// composes it (which `inject` sits below and cannot name).
#[derive(Debug, Parser)]
#[command(name = "leader-gate", version)]
struct Line {
    #[command(subcommand)]
    side: Side,
}

/// What a container runs.
#[allow(clippy::large_enum_variant)] // One per container, read once.
#[derive(Debug, Subcommand)]
pub enum Side {
    Serve(ServeArgs),
    Watch(WatchArgs),
    Exec(ExecArgs),
    FileGate(FileGateArgs),
    Status(ClientArgs),
    Wait(WaitArgs),
    Prestop(PrestopArgs),
    Install(InstallArgs),
    Handover(HandoverArgs),
    Inject(InjectArgs),
}

/// A command line as start-up accepted it.
#[derive(Debug)]
pub enum Parsed {
    /// `serve`: its flags and what validation made of them.
    Serve(Box<ServeArgsSeen>, Box<ServeConfig>),
    Other(Box<Side>),
}

/// What `--check` needs of `serve`'s flags that [`ServeConfig`] does not keep.
#[derive(Debug)]
pub struct ServeArgsSeen {
    pub gate_socket: Option<PathBuf>,
    pub identity_given: bool,
    pub namespace_given: bool,
}

/// The environment of a container: each variable's value, or what the
/// kubelet would put there (a downward-API field gets a plausible value
/// of this pod); `None` when the value comes from outside the stream (a
/// Secret, a ConfigMap it does not hold).
#[derive(Debug, Default)]
pub struct Env {
    vars: BTreeMap<String, Var>,
}

#[derive(Debug, Clone)]
pub struct Var {
    pub value: Option<String>,
    /// `valueFrom.fieldRef.fieldPath`, for the downward API's variables.
    pub field: Option<String>,
}

impl Env {
    /// The environment `container` of `pod` gets; `config_map` looks a
    /// ConfigMap of the pod's namespace up in the stream.
    pub fn of(container: &Container, pod: &Pod, config_map: &dyn Fn(&str) -> Option<Map>) -> Env {
        let mut env = Env::default();
        for from in container
            .node
            .seq("envFrom")
            .iter()
            .filter_map(Node::as_map)
        {
            let prefix = from.str("prefix").unwrap_or("");
            let Some(data) = from
                .map("configMapRef")
                .and_then(|r| r.str("name"))
                .and_then(config_map)
                .and_then(|cm| cm.map("data").cloned())
            else {
                continue;
            };
            for (key, value) in &data.0 {
                env.set(
                    format!("{prefix}{key}"),
                    value.as_str().map(str::to_owned),
                    None,
                );
            }
        }
        for var in container.node.seq("env").iter().filter_map(Node::as_map) {
            let Some(name) = var.str("name") else {
                continue;
            };
            if let Some(value) = var.get("value") {
                let value = value.as_str().map(|v| env.expand(v));
                env.set(name.to_owned(), value, None);
                continue;
            }
            let from = var.map("valueFrom");
            let field = from
                .and_then(|f| f.map("fieldRef"))
                .and_then(|f| f.str("fieldPath"));
            let value = if let Some(field) = field {
                downward(field, pod)
            } else if from.and_then(|f| f.map("resourceFieldRef")).is_some() {
                Some("1".to_owned())
            } else if let Some(reference) = from.and_then(|f| f.map("configMapKeyRef")) {
                reference
                    .str("name")
                    .and_then(config_map)
                    .and_then(|cm| cm.map("data").cloned())
                    .and_then(|data| {
                        data.str(reference.str("key").unwrap_or(""))
                            .map(str::to_owned)
                    })
            } else if var.get("valueFrom").is_none() {
                // `- name: X` alone: set, empty.
                Some(String::new())
            } else {
                None
            };
            env.set(name.to_owned(), value, field.map(str::to_owned));
        }
        env
    }

    fn set(&mut self, name: String, value: Option<String>, field: Option<String>) {
        self.vars.insert(name, Var { value, field });
    }

    pub fn var(&self, name: &str) -> Option<&Var> {
        self.vars.get(name)
    }

    /// The value of `name`, when the stream says what it is.
    pub fn value(&self, name: &str) -> Option<String> {
        self.vars.get(name).and_then(|v| v.value.clone())
    }

    /// Kubernetes' expansion of `$(NAME)` in a command, argument or value:
    /// a defined variable is replaced, `$$` is a `$`, the rest stays.
    pub fn expand(&self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some((name, tail)) = after
                .strip_prefix('(')
                .and_then(|a| a.split_once(')'))
                .filter(|(name, _)| self.value(name).is_some())
            {
                out.push_str(&self.value(name).unwrap_or_default());
                rest = tail;
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }
}

/// A value the kubelet would give the downward API's `field` in this pod.
fn downward(field: &str, pod: &Pod) -> Option<String> {
    let host_ip = "10.0.0.1";
    Some(match field {
        "metadata.name" => pod.pod_name.clone(),
        "metadata.namespace" if pod.namespace.is_empty() => "default".to_owned(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => "3f8a1c2e-0000-4000-8000-000000000001".to_owned(),
        "spec.nodeName" => "node-1".to_owned(),
        "spec.serviceAccountName" => pod.service_account.clone(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_owned(),
        // Under hostNetwork the pod's IP is the node's.
        "status.podIP" | "status.podIPs" if pod.host_network => host_ip.to_owned(),
        "status.podIP" | "status.podIPs" => "10.244.0.10".to_owned(),
        _ => return None,
    })
}

/// Whether `image` is leader-gate's (any registry, tag or digest).
pub fn is_leader_gate_image(image: &str) -> bool {
    let path = image.split('@').next().unwrap_or(image);
    let last = path.rsplit('/').next().unwrap_or(path);
    last.split(':').next() == Some("leader-gate")
}

/// Whether `binary` (a command's first word) is leader-gate.
pub fn is_leader_gate_binary(binary: &str) -> bool {
    binary == "leader-gate" || binary.ends_with("/leader-gate")
}

/// The strings of a command or args list; an item that is not one is an error.
fn strings(node: Option<&Node>, key: &str) -> Result<Vec<String>, String> {
    match node {
        None | Some(Node::Null) => Ok(Vec::new()),
        Some(Node::Seq(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    format!("{key}[{i}] is not a string (quote it): the API server refuses the pod")
                })
            })
            .collect(),
        Some(_) => Err(format!(
            "{key} is not a list of strings: the API server refuses the pod"
        )),
    }
}

/// The leader-gate command line a container runs (after the binary), if it
/// runs leader-gate: its `command` names the binary, or it has none and
/// the image is leader-gate's (whose entrypoint is the binary).
pub fn container_argv(container: &Container, env: &Env) -> Option<Result<Vec<String>, String>> {
    let node = &container.node;
    let run = || -> Result<Option<Vec<String>>, String> {
        let command = strings(node.get("command"), "command")?;
        let args = strings(node.get("args"), "args")?;
        let image = node.str("image").unwrap_or("");
        let argv = match command.split_first() {
            Some((binary, rest)) if is_leader_gate_binary(&env.expand(binary)) => {
                rest.iter().chain(&args).cloned().collect()
            }
            None if is_leader_gate_image(image) => args,
            _ => return Ok(None),
        };
        Ok(Some(argv.iter().map(|a| env.expand(a)).collect()))
    };
    run().transpose()
}

/// The preStop hook of a container, if it execs leader-gate: the binary's
/// path and the command line after it.
pub fn hook_argv(container: &Container) -> Option<Result<(String, Vec<String>), String>> {
    let command = container
        .node
        .map("lifecycle")
        .and_then(|l| l.map("preStop"))
        .and_then(|p| p.map("exec"))
        .and_then(|e| e.get("command"))?;
    match strings(Some(command), "lifecycle.preStop.exec.command") {
        // No variable expansion in a hook's command: the kubelet runs it as written.
        Ok(command) => match command.split_first() {
            Some((binary, rest)) if is_leader_gate_binary(binary) => {
                Some(Ok((binary.clone(), rest.to_vec())))
            }
            _ => None,
        },
        Err(error) => Some(Err(error)),
    }
}

/// The command without any `env =` fallback (they read the environment of
/// the process that builds it), optionally with nothing required.
fn command(required: bool) -> clap::Command {
    Line::command()
        .mut_subcommands(move |sub| {
            sub.mut_args(move |arg| {
                let arg = arg.env(None::<&'static str>);
                if required { arg } else { arg.required(false) }
            })
        })
        .mut_subcommand("file-gate", |sub| {
            sub.mut_arg("mappings", |arg| arg.value_parser(mapping_here))
        })
}

/// A file gate's SRC:DST by [`Mapping::parse`], except for what it asks of
/// the filesystem it runs on (DST's directory exists, DST is no
/// directory): the pod's volume mounts answer that, not this host's.
fn mapping_here(arg: &str) -> Result<Mapping, MappingError> {
    match Mapping::parse(arg) {
        Err(error) if error.rule.starts_with("DST") => {
            let (src, dst) = arg.split_once(':').unwrap_or_default();
            Ok(Mapping {
                src: src.into(),
                dst: dst.into(),
            })
        }
        parsed => parsed,
    }
}

/// Reads `argv` (after the binary) as the binary would, with `env` the
/// container's environment; `Err` says why the binary would refuse it.
pub fn parse(argv: &[String], env: &Env) -> Result<Parsed, String> {
    let full = || std::iter::once("leader-gate".to_owned()).chain(argv.iter().cloned());
    // Which flags the command line sets itself: the container's variables
    // count only for the others.
    let seen = command(false)
        .try_get_matches_from(full())
        .map_err(|e| refusal(&e))?;
    let Some((name, matches)) = seen.subcommand() else {
        return Err("names no subcommand".to_owned());
    };
    let reference = Line::command();
    let sub = reference
        .find_subcommand(name)
        .ok_or_else(|| format!("has no subcommand {name:?}"))?;
    let mut extra = Vec::new();
    for arg in sub.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = var.to_str().and_then(|var| env.value(var)) else {
            continue;
        };
        if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        match (arg.get_action(), value.as_str()) {
            // A flag's variable is `true` or `false`; anything else is
            // refused, as clap refuses it.
            (ArgAction::SetTrue, "true") => extra.push(format!("--{long}")),
            (ArgAction::SetTrue, "false") => {}
            _ => extra.push(format!("--{long}={value}")),
        }
    }
    let mut line: Vec<String> = full().collect();
    let at = line.iter().position(|a| a == name).unwrap_or(1) + 1;
    line.splice(at..at, extra);
    let matches = command(true)
        .try_get_matches_from(line)
        .map_err(|e| refusal(&e))?;
    let side = Line::from_arg_matches(&matches)
        .map_err(|e| refusal(&e))?
        .side;
    validate(side, env, &reference_hostname(env))
}

/// The hostname of a pod's container: its pod's name (what `serve` falls
/// back to without POD_NAME).
fn reference_hostname(env: &Env) -> String {
    env.value("HOSTNAME").unwrap_or_else(|| "pod-0".to_owned())
}

/// The checks start-up makes after clap, as `main` makes them.
fn validate(side: Side, env: &Env, hostname: &str) -> Result<Parsed, String> {
    match side {
        Side::Serve(args) => {
            let seen = ServeArgsSeen {
                gate_socket: args.gate_socket.clone(),
                identity_given: args.identity.is_some(),
                namespace_given: args.lease_namespace.is_some(),
            };
            let config = args
                .validate(|name| env.value(name), || Some(hostname.to_owned()))
                .map_err(|e| {
                    format!(
                        "`leader-gate serve` refuses its flags and would exit {}: {e}",
                        exit::USAGE
                    )
                })?;
            Ok(Parsed::Serve(Box::new(seen), Box::new(config)))
        }
        Side::Exec(args) => match exec::check_grace(args.grace) {
            Err(error) => Err(format!(
                "`leader-gate exec` refuses its flags and would exit {}: {error}",
                exit::USAGE
            )),
            // A warning only: the pod's own margin is judged beside its sidecar.
            Ok(_) => Ok(Parsed::Other(Box::new(Side::Exec(args)))),
        },
        side => Ok(Parsed::Other(Box::new(side))),
    }
}

/// What the binary says of a command line clap refuses: its first line.
fn refusal(error: &clap::Error) -> String {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            return "prints its help or version and exits instead of running".to_owned();
        }
        _ => {}
    }
    let rendered = error.render().to_string();
    let first = rendered.trim().split("\n\n").next().unwrap_or_default();
    let message: Vec<&str> = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!(
        "leader-gate refuses the command line and would exit {}: {}",
        exit::USAGE,
        message.join(" ").trim_start_matches("error: ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Env {
        let mut env = Env::default();
        for (name, value) in vars {
            env.set((*name).to_owned(), Some((*value).to_owned()), None);
        }
        env
    }

    fn argv(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn serve(line: &str, vars: &[(&str, &str)]) -> Result<ServeConfig, String> {
        match parse(&argv(line), &env(vars))? {
            Parsed::Serve(_, config) => Ok(*config),
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn the_containers_variables_stand_in_for_flags_it_does_not_give() {
        let config = serve(
            "serve --lease-duration=30s",
            &[
                ("LEADER_GATE_LEASE_NAME", "a,b"),
                ("LEADER_GATE_LEASE_DURATION", "20s"),
                ("LEADER_GATE_RECORD_EVENTS", "true"),
                ("POD_NAME", "pod-1"),
            ],
        )
        .unwrap();
        assert_eq!(
            config.leases,
            ["a", "b"],
            "split at commas, as clap splits a variable"
        );
        assert_eq!(config.lease_duration.as_secs(), 30, "the flag wins");
        assert!(config.record_events);
        assert_eq!(config.identity, "pod-1", "POD_NAME, through validate's env");
    }

    #[test]
    fn a_refused_flag_says_the_exit_code_and_the_rule() {
        let error = serve(
            "serve --lease-name x --lease-duration=30s --renew-deadline=15s --gate-lag=20s",
            &[],
        )
        .unwrap_err();
        assert!(error.contains("would exit 64"), "{error}");
        assert!(error.contains("invalid --gate-lag"), "{error}");
        let error = serve("serve --lease-name x --bogus", &[]).unwrap_err();
        assert!(error.contains("unexpected argument '--bogus'"), "{error}");
        let error = serve(
            "serve --lease-name x --record-events",
            &[("LEADER_GATE_RECORD_EVENTS", "yes")],
        );
        assert!(error.is_ok(), "the flag given, the variable is not read");
        let error = serve(
            "serve --lease-name x",
            &[("LEADER_GATE_RECORD_EVENTS", "yes")],
        )
        .unwrap_err();
        assert!(error.contains("--record-events"), "{error}");
    }

    #[test]
    fn variables_expand_as_kubernetes_expands_them() {
        let env = env(&[("POD_NAME", "p-1")]);
        assert_eq!(env.expand("--identity=$(POD_NAME)"), "--identity=p-1");
        assert_eq!(
            env.expand("$$(POD_NAME) $(NOPE) $"),
            "$(POD_NAME) $(NOPE) $"
        );
    }

    #[test]
    fn leader_gate_images_are_known_by_their_last_path_segment() {
        assert!(is_leader_gate_image(
            "ghcr.io/leader-gate/leader-gate:0.1.0"
        ));
        assert!(is_leader_gate_image(
            "mirror.local:5000/x/leader-gate@sha256:ab"
        ));
        assert!(!is_leader_gate_image(
            "ghcr.io/leader-gate/leader-gate-peer:1"
        ));
        assert!(!is_leader_gate_image(
            "docker.elastic.co/beats/metricbeat:8.15.0"
        ));
    }
}
