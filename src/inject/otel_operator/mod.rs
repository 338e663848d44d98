//! An `OpenTelemetryCollector` of the OpenTelemetry Operator, gated as
//! `inject` gates the Collector chart's DaemonSet ([`super::second`]): the
//! operator's own collector keeps every pipeline but the cluster receivers',
//! and a leader-only copy in `spec.additionalContainers`, reading a
//! ConfigMap `inject` writes, runs those under `leader-gate exec`; the
//! sidecar and the install step go in `spec.initContainers`. The hand-made
//! shape is examples/opentelemetry-operator/collector.yaml.
//!
//! What the operator does with the resource, read in
//! open-telemetry/opentelemetry-operator at be8944414a876f17fcdeb5a59b86b8866fb5c88e
//! (operator 0.158.0):
//!
//! - Its collector container (`internal/manifests/collector/container.go`)
//!   is `otc-container`: image `spec.image`, else the operator's own
//!   `--collector-image` (`RELATED_IMAGE_COLLECTOR` below it,
//!   `internal/config/config.go` `Apply`, `env.go`), whose default is the
//!   core distribution `opentelemetry-collector:VERSION`
//!   (`internal/config/config.go`), which has none of the cluster
//!   receivers; args `--config=/conf/collector.yaml`, then `spec.args` as
//!   sorted `--KEY=VALUE` (a `config` key dropped); command `spec.command`
//!   (since 0.153.0) else the image's entrypoint; `spec.env`, `envFrom`,
//!   `volumeMounts`, `resources`, `securityContext`, `lifecycle`. So the
//!   copy ([`copy`]) needs the image by name: `spec.image`, else the
//!   `--collector-image` of an operator Deployment in the same stream;
//!   without either `inject` refuses, naming `spec.image`.
//! - The pod (`daemonset.go`, `deployment.go`, `statefulset.go`): service
//!   account `spec.serviceAccount`, else `<name>-collector`, which the
//!   operator makes itself (`serviceaccount.go`, `internal/naming`);
//!   `spec.initContainers` as they are, `otc-container` then
//!   `spec.additionalContainers`; `spec.volumes` after its own; its
//!   `terminationGracePeriodSeconds` is `spec.terminationGracePeriodSeconds`
//!   (unset: the API server's 30 s). `mode` defaults to `deployment`
//!   (`internal/webhook/collector_webhook.go`); `sidecar` refuses
//!   `additionalContainers`.
//! - `spec.config` (`apis/v1beta1/config.go`) is the configuration as a
//!   mapping (`receivers`, `exporters`, `service` required), rendered as
//!   it is into a ConfigMap of the operator's (`configmap.go`); its
//!   automatic RBAC (`rbac.go`, `internal/otelconfig/config.go`) grants the
//!   service account what the components *in a pipeline* need. The
//!   receivers `inject` moves leave `spec.config`, so the operator stops
//!   granting theirs: [`receivers`] writes those rules again.
//! - The hand-over hook goes on the copy, as in the chart's DaemonSet, so
//!   `spec.lifecycle` stays the user's; the grace period is
//!   `spec.terminationGracePeriodSeconds`, raised when short.
//!
//! A configuration whose every pipeline reads a cluster receiver would
//! leave the operator's collector with no pipeline, and a collector
//! without one does not start: it gets an idle `nop` → `nop` pipeline
//! instead, where the image's distribution has both (contrib since
//! 0.98.0; open-telemetry/opentelemetry-collector-releases #519, and the
//! `otelcol-k8s` distribution has a nop exporter but no nop receiver), and
//! is refused otherwise.

// `crate::inject::` rather than `super::`: scripts/module_graph.py reads a
// `super::` path in a file with inline tests as the file itself.
use crate::inject::plan::{GateKind, Plan, Timings};
use crate::inject::pod::{self, INJECTED};
use crate::inject::second::{self, LeaderMap};
use crate::inject::workload::{
    self, Collector, OTEL_CONTAINER, SECOND_SUFFIX, Workload, config_map_doc,
};
use crate::inject::yaml::{Map, Node, read_one, write_one};
use crate::inject::{InjectArgs, otel, rbac};

mod copy;
mod receivers;

use copy::{CONFIG_KEY, copy_container, core_distribution, has_nop, image};

/// The idle pipeline's components, named for `inject`.
const IDLE: &str = "nop/leader-gate";
const IDLE_PIPELINE: &str = "logs/leader-gate-idle";

/// The operator's `naming.DNSName(naming.Truncate("BEFORE%sAFTER", 63,
/// value))` (`internal/naming`): the value shortened so the name fits 63
/// characters, non-alphanumerics trimmed off its ends, then lower-cased
/// with every other character a `-` (an `a` first or last).
fn operator_name(before: &str, value: &str, after: &str) -> String {
    let value: Vec<char> = value.chars().collect();
    let excess = (before.len() + value.len() + after.len()).saturating_sub(63);
    let kept: String = value[..value.len().saturating_sub(excess)].iter().collect();
    let mut name = format!("{before}{kept}{after}");
    if name.len() > 63 {
        name = name.chars().take(63).collect();
    } else {
        name = name
            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_owned();
    }
    let last = name.chars().count().saturating_sub(1);
    name.to_lowercase()
        .chars()
        .enumerate()
        .map(|(i, c)| match c {
            'a'..='z' | '0'..='9' => c,
            _ if i == 0 || i == last => 'a',
            _ => '-',
        })
        .collect()
}

/// The pod's ServiceAccount when `spec.serviceAccount` is unset, which the
/// operator makes.
pub fn operator_account(name: &str) -> String {
    operator_name("", name, "-collector")
}

/// The receivers of `config`'s pipelines: (cluster ones, others).
fn pipeline_receivers(config: &Map) -> (Vec<String>, Vec<String>) {
    let (mut cluster, mut other) = (Vec::new(), Vec::new());
    let pipelines = config.at(&["service", "pipelines"]);
    for (_, pipeline) in pipelines.map(|p| p.0.as_slice()).unwrap_or_default() {
        let receivers = pipeline
            .as_map()
            .map(|p| p.seq("receivers"))
            .unwrap_or_default();
        for id in receivers.iter().filter_map(Node::as_str) {
            let list = if otel::is_cluster(id) {
                &mut cluster
            } else {
                &mut other
            };
            if !list.iter().any(|r| r == id) {
                list.push(id.to_owned());
            }
        }
    }
    (cluster, other)
}

/// Gives `config` a pipeline that does nothing, `nop` to `nop`, for when
/// every pipeline it had moves to the leader-only copy.
fn add_idle_pipeline(config: &mut Map) {
    let empty = || Node::Map(Map::default());
    config.map_entry("receivers").insert(IDLE, empty());
    config.map_entry("exporters").insert(IDLE, empty());
    let mut pipeline = Map::default();
    pipeline.insert("receivers", Node::Seq(vec![Node::str(IDLE)]));
    pipeline.insert("exporters", Node::Seq(vec![Node::str(IDLE)]));
    config
        .map_entry("service")
        .map_entry("pipelines")
        .insert(IDLE_PIPELINE, Node::Map(pipeline));
}

/// The pod-spec fields `spec` holds, as [`pod::gate`] reads them:
/// `additionalContainers` as the containers.
fn pod_of(spec: &Map) -> Map {
    let mut pod = Map::default();
    for (from, to) in [
        ("initContainers", "initContainers"),
        ("additionalContainers", "containers"),
        ("volumes", "volumes"),
        (
            "terminationGracePeriodSeconds",
            "terminationGracePeriodSeconds",
        ),
    ] {
        if let Some(value) = spec.get(from) {
            pod.insert(to, value.clone());
        }
    }
    pod
}

/// Writes what [`pod::gate`] made of [`pod_of`] back into `spec`.
fn write_back(spec: &mut Map, pod: Map) {
    for (key, value) in pod.0 {
        let key = if key == "containers" {
            "additionalContainers"
        } else {
            key.as_str()
        };
        spec.insert(key, value);
    }
}

/// `spec.config`, ready for the split: what `inject` cannot gate refused,
/// an idle pipeline added when every pipeline would leave.
fn config_to_split(
    docs: &[Node],
    namespace: &str,
    spec: &Map,
    image: &str,
    leader_map: &str,
    notes: &mut Vec<String>,
) -> Result<Map, String> {
    let mut config = match spec.get("config") {
        Some(Node::Map(config)) => config.clone(),
        _ => return Err("spec.config is not a mapping".to_owned()),
    };
    let (cluster, other) = pipeline_receivers(&config);
    // A second run finds them split already, in the leader-only ConfigMap.
    if cluster.is_empty() && config_map_doc(docs, namespace, leader_map).is_none() {
        return Err(format!(
            "its spec.config runs none of the receivers that work once per cluster ({}): nothing to gate",
            otel::CLUSTER_RECEIVERS.join(", ")
        ));
    }
    if !cluster.is_empty() && core_distribution(image) {
        return Err(format!(
            "its pipelines read {} but {image} is the core distribution, which has none of the cluster receivers: run opentelemetry-collector-k8s or -contrib (spec.image)",
            cluster.join(", ")
        ));
    }
    if !cluster.is_empty() && other.is_empty() {
        if !has_nop(image) {
            return Err(format!(
                "every pipeline reads a cluster receiver ({}): the operator's collector would be left with none, and a collector without a pipeline does not start. inject gives it an idle nop pipeline only on an image whose distribution has the nop receiver and exporter (contrib 0.98.0 and later; otelcol-k8s has no nop receiver), and {image} is not one: run the contrib image, keep a pipeline of your own in spec.config, or run the collector as a Deployment of your own and gate it whole (inject --gate exec)",
                cluster.join(", ")
            ));
        }
        add_idle_pipeline(&mut config);
        notes.push(format!(
            "every pipeline read a cluster receiver: {OTEL_CONTAINER} keeps an idle pipeline {IDLE_PIPELINE} ({IDLE} to {IDLE}), since a collector without one does not start; on the leader the copy runs them all"
        ));
    }
    Ok(config)
}

/// Gates the OpenTelemetryCollector `w`: the split, the copy, the sidecar,
/// and the RBAC of both; returns what the user should know.
pub fn gate(
    docs: &mut Vec<Node>,
    w: &Workload,
    args: &InjectArgs,
    host_ports: &mut u16,
) -> Result<Vec<String>, String> {
    if let Some(other) = args.gate.filter(|g| *g != GateKind::Exec) {
        let other = clap::ValueEnum::to_possible_value(&other)
            .map_or_else(String::new, |v| v.get_name().to_owned());
        return Err(format!(
            "--gate {other}: inject gates an OpenTelemetryCollector one way, its cluster receivers in a leader-only copy under exec"
        ));
    }
    // Refuses mode sidecar, and a --container other than the operator's.
    workload::collector(docs, w, args.container.as_deref())?;
    let spec = docs[w.doc].at(&["spec"]).cloned().ok_or("no spec")?;
    let mut notes = Vec::new();
    let (image, said) = image(docs, &spec)?;
    notes.extend(said);
    if spec.get("command").is_none() && Collector::entrypoint(&image).is_none() {
        return Err(format!(
            "inject does not know the collector binary of image {image}, which the leader-only copy runs under exec: set spec.command to it"
        ));
    }
    let leader_map = format!("{}{SECOND_SUFFIX}", w.name);
    let config = config_to_split(docs, &w.namespace, &spec, &image, &leader_map, &mut notes)?;
    let host_network = spec.get("hostNetwork") == Some(&Node::Bool(true));
    let (ports, metrics_port) = super::host_ports_for(host_network, true, host_ports, args)?;
    notes.extend(super::host_network_note(ports, Some(metrics_port)));
    let target = LeaderMap {
        namespace: &w.namespace,
        name: &leader_map,
        key: CONFIG_KEY,
    };
    // The leader-only ConfigMap goes before the resource that mounts it.
    let text = write_one(&Node::Map(config));
    let (node, said) =
        second::split_config(docs, &target, &text, metrics_port, w.doc, OTEL_CONTAINER)?;
    notes.extend(said);
    let w = &w.refind(docs).ok_or("no spec")?;
    let leader_config = config_map_doc(docs, &w.namespace, &leader_map)
        .and_then(|at| docs[at].at(&["data"]))
        .and_then(|d| d.str(CONFIG_KEY))
        .map(str::to_owned)
        .ok_or_else(|| format!("ConfigMap {leader_map} has no key {CONFIG_KEY}"))?;
    let copy = copy_container(&spec, &image)?;
    let plan = Plan {
        gate: GateKind::Exec,
        lease: args
            .lease
            .clone()
            .unwrap_or_else(|| format!("{}-leader", w.name)),
        timings: Timings::for_gate(GateKind::Exec, None),
        image: args.image.clone(),
        ports,
        health_url: None,
        revision_label: w.revision_label(),
        file: None,
        operator_merged: false,
    };
    let spec = docs[w.doc].at_mut(&["spec"]).ok_or("no spec")?;
    if let Some(node) = node {
        let node = read_one(&node).map_err(|e| format!("the split configuration: {e}"))?;
        spec.insert("config", node);
    }
    let mut pod = pod_of(spec);
    let copy_name = format!("{OTEL_CONTAINER}{SECOND_SUFFIX}");
    let containers = pod.seq_entry("containers");
    pod::upsert(containers, "name", Node::Map(copy));
    let at = containers
        .iter()
        .position(|c| c.as_map().and_then(|c| c.str("name")) == Some(copy_name.as_str()))
        .expect("just put there");
    second::put_config_volume(pod.seq_entry("volumes"), &leader_map);
    notes.extend(pod::gate(&mut pod, at, Collector::OtelCollector, &plan)?);
    write_back(spec, pod);
    spec.map_entry("podAnnotations")
        .insert(INJECTED, Node::str(env!("CARGO_PKG_VERSION")));
    let named = spec.str("serviceAccount").map(str::to_owned);
    let node_config = spec.map("config").cloned().unwrap_or_default();
    let account = match named {
        Some(account) => {
            notes.extend(super::account_note(docs, &account, &w.namespace));
            account
        }
        // The operator makes this one: nothing to add, nothing to say.
        None => operator_account(&w.name),
    };
    let (cluster_rbac, said) = receivers::objects(
        &w.name,
        &w.namespace,
        &account,
        &node_config,
        &leader_config,
    );
    notes.extend(said);
    for object in rbac::objects(&w.name, &w.namespace, &account, &plan.lease, false)
        .into_iter()
        .chain(cluster_rbac)
    {
        rbac::upsert(docs, object);
    }
    notes.push(super::gate_note(&plan));
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_account_name_is_shortened_and_made_dns_safe_as_the_operator_does() {
        assert_eq!(operator_account("simplest"), "simplest-collector");
        // 63 at most: the name gives way, the suffix stays.
        let long = "a".repeat(60);
        let name = operator_account(&long);
        assert_eq!(name.len(), 63);
        assert!(name.ends_with("-collector"));
        // Dots (allowed in a resource's name) become dashes.
        assert_eq!(operator_account("my.otel"), "my-otel-collector");
        assert_eq!(operator_name("configmap-", "Certs", ""), "configmap-certs");
    }
}
