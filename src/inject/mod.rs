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

pub mod agent;
pub mod check;
pub mod helm;
pub mod metricbeat;
pub mod otel;
pub mod otel_operator;
pub mod patch;
pub mod plan;
pub mod pod;
pub mod rbac;
pub mod second;
pub mod workload;
pub mod yaml;

use plan::{GateKind, Plan, Timings};
use workload::{Collector, Workload};
use yaml::{Node, write_stream};

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

    /// Gate only this workload (NAME or KIND/NAME; repeat for several).
    /// Without it, every DaemonSet, Deployment, StatefulSet, ECK
    /// Beat/Agent, prometheus-operator Prometheus/PrometheusAgent and
    /// OpenTelemetry Operator OpenTelemetryCollector whose collector inject
    /// knows.
    #[arg(long = "workload", value_name = "NAME")]
    pub workloads: Vec<String>,

    /// The collector container, when inject cannot tell it by its image
    /// (Metricbeat, Elastic Agent, OpenTelemetry Collector, Prometheus).
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,

    /// The gate, instead of the one recommended for the collector: `file`
    /// for Metricbeat (its `unique: true` modules placed on the leader) and
    /// a DaemonSet's Elastic Agent (its leader-elected inputs, in inputs.d),
    /// `exec` for a Deployment's collector (it runs only on the leader),
    /// `poll` (the sidecar only: the collector asks GET /leader).
    #[arg(long, value_enum)]
    pub gate: Option<GateKind>,

    /// The Lease's name (default: the workload's name + `-leader`).
    #[arg(long, value_name = "NAME")]
    pub lease: Option<String>,

    /// Write a kustomization into this directory instead of printing the
    /// stream: FILE as it is, plus leader-gate's objects and one
    /// strategic-merge patch per object it changed (for repositories that
    /// keep the upstream file untouched). `kubectl kustomize DIR` renders
    /// what inject would print.
    #[arg(long, value_name = "DIR")]
    pub patch: Option<PathBuf>,

    /// Print, instead of the stream, the values that make the OpenTelemetry
    /// Collector chart render what inject would print, to pass after your
    /// own: `helm template REL CHART -f FILE | leader-gate inject
    /// --helm-values FILE > leader-gate.yaml`, then `helm upgrade REL CHART
    /// -f FILE -f leader-gate.yaml`. FILE: the values files you render with,
    /// in their order (repeat the flag), so lists you set keep your items.
    #[arg(long = "helm-values", value_name = "FILE", conflicts_with_all = ["patch", "check"])]
    pub helm_values: Vec<PathBuf>,

    /// The leader-gate image the pods run.
    #[arg(long, default_value = IMAGE)]
    pub image: String,

    /// Under hostNetwork the sidecar listens on the node's ports: the first
    /// gated hostNetwork workload of the stream gets this one (gate
    /// listener, 127.0.0.1) and the next (admin), the second the two after,
    /// and so on. Pick a base that no other hostNetwork workload on those
    /// nodes uses (another stream's inject: a base 2 higher per workload).
    #[arg(long, default_value_t = 4040, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub host_port_base: u16,

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

impl Outcome {
    /// Nothing written: `code`, and one line saying why.
    fn refused(code: u8, line: String) -> Outcome {
        Outcome {
            code,
            stdout: String::new(),
            stderr: vec![line],
        }
    }
}

/// Runs `inject` on its input (read here) and returns what to print.
pub fn run(args: &InjectArgs) -> Outcome {
    let text = match read_input(&args.input) {
        Ok(text) => text,
        Err(error) => {
            return Outcome::refused(
                crate::exit::NOINPUT,
                format!(
                    "leader-gate inject: cannot read {}: {error}",
                    args.input.display()
                ),
            );
        }
    };
    run_on(args, &text)
}

/// Runs `inject` on `text` (the input already read).
pub fn run_on(args: &InjectArgs, text: &str) -> Outcome {
    let docs = match yaml::read_stream(text) {
        Ok(docs) => docs,
        Err(error) => {
            return Outcome::refused(
                crate::exit::DATAERR,
                format!(
                    "leader-gate inject: {} is not Kubernetes YAML: {error}",
                    args.input.display()
                ),
            );
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
    let original = docs.clone();
    let mut docs = docs;
    match inject(&mut docs, args) {
        Ok(notes) if args.patch.is_some() => {
            let dir = args.patch.as_deref().expect("just matched");
            match write_patch(dir, &args.input, &original, &docs) {
                Ok(written) => Outcome {
                    code: 0,
                    stdout: String::new(),
                    stderr: notes
                        .into_iter()
                        .chain(std::iter::once(written))
                        .map(|n| format!("leader-gate inject: {n}"))
                        .collect(),
                },
                Err(error) => Outcome::refused(
                    crate::exit::CANTCREAT,
                    format!("leader-gate inject: {error}"),
                ),
            }
        }
        Ok(notes) if !args.helm_values.is_empty() => {
            match helm_values(&args.helm_values, &original, &docs) {
                Ok(values) => Outcome {
                    code: 0,
                    stdout: values,
                    stderr: notes
                        .into_iter()
                        .chain(std::iter::once(
                            "the values above go after your own: helm upgrade REL CHART -f YOURS… -f THESE".to_owned(),
                        ))
                        .map(|n| format!("leader-gate inject: {n}"))
                        .collect(),
                },
                Err((code, error)) => {
                    Outcome::refused(code, format!("leader-gate inject: --helm-values: {error}"))
                }
            }
        }
        Ok(notes) => Outcome {
            code: 0,
            stdout: write_stream(&docs),
            stderr: notes
                .into_iter()
                .map(|n| format!("leader-gate inject: {n}"))
                .collect(),
        },
        Err(error) => Outcome::refused(1, format!("leader-gate inject: {error}")),
    }
}

/// `--helm-values`: the user's values files merged as Helm merges them,
/// then what the chart needs on top to render `gated`.
fn helm_values(
    files: &[PathBuf],
    rendered: &[Node],
    gated: &[Node],
) -> Result<String, (u8, String)> {
    let mut values = yaml::Map::default();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| {
            (
                crate::exit::NOINPUT,
                format!("cannot read {}: {e}", file.display()),
            )
        })?;
        match yaml::read_one(&text) {
            Ok(Node::Map(map)) => helm::merge(&mut values, &map),
            Ok(Node::Null) => {}
            Ok(_) => {
                return Err((
                    crate::exit::DATAERR,
                    format!("{} is not a mapping of values", file.display()),
                ));
            }
            Err(e) => return Err((crate::exit::DATAERR, format!("{}: {e}", file.display()))),
        }
    }
    let out = helm::values(rendered, gated, &values).map_err(|e| (1, e))?;
    Ok(yaml::write_one(&out))
}

/// Writes `--patch DIR`; says what it wrote.
fn write_patch(
    dir: &std::path::Path,
    input: &std::path::Path,
    original: &[Node],
    gated: &[Node],
) -> Result<String, String> {
    if input.as_os_str() == "-" {
        return Err("--patch needs the input as a file, which the kustomization lists: inject --patch DIR FILE".to_owned());
    }
    let from = patch::relative(input, dir);
    if from.starts_with("..") {
        return Err(format!(
            "--patch {}: {} is not in that directory, and kustomize loads files only from within it: keep the upstream file there (as GitOps repositories do) and run inject --patch DIR DIR/FILE",
            dir.display(),
            input.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let files = patch::files(original, gated, &from.to_string_lossy());
    for (name, text) in &files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(format!(
        "wrote {} ({}): kubectl kustomize {} renders the gated stream",
        dir.display(),
        files
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        dir.display()
    ))
}

/// Gates the chosen workloads of `docs` in place; returns what it did that
/// the user should know.
pub fn inject(docs: &mut Vec<Node>, args: &InjectArgs) -> Result<Vec<String>, String> {
    let all = workload::find(docs);
    let chosen: Vec<Workload> = if args.workloads.is_empty() {
        all.into_iter()
            .filter(|w| workload::collector(docs, w, args.container.as_deref()).is_ok())
            .collect()
    } else {
        let mut chosen = Vec::new();
        for wanted in &args.workloads {
            let found = all
                .iter()
                .find(|w| *wanted == w.name || *wanted == w.label())
                .ok_or_else(|| format!("no workload {wanted} in the input (DaemonSet, Deployment, StatefulSet, Beat, Agent, Prometheus, PrometheusAgent, OpenTelemetryCollector)"))?;
            chosen.push(found.clone());
        }
        chosen
    };
    if chosen.is_empty() {
        return Err(match unsupported(docs) {
            Some(said) => said,
            None => "no workload here runs a collector inject knows by its image: name it with --workload and --container".to_owned(),
        });
    }
    let mut notes = Vec::new();
    let mut host_ports = args.host_port_base;
    for w in &chosen {
        let said = |e: String| format!("{}: {e}", w.label());
        let mut w_notes = gate_one(docs, w, args, &mut host_ports).map_err(said)?;
        notes.extend(w_notes.drain(..).map(|n| format!("{}: {n}", w.label())));
    }
    // What it wrote, held to what `--check` holds a hand-made setup to
    // (every flag as start-up validates it): a pod that would not work is
    // never written.
    let labels: Vec<String> = chosen.iter().map(Workload::label).collect();
    let broken: Vec<String> = check::check_stream(docs)
        .into_iter()
        .filter(|f| {
            labels.iter().any(|l| {
                f.strip_prefix(l.as_str())
                    .is_some_and(|r| r.starts_with([':', ' ']))
            })
        })
        .collect();
    if !broken.is_empty() {
        return Err(format!(
            "the setup it would write does not pass its own check, so it writes nothing:\n  {}",
            broken.join("\n  ")
        ));
    }
    Ok(notes)
}

/// What to say about an operator's resource `inject` finds but does not gate.
fn unsupported(docs: &[Node]) -> Option<String> {
    docs.iter().filter_map(Node::as_map).find_map(|d| {
        let name = d.at_str(&["metadata", "name"]).unwrap_or("?");
        match d.str("kind")? {
            workload::OTEL_KIND if d.at_str(&["spec", "mode"]) == Some("sidecar") => Some(format!(
                "{}/{name}: {}",
                workload::OTEL_KIND,
                workload::SIDECAR_MODE
            )),
            _ => None,
        }
    })
}

fn gate_one(
    docs: &mut Vec<Node>,
    w: &Workload,
    args: &InjectArgs,
    host_ports: &mut u16,
) -> Result<Vec<String>, String> {
    let w = &w.refind(docs).ok_or("no pod spec")?;
    if w.otel_operator() {
        return otel_operator::gate(docs, w, args, host_ports);
    }
    let (name, kind) = workload::collector(docs, w, args.container.as_deref())?;
    if w.operator_merges_containers()
        && docs[w.doc].at(&["spec"]).and_then(|s| s.get("listenLocal")) == Some(&Node::Bool(true))
    {
        return Err("spec.listenLocal: the operator then probes Prometheus with a command inject cannot replace, and those probes would fail on every follower; turn listenLocal off to gate it".to_owned());
    }
    let pod = w.pod_spec_mut(docs).ok_or("no pod spec")?;
    let at = workload::container_index(pod, &name);
    let container = pod.seq("containers")[at]
        .as_map()
        .cloned()
        .unwrap_or_default();
    let pod = w.pod_spec(docs).ok_or("no pod spec")?;
    // An OpenTelemetry Collector DaemonSet keeps its node work everywhere;
    // its cluster receivers move to a second container under exec.
    let second_collector = args.gate.is_none() && kind == Collector::OtelCollector && w.per_node();
    let gate = match args.gate {
        Some(gate) => gate,
        None if second_collector => GateKind::Exec,
        None => GateKind::recommended(kind, w.per_node())?,
    };
    let host_network = pod.get("hostNetwork") == Some(&Node::Bool(true));
    let account = pod
        .str("serviceAccountName")
        .or_else(|| pod.str("serviceAccount"))
        .map(str::to_owned);
    let mut notes = Vec::new();
    let (file, reload) = match gate {
        GateKind::File if matches!(kind, Collector::Metricbeat | Collector::ElasticAgent) => {
            let converted = match kind {
                Collector::Metricbeat => metricbeat::convert(docs, w, &container)?,
                _ => agent::convert(docs, w, &container)?,
            };
            notes.extend(converted.notes);
            (Some(converted.placement), Some(converted.reload_period))
        }
        GateKind::File => {
            return Err("--gate file is set up by inject for Metricbeat (its modules directory) and Elastic Agent (its inputs.d) only; for another collector use docs/gates.md's file gate by hand, or --gate exec".to_owned());
        }
        _ => (None, None),
    };
    let (ports, metrics_port) = host_ports_for(host_network, second_collector, host_ports, args)?;
    notes.extend(host_network_note(
        ports,
        second_collector.then_some(metrics_port),
    ));
    let at = if second_collector {
        let (second, said) = second::add(docs, w, at, metrics_port)?;
        notes.extend(said);
        second
    } else {
        at
    };
    let plan = Plan {
        gate,
        lease: args
            .lease
            .clone()
            .unwrap_or_else(|| format!("{}-leader", w.name)),
        timings: Timings::for_gate(gate, reload),
        image: args.image.clone(),
        ports,
        health_url: if w.operator_merges_containers() {
            // The operator's Prometheus listens on 9090 of the pod.
            Some("http://127.0.0.1:9090/-/healthy".to_owned())
        } else {
            (gate == GateKind::Exec && !second_collector)
                .then(|| pod::exec_health_url(w.pod_spec(docs)?, &container))
                .flatten()
        },
        revision_label: w.revision_label(),
        file,
        operator_merged: w.operator_merges_containers(),
    };
    // The conversion may have added a document before the workload.
    let w = &w.refind(docs).ok_or("no pod spec")?;
    if let Some(account) = &account {
        notes.extend(account_note(docs, account, &w.namespace));
    }
    let pod = w.pod_spec_mut(docs).ok_or("no pod spec")?;
    let at = if second_collector {
        at
    } else {
        workload::container_index(pod, &name)
    };
    notes.extend(pod::gate(pod, at, kind, &plan)?);
    let new_account = account.is_none();
    let account = account.unwrap_or_else(|| w.name.clone());
    if new_account {
        pod.insert("serviceAccountName", Node::str(&account));
        notes.push(format!(
            "serviceAccountName {account}, a ServiceAccount of its own for the Lease's RBAC"
        ));
    }
    if let Some(meta) = w.pod_metadata_mut(docs) {
        meta.map_entry("annotations")
            .insert(pod::INJECTED, Node::str(env!("CARGO_PKG_VERSION")));
    }
    for object in rbac::objects(&w.name, &w.namespace, &account, &plan.lease, new_account) {
        rbac::upsert(docs, object);
    }
    notes.push(gate_note(&plan));
    Ok(notes)
}

/// Under hostNetwork every port is the node's: the sidecar's two
/// (`--listen`, `--admin-listen`) and, for a leader-only collector
/// (`second`), its metrics port, from --host-port-base on. Returns the
/// sidecar's ports (none off hostNetwork) and the collector's metrics port.
fn host_ports_for(
    host_network: bool,
    second: bool,
    host_ports: &mut u16,
    args: &InjectArgs,
) -> Result<(Option<(u16, u16)>, u16), String> {
    let mut take_port = || -> Result<u16, String> {
        let port = *host_ports;
        *host_ports = port.checked_add(1).ok_or_else(|| {
            format!(
                "--host-port-base {} leaves no node port for this workload (ports above it run out at 65535)",
                args.host_port_base
            )
        })?;
        Ok(port)
    };
    let ports = match host_network {
        true => Some((take_port()?, take_port()?)),
        false => None,
    };
    let metrics_port = match (second, host_network) {
        (true, true) => take_port()?,
        _ => second::LEADER_METRICS_PORT,
    };
    Ok((ports, metrics_port))
}

/// What the user must know of node ports taken under hostNetwork.
fn host_network_note(ports: Option<(u16, u16)>, metrics_port: Option<u16>) -> Option<String> {
    let (listen, admin) = ports?;
    Some(format!(
        "hostNetwork: the sidecar listens on the node's 127.0.0.1:{listen} and 0.0.0.0:{admin}{}; another hostNetwork workload gated on these nodes needs other ports (--host-port-base)",
        metrics_port.map_or_else(String::new, |port| format!(
            ", the leader-only collector's metrics on {port}"
        ))
    ))
}

/// Said when ServiceAccount `account`, which the RoleBinding names, is not
/// in the input.
fn account_note(docs: &[Node], account: &str, namespace: &str) -> Option<String> {
    let defined = docs.iter().filter_map(Node::as_map).any(|d| {
        d.str("kind") == Some("ServiceAccount")
            && d.at_str(&["metadata", "name"]) == Some(account)
            && d.at_str(&["metadata", "namespace"]).unwrap_or("default") == namespace
    });
    (!defined).then(|| format!(
        "ServiceAccount {account} is not in this input: the RoleBinding names it, so it must exist in namespace {namespace} (a chart or another file may make it)"
    ))
}

/// The last word on a gated workload: its gate, Lease and timings.
fn gate_note(plan: &Plan) -> String {
    format!(
        "gate {}, Lease {}: a crashed leader is replaced after about {}, a graceful hand-over waits at most {}",
        clap::ValueEnum::to_possible_value(&plan.gate)
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        plan.lease,
        crate::duration::HumanDuration(plan.timings.lease_duration),
        crate::duration::HumanDuration(plan.timings.gate_lag)
    )
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
