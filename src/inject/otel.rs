//! An OpenTelemetry Collector configuration split in two for a DaemonSet
//! whose pods all do node work but whose configuration also has receivers
//! that must run once per cluster (`k8s_cluster`, `k8sobjects`,
//! `k8s_events`): the main collector keeps everything else, and a second
//! collector, run under `leader-gate exec` in the same pod (so only on the
//! leader), gets the cluster receivers and the pipelines they feed
//! (docs/gates.md, "Which gate for my collector"). Text in, text out: the
//! pod side (the second container, its ConfigMap) is the caller's.
//!
//! Both collectors share the pod's network namespace, so the leader-only one
//! keeps nothing that binds a port the main one binds (health_check, pprof,
//! zpages) and gets its own metrics port. The receivers' own leader election
//! (`k8s_leader_elector`) is dropped: leader-gate elects instead.

use std::collections::BTreeSet;

use super::yaml::{Map, Node, read_one, write_one};

/// The configuration split in two.
#[derive(Debug)]
pub struct Split {
    /// The main collector's configuration, without the cluster receivers (YAML text).
    pub node: String,
    /// The leader-only collector's configuration (YAML text).
    pub leader: String,
    /// What moved, for the user: e.g. "receiver k8s_cluster (pipeline metrics)".
    pub moved: Vec<String>,
}

/// Which receivers run once per cluster: by type (the part before `/`).
/// `k8s_objects` is `k8sobjects`' newer name (collector-contrib #47440;
/// the OpenTelemetry Operator reads both, and kube-stack writes the new one).
pub const CLUSTER_RECEIVERS: &[&str] = &["k8s_cluster", "k8sobjects", "k8s_objects", "k8s_events"];

/// Extensions that listen on a fixed port: the main collector binds it in the
/// same network namespace, so the leader-only one never gets them.
const BINDING_EXTENSIONS: &[&str] = &["health_check", "healthcheckv2", "pprof", "zpages"];

/// The receivers' own leader election, which leader-gate replaces: the
/// extension's type and the receiver setting that names it.
pub const LEADER_ELECTOR: &str = "k8s_leader_elector";

/// Extensions that keep files on disk: shared by both collectors, the same
/// component in both would open the same files (file_storage names them by
/// component and signal, and locks them).
const STORAGE_EXTENSIONS: &[&str] = &["file_storage", "db_storage"];

/// One `service.pipelines` entry, as far as the split reads it.
struct Pipeline {
    id: String,
    receivers: Vec<String>,
    processors: Vec<String>,
    exporters: Vec<String>,
}

/// The cluster receivers a pipeline of `config` uses (none when it does not
/// read as a collector configuration).
pub fn cluster_receivers_in_use(config: &str) -> Vec<String> {
    let Ok(Node::Map(root)) = read_one(config) else {
        return Vec::new();
    };
    let Ok(pipelines) = read_pipelines(&root) else {
        return Vec::new();
    };
    let mut used: Vec<String> = Vec::new();
    for receiver in pipelines
        .iter()
        .flat_map(|p| &p.receivers)
        .filter(|r| is_cluster(r))
    {
        if !used.contains(receiver) {
            used.push(receiver.clone());
        }
    }
    used
}

/// Splits `config` (the collector's YAML) into the main collector's and the
/// leader-only collector's, the latter's own metrics moved to
/// `leader_metrics_port`. `Ok(None)` when no pipeline uses a cluster
/// receiver: nothing to split, as on a configuration this already split.
pub fn split(config: &str, leader_metrics_port: u16) -> Result<Option<Split>, String> {
    let root = match read_one(config) {
        Ok(Node::Map(root)) => root,
        Ok(_) => return Err("the collector configuration is not a mapping".to_owned()),
        Err(e) => return Err(format!("the collector configuration is not YAML: {e}")),
    };
    let pipelines = read_pipelines(&root)?;

    // Each cluster receiver a pipeline uses, with the pipelines using it, in
    // the order they first appear.
    let mut moved_receivers: Vec<(String, Vec<String>)> = Vec::new();
    for pipeline in &pipelines {
        for receiver in pipeline.receivers.iter().filter(|r| is_cluster(r)) {
            match moved_receivers.iter_mut().find(|(r, _)| r == receiver) {
                Some((_, used_in)) => used_in.push(pipeline.id.clone()),
                None => moved_receivers.push((receiver.clone(), vec![pipeline.id.clone()])),
            }
        }
    }
    if moved_receivers.is_empty() {
        return Ok(None);
    }
    let moved_ids: BTreeSet<&str> = moved_receivers.iter().map(|(r, _)| r.as_str()).collect();
    let defined_receivers = section(&root, "receivers")?;
    for receiver in &moved_ids {
        if defined_receivers.and_then(|r| r.get(receiver)).is_none() {
            return Err(format!(
                "a pipeline uses receiver {receiver}, which `receivers` does not define"
            ));
        }
    }
    let connectors: BTreeSet<&str> = section(&root, "connectors")?
        .map(|c| c.0.iter().map(|(k, _)| k.as_str()).collect())
        .unwrap_or_default();
    let fed: Vec<&Pipeline> = pipelines
        .iter()
        .filter(|p| p.receivers.iter().any(|r| is_cluster(r)))
        .collect();
    for pipeline in &fed {
        // A connector is an exporter here and a receiver in another
        // pipeline: moving one half would leave the other unmatched (the
        // collector refuses that), and moving both would move what the
        // connector's other pipeline does too.
        if let Some(connector) = pipeline
            .exporters
            .iter()
            .find(|e| connectors.contains(e.as_str()))
        {
            return Err(format!(
                "pipeline {} feeds connector {connector} with cluster receivers ({}): \
                 its other half runs elsewhere, so it cannot move to the leader-only \
                 collector; give the cluster receivers a pipeline of their own that \
                 ends in exporters",
                pipeline.id,
                cluster_list(&pipeline.receivers)
            ));
        }
    }

    let mut moved = Vec::new();
    for (receiver, used_in) in &moved_receivers {
        let label = if used_in.len() == 1 {
            "pipeline"
        } else {
            "pipelines"
        };
        moved.push(format!(
            "receiver {receiver} ({label} {})",
            used_in.join(", ")
        ));
    }

    let leader = leader_config(&root, &fed, &moved_ids, leader_metrics_port, &mut moved)?;
    let node = node_config(&root, &moved_ids, &mut moved)?;
    Ok(Some(Split {
        node: write_one(&Node::Map(node)),
        leader: write_one(&Node::Map(leader)),
        moved,
    }))
}

/// Whether a receiver ID (`type` or `type/name`) is a cluster receiver.
pub fn is_cluster(id: &str) -> bool {
    CLUSTER_RECEIVERS.contains(&kind(id))
}

/// An ID's type: the part before `/`.
fn kind(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

fn cluster_list(receivers: &[String]) -> String {
    receivers
        .iter()
        .filter(|r| is_cluster(r))
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

/// A top-level component section: absent or empty (`receivers:`) is none,
/// anything but a mapping is an error.
fn section<'a>(root: &'a Map, key: &str) -> Result<Option<&'a Map>, String> {
    match root.get(key) {
        None | Some(Node::Null) => Ok(None),
        Some(Node::Map(map)) => Ok(Some(map)),
        Some(_) => Err(format!(
            "`{key}` in the collector configuration is not a mapping"
        )),
    }
}

/// `service.pipelines`, read strictly: whatever the split would have to
/// guess about is an error.
fn read_pipelines(root: &Map) -> Result<Vec<Pipeline>, String> {
    let service = match root.get("service") {
        None | Some(Node::Null) => return Ok(Vec::new()),
        Some(Node::Map(service)) => service,
        Some(_) => return Err("`service` in the collector configuration is not a mapping".into()),
    };
    let pipelines = match service.get("pipelines") {
        None | Some(Node::Null) => return Ok(Vec::new()),
        Some(Node::Map(pipelines)) => pipelines,
        Some(_) => return Err("`service.pipelines` is not a mapping".to_owned()),
    };
    let mut out = Vec::new();
    for (id, pipeline) in &pipelines.0 {
        let Node::Map(pipeline) = pipeline else {
            return Err(format!("pipeline {id} is not a mapping"));
        };
        out.push(Pipeline {
            id: id.clone(),
            receivers: names(id, pipeline, "receivers")?,
            processors: names(id, pipeline, "processors")?,
            exporters: names(id, pipeline, "exporters")?,
        });
    }
    Ok(out)
}

/// A pipeline's list of component IDs (absent: none).
fn names(pipeline: &str, map: &Map, key: &str) -> Result<Vec<String>, String> {
    match map.get(key) {
        None | Some(Node::Null) => Ok(Vec::new()),
        Some(Node::Seq(items)) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    format!("pipeline {pipeline}: `{key}` holds something that is not a name")
                })
            })
            .collect(),
        Some(_) => Err(format!("pipeline {pipeline}: `{key}` is not a list")),
    }
}

/// Keeps the entries of the mapping at `key` that `keep` accepts; drops the
/// key when nothing is left (an empty section says nothing).
fn retain_section(root: &mut Map, key: &str, keep: impl Fn(&str) -> bool) {
    if let Some(Node::Map(map)) = root.get_mut(key) {
        map.0.retain(|(k, _)| keep(k));
        if map.0.is_empty() {
            root.remove(key);
        }
    }
}

/// Keeps the names in `service.extensions` that `keep` accepts; drops the key
/// when none is left.
fn retain_service_extensions(root: &mut Map, keep: impl Fn(&str) -> bool) {
    let Some(service) = root.map_mut("service") else {
        return;
    };
    if let Some(Node::Seq(list)) = service.get_mut("extensions") {
        list.retain(|n| n.as_str().is_some_and(&keep));
        if list.is_empty() {
            service.remove("extensions");
        }
    }
}

/// Every string in `node` that names one of `extensions`: how a component
/// refers to an extension (`auth: {authenticator: bearertokenauth}`,
/// `storage: file_storage`, `k8s_leader_elector: k8s_leader_elector/x`).
fn referenced(node: &Node, extensions: &BTreeSet<String>, out: &mut BTreeSet<String>) {
    match node {
        Node::Str(s) if extensions.contains(s) => {
            out.insert(s.clone());
        }
        Node::Seq(items) => items.iter().for_each(|i| referenced(i, extensions, out)),
        Node::Map(map) => map
            .0
            .iter()
            .for_each(|(_, v)| referenced(v, extensions, out)),
        _ => {}
    }
}

fn extension_ids(root: &Map) -> BTreeSet<String> {
    root.map("extensions")
        .map(|e| e.0.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default()
}

/// The leader-only collector's configuration: the cluster receivers, the
/// pipelines they feed (with only them as receivers) and what those
/// pipelines and components use.
/// Exporters that listen rather than push, by type.
const LISTENING_EXPORTERS: &[&str] = &["prometheus"];

fn leader_config(
    root: &Map,
    fed: &[&Pipeline],
    moved_ids: &BTreeSet<&str>,
    metrics_port: u16,
    moved: &mut Vec<String>,
) -> Result<Map, String> {
    let mut leader = root.clone();
    retain_section(&mut leader, "receivers", |k| moved_ids.contains(k));
    // Connectors never move (split refuses a cluster pipeline that feeds one).
    leader.remove("connectors");
    let processors: BTreeSet<&str> = fed
        .iter()
        .flat_map(|p| p.processors.iter().map(String::as_str))
        .collect();
    let exporters: BTreeSet<&str> = fed
        .iter()
        .flat_map(|p| p.exporters.iter().map(String::as_str))
        .collect();
    retain_section(&mut leader, "processors", |k| processors.contains(k));
    retain_section(&mut leader, "exporters", |k| exporters.contains(k));
    // An exporter that listens (Prometheus' pull endpoint) would bind, in
    // the same pod network, the address the node collector already holds:
    // the copy could not start, and the cluster receivers would run nowhere.
    if let Some(id) = exporters
        .iter()
        .find(|id| LISTENING_EXPORTERS.contains(&id.split('/').next().unwrap_or(id)))
    {
        return Err(format!(
            "the cluster receivers' pipeline exports to {id}, which listens on a port the node collector in the same pod holds: give the cluster pipeline an exporter that pushes (otlp, prometheusremotewrite), then run inject again"
        ));
    }

    // The receivers' own election goes: under leader-gate only the leader
    // runs this collector, and a second election on another Lease could
    // pick another pod and keep these receivers idle.
    if let Some(receivers) = leader.map_mut("receivers") {
        for (id, settings) in &mut receivers.0 {
            if let Node::Map(settings) = settings
                && let Some(elector) = settings.remove(LEADER_ELECTOR)
            {
                let named = elector.as_str().unwrap_or("its extension");
                moved.push(format!(
                    "receiver {id}: setting {LEADER_ELECTOR}: {named} dropped, leader-gate elects the leader"
                ));
            }
        }
    }

    // Pipelines: those the cluster receivers fed, with only them as receivers.
    let fed_ids: BTreeSet<&str> = fed.iter().map(|p| p.id.as_str()).collect();
    if let Some(pipelines) = leader
        .map_mut("service")
        .and_then(|s| s.map_mut("pipelines"))
    {
        pipelines.0.retain(|(id, _)| fed_ids.contains(id.as_str()));
        for (_, pipeline) in &mut pipelines.0 {
            if let Node::Map(pipeline) = pipeline {
                pipeline
                    .seq_entry("receivers")
                    .retain(|r| r.as_str().is_some_and(is_cluster));
            }
        }
    }

    // Extensions: only those the kept components refer to, followed through
    // extensions that refer to others.
    let defined = extension_ids(root);
    let mut wanted = BTreeSet::new();
    for key in ["receivers", "processors", "exporters"] {
        if let Some(section) = leader.get(key) {
            referenced(section, &defined, &mut wanted);
        }
    }
    loop {
        let mut more = BTreeSet::new();
        for id in &wanted {
            if let Some(settings) = root.map("extensions").and_then(|e| e.get(id)) {
                referenced(settings, &defined, &mut more);
            }
        }
        let before = wanted.len();
        wanted.extend(more);
        if wanted.len() == before {
            break;
        }
    }
    wanted.retain(|id| {
        let kind = kind(id);
        !BINDING_EXTENSIONS.contains(&kind) && kind != LEADER_ELECTOR
    });
    if let Some(storage) = wanted
        .iter()
        .find(|id| STORAGE_EXTENSIONS.contains(&kind(id)))
    {
        return Err(format!(
            "the cluster pipelines' components use extension {storage}: the leader-only \
             collector would share its files with the main collector (same directory, same \
             component names); give those components no storage, or a storage extension of \
             their own, before splitting"
        ));
    }
    retain_section(&mut leader, "extensions", |k| wanted.contains(k));
    retain_service_extensions(&mut leader, |k| wanted.contains(k));

    let note = move_metrics(leader.map_entry("service"), metrics_port)?;
    moved.push(note);
    Ok(leader)
}

/// Moves the leader-only collector's own metrics (`service.telemetry.metrics`)
/// off the main collector's port: both share the pod's network namespace.
/// Returns what it did, for the user.
fn move_metrics(service: &mut Map, port: u16) -> Result<String, String> {
    let telemetry = match service.get("telemetry") {
        None | Some(Node::Null) => service.map_entry("telemetry"),
        Some(Node::Map(_)) => service.map_entry("telemetry"),
        Some(_) => return Err("`service.telemetry` is not a mapping".to_owned()),
    };
    let metrics = match telemetry.get("metrics") {
        None | Some(Node::Null) => telemetry.map_entry("metrics"),
        Some(Node::Map(_)) => telemetry.map_entry("metrics"),
        Some(_) => return Err("`service.telemetry.metrics` is not a mapping".to_owned()),
    };
    // Level none: the collector serves no metrics, so binds no port.
    if metrics
        .str("level")
        .is_some_and(|l| l.eq_ignore_ascii_case("none"))
    {
        return Ok("the leader-only collector's own metrics stay off (level: none)".to_owned());
    }
    let address = metrics.get("address").cloned();
    let has_readers = !matches!(metrics.get("readers"), None | Some(Node::Null));
    match (address, has_readers) {
        (Some(_), true) => Err(
            "`service.telemetry.metrics` has both `address` and `readers`: say which one the \
             collector serves its metrics on, then split"
                .to_owned(),
        ),
        // The older form (collectors before 0.111 read it; 0.123 and later
        // ignore it): kept in its form, since the user's collector reads it.
        (Some(address), false) => {
            let Some(address) = address.as_str() else {
                return Err("`service.telemetry.metrics.address` is not a string".to_owned());
            };
            let host = match address.rsplit_once(':') {
                Some((host, old)) if !old.is_empty() && old.bytes().all(|b| b.is_ascii_digit()) => {
                    host
                }
                _ => {
                    return Err(format!(
                        "cannot tell the port in `service.telemetry.metrics.address: {address}` \
                         (want HOST:PORT)"
                    ));
                }
            };
            let new = format!("{host}:{port}");
            metrics.insert("address", Node::str(&new));
            Ok(format!(
                "the leader-only collector's own metrics on {new} (address was {address})"
            ))
        }
        (None, true) => {
            let Some(readers) = metrics.get_mut("readers").and_then(Node::as_seq_mut) else {
                return Err("`service.telemetry.metrics.readers` is not a list".to_owned());
            };
            let mut pulled = Vec::new();
            for reader in readers.iter_mut() {
                let Some(exporter) = reader
                    .as_map_mut()
                    .and_then(|r| r.map_mut("pull"))
                    .and_then(|p| p.map_mut("exporter"))
                else {
                    continue;
                };
                // `prometheus`, or `prometheus/development` in newer schemas.
                for (key, value) in &mut exporter.0 {
                    if kind(key) == "prometheus" {
                        pulled.push(value);
                    }
                }
            }
            match pulled.as_mut_slice() {
                // Push readers only: nothing listens.
                [] => Ok(
                    "the leader-only collector's own metrics are pushed, no port to move"
                        .to_owned(),
                ),
                [prometheus] => {
                    let prometheus = match prometheus {
                        Node::Null => {
                            **prometheus = Node::Map(Map::default());
                            prometheus.as_map_mut().expect("just made a mapping")
                        }
                        Node::Map(map) => map,
                        _ => {
                            return Err(
                                "a Prometheus reader in `service.telemetry.metrics.readers` \
                                        is not a mapping"
                                    .to_owned(),
                            );
                        }
                    };
                    prometheus.insert("port", Node::Int(i64::from(port)));
                    Ok(format!(
                        "the leader-only collector's own metrics on port {port}"
                    ))
                }
                _ => Err(
                    "`service.telemetry.metrics.readers` has several Prometheus readers: one \
                     port for the leader-only collector cannot replace them all"
                        .to_owned(),
                ),
            }
        }
        // The collector's default reader serves on port 8888 (localhost since
        // 0.111, all interfaces before), as the main collector does: say a
        // port explicitly, on loopback as the newer default.
        (None, false) => {
            let mut prometheus = Map::default();
            prometheus.insert("host", Node::str("127.0.0.1"));
            prometheus.insert("port", Node::Int(i64::from(port)));
            let mut exporter = Map::default();
            exporter.insert("prometheus", Node::Map(prometheus));
            let mut pull = Map::default();
            pull.insert("exporter", Node::Map(exporter));
            let mut reader = Map::default();
            reader.insert("pull", Node::Map(pull));
            metrics.insert("readers", Node::Seq(vec![Node::Map(reader)]));
            Ok(format!(
                "the leader-only collector's own metrics on 127.0.0.1:{port} (the default 8888 is the main collector's)"
            ))
        }
    }
}

/// The main collector's configuration: the cluster receivers gone from
/// `receivers` and every pipeline, a pipeline left without receivers gone.
/// Processors and exporters only those pipelines used stay defined: the
/// collector starts only what a pipeline names.
fn node_config(
    root: &Map,
    moved_ids: &BTreeSet<&str>,
    moved: &mut Vec<String>,
) -> Result<Map, String> {
    let mut node = root.clone();
    if let Some(receivers) = node.map_mut("receivers") {
        receivers.0.retain(|(k, _)| !moved_ids.contains(k.as_str()));
    }
    let mut emptied = Vec::new();
    if let Some(pipelines) = node.map_mut("service").and_then(|s| s.map_mut("pipelines")) {
        for (id, pipeline) in &mut pipelines.0 {
            let Some(receivers) = pipeline
                .as_map_mut()
                .and_then(|p| p.get_mut("receivers"))
                .and_then(Node::as_seq_mut)
            else {
                continue;
            };
            receivers.retain(|r| !r.as_str().is_some_and(|r| moved_ids.contains(r)));
            if receivers.is_empty() {
                emptied.push(id.clone());
            }
        }
        pipelines.0.retain(|(id, _)| !emptied.contains(id));
    }
    for id in &emptied {
        moved.push(format!(
            "pipeline {id}: moved whole, the main collector no longer has it"
        ));
    }
    let pipelines_left = node
        .at(&["service", "pipelines"])
        .is_some_and(|p| !p.0.is_empty());
    let receivers_left = node.map("receivers").is_some_and(|r| !r.0.is_empty());
    if !pipelines_left || !receivers_left {
        return Err(
            "the collector has nothing but cluster receivers: nothing is left for every node \
             to run, so gate the whole collector (exec) rather than split it"
                .to_owned(),
        );
    }

    // The receivers' election extension goes once nothing in the main
    // collector refers to it: left in `service.extensions`, it would keep
    // contending for its Lease in every pod for nothing.
    let defined = extension_ids(&node);
    let electors: BTreeSet<String> = defined
        .iter()
        .filter(|id| kind(id) == LEADER_ELECTOR)
        .cloned()
        .collect();
    if !electors.is_empty() {
        let mut still = BTreeSet::new();
        for key in ["receivers", "processors", "exporters", "connectors"] {
            if let Some(section) = node.get(key) {
                referenced(section, &electors, &mut still);
            }
        }
        if let Some(extensions) = node.map("extensions") {
            for (id, settings) in &extensions.0 {
                if !electors.contains(id) {
                    referenced(settings, &electors, &mut still);
                }
            }
        }
        let gone: BTreeSet<&String> = electors.difference(&still).collect();
        retain_section(&mut node, "extensions", |k| {
            !gone.iter().any(|g| g.as_str() == k)
        });
        retain_service_extensions(&mut node, |k| !gone.iter().any(|g| g.as_str() == k));
        for id in gone {
            moved.push(format!(
                "extension {id}: removed, leader-gate elects the leader instead"
            ));
        }
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::yaml::read_stream;

    const PORT: u16 = 8889;

    /// The chart's rendered `relay` configuration (k8s_cluster with the
    /// chart's own k8s_leader_elector).
    fn relay() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/upstream/otel-helm-daemonset-cluster-metrics.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        read_stream(&text)
            .unwrap()
            .iter()
            .find_map(|d| {
                let d = d.as_map()?;
                (d.str("kind") == Some("ConfigMap")
                    && d.at_str(&["metadata", "name"])
                        == Some("example-opentelemetry-collector-agent"))
                .then(|| d.at_str(&["data", "relay"]).map(str::to_owned))?
            })
            .expect("the fixture's relay configuration")
    }

    fn map(text: &str) -> Map {
        match read_one(text).unwrap() {
            Node::Map(m) => m,
            other => panic!("not a mapping: {other:?}"),
        }
    }

    fn keys(map: Option<&Map>) -> Vec<&str> {
        map.map(|m| m.0.iter().map(|(k, _)| k.as_str()).collect())
            .unwrap_or_default()
    }

    fn strs(node: &Map, key: &str) -> Vec<String> {
        node.seq(key)
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_chart_relay_splits_into_node_and_leader() {
        let relay = relay();
        let split = split(&relay, PORT).unwrap().expect("k8s_cluster is there");

        let leader = map(&split.leader);
        assert_eq!(keys(leader.map("receivers")), ["k8s_cluster"]);
        assert_eq!(
            keys(leader.at(&["service", "pipelines"])),
            ["metrics"],
            "{}",
            split.leader
        );
        let metrics = leader.at(&["service", "pipelines", "metrics"]).unwrap();
        assert_eq!(strs(metrics, "receivers"), ["k8s_cluster"]);
        assert_eq!(strs(metrics, "processors"), ["memory_limiter", "batch"]);
        assert_eq!(strs(metrics, "exporters"), ["debug"]);
        assert_eq!(keys(leader.map("processors")), ["batch", "memory_limiter"]);
        assert_eq!(keys(leader.map("exporters")), ["debug"]);
        assert!(!split.leader.contains("health_check"), "{}", split.leader);
        assert!(!split.leader.contains(LEADER_ELECTOR), "{}", split.leader);
        assert!(leader.get("extensions").is_none());
        assert!(leader.at(&["service"]).unwrap().get("extensions").is_none());
        // The k8s_cluster settings other than the election stay.
        assert_eq!(
            leader.at_str(&["receivers", "k8s_cluster", "collection_interval"]),
            Some("10s")
        );
        let telemetry = leader.at(&["service", "telemetry"]).unwrap();
        let prometheus = telemetry.map("metrics").unwrap().seq("readers")[0]
            .at(&["pull", "exporter", "prometheus"])
            .unwrap();
        assert_eq!(prometheus.get("port"), Some(&Node::Int(PORT.into())));
        assert_eq!(prometheus.str("host"), Some("${env:MY_POD_IP}"));
        // The resource attributes stay (their !!str tags do not: yaml.rs).
        assert_eq!(
            telemetry.at_str(&["resource", "k8s.pod.name"]),
            Some("${env:OTEL_K8S_POD_NAME}")
        );

        let node = map(&split.node);
        assert!(!split.node.contains("k8s_cluster"), "{}", split.node);
        assert!(!split.node.contains(LEADER_ELECTOR), "{}", split.node);
        assert_eq!(
            keys(node.map("receivers")),
            ["jaeger", "otlp", "prometheus", "zipkin"]
        );
        let original = map(&relay);
        let node_metrics = node.at(&["service", "pipelines", "metrics"]).unwrap();
        assert_eq!(strs(node_metrics, "receivers"), ["otlp", "prometheus"]);
        for unchanged in ["traces", "logs"] {
            assert_eq!(
                node.at(&["service", "pipelines", unchanged]),
                original.at(&["service", "pipelines", unchanged])
            );
        }
        assert_eq!(
            strs(node.map("service").unwrap(), "extensions"),
            ["health_check"]
        );
        assert!(node.at(&["extensions", "health_check"]).is_some());
        assert_eq!(
            node.at(&["service", "telemetry"]),
            original.at(&["service", "telemetry"]),
            "the main collector's telemetry is its own"
        );

        assert!(
            split
                .moved
                .contains(&"receiver k8s_cluster (pipeline metrics)".to_owned()),
            "{:?}",
            split.moved
        );
        assert!(
            split
                .moved
                .iter()
                .any(|m| m.contains("k8s_leader_elector/k8s_cluster: removed")),
            "{:?}",
            split.moved
        );

        // The main collector's half is split already.
        assert!(super::split(&split.node, PORT).unwrap().is_none());
    }

    #[test]
    fn no_cluster_receiver_is_nothing_to_split() {
        let config = "receivers: {otlp: {}}\nexporters: {debug: {}}\n\
                      service: {pipelines: {traces: {receivers: [otlp], exporters: [debug]}}}\n";
        assert!(split(config, PORT).unwrap().is_none());
        // Defined but in no pipeline: it never runs, so nothing moves.
        let config = "receivers: {otlp: {}, k8s_cluster: {}}\nexporters: {debug: {}}\n\
                      service: {pipelines: {traces: {receivers: [otlp], exporters: [debug]}}}\n";
        assert!(split(config, PORT).unwrap().is_none());
    }

    #[test]
    fn odd_input_is_an_error() {
        for (config, says) in [
            ("- a\n- b\n", "not a mapping"),
            ("just text\n", "not a mapping"),
            ("service: [x]\n", "`service`"),
            ("service: {pipelines: [metrics]}\n", "`service.pipelines`"),
            ("service: {pipelines: {metrics: 3}}\n", "pipeline metrics"),
            (
                "service: {pipelines: {metrics: {receivers: k8s_cluster}}}\n",
                "`receivers` is not a list",
            ),
            (
                "service: {pipelines: {metrics: {receivers: [{k8s_cluster: 1}]}}}\n",
                "not a name",
            ),
            (
                "receivers: {otlp: {}}\nservice: {pipelines: {metrics: {receivers: [k8s_cluster, otlp]}}}\n",
                "does not define",
            ),
            (
                "receivers: [k8s_cluster]\nservice: {pipelines: {metrics: {receivers: [k8s_cluster]}}}\n",
                "`receivers`",
            ),
            ("{a: [1\n", "not YAML"),
        ] {
            let err = split(config, PORT).expect_err(config);
            assert!(err.contains(says), "{config}: {err}");
        }
    }

    #[test]
    fn a_cluster_receiver_feeding_a_connector_is_refused() {
        let config = "receivers: {k8s_cluster: {}, otlp: {}}\n\
                      connectors: {count: {}}\n\
                      exporters: {debug: {}}\n\
                      service:\n  pipelines:\n\
                      \x20   metrics: {receivers: [k8s_cluster, otlp], exporters: [count]}\n\
                      \x20   metrics/count: {receivers: [count], exporters: [debug]}\n";
        let err = split(config, PORT).unwrap_err();
        assert!(err.contains("connector count"), "{err}");
    }

    #[test]
    fn only_cluster_receivers_is_refused() {
        let config = "receivers: {k8sobjects: {}}\nexporters: {debug: {}}\n\
                      service: {pipelines: {logs: {receivers: [k8sobjects], exporters: [debug]}}}\n";
        let err = split(config, PORT).unwrap_err();
        assert!(err.contains("gate the whole collector"), "{err}");
    }

    #[test]
    fn the_older_address_form_moves_to_the_port() {
        let config = "receivers: {otlp: {}, k8s_events/all: {}}\n\
                      exporters: {debug: {}}\n\
                      service:\n\
                      \x20 telemetry: {metrics: {address: 0.0.0.0:8888}}\n\
                      \x20 pipelines:\n\
                      \x20   logs: {receivers: [otlp, k8s_events/all], exporters: [debug]}\n";
        let split = split(config, PORT).unwrap().unwrap();
        let leader = map(&split.leader);
        assert_eq!(
            leader.at_str(&["service", "telemetry", "metrics", "address"]),
            Some("0.0.0.0:8889")
        );
        assert_eq!(keys(leader.map("receivers")), ["k8s_events/all"]);
        let node = map(&split.node);
        assert_eq!(
            node.at_str(&["service", "telemetry", "metrics", "address"]),
            Some("0.0.0.0:8888")
        );
    }

    #[test]
    fn telemetry_absent_gets_an_explicit_port() {
        let config = "receivers: {otlp: {}, k8sobjects: {}}\n\
                      exporters: {debug: {}}\n\
                      service: {pipelines: {logs: {receivers: [otlp, k8sobjects], exporters: [debug]}}}\n";
        let split = split(config, PORT).unwrap().unwrap();
        let leader = map(&split.leader);
        let prometheus = leader
            .at(&["service", "telemetry", "metrics"])
            .unwrap()
            .seq("readers")[0]
            .at(&["pull", "exporter", "prometheus"])
            .unwrap();
        assert_eq!(prometheus.str("host"), Some("127.0.0.1"));
        assert_eq!(prometheus.get("port"), Some(&Node::Int(PORT.into())));
        // Level none serves nothing: left alone.
        let off = config.replace(
            "service: {",
            "service: {telemetry: {metrics: {level: none}}, ",
        );
        let leader = map(&super::split(&off, PORT).unwrap().unwrap().leader);
        assert_eq!(
            keys(leader.at(&["service", "telemetry", "metrics"])),
            ["level"]
        );
    }

    #[test]
    fn the_leader_keeps_the_extensions_its_components_use() {
        let config = "\
extensions:
  health_check: {}
  pprof: {}
  bearertokenauth: {token: x}
  oauth2client/unused: {}
receivers:
  otlp: {}
  k8s_cluster: {}
exporters:
  otlphttp: {endpoint: 'https://x', auth: {authenticator: bearertokenauth}}
  debug: {}
service:
  extensions: [health_check, pprof, bearertokenauth, oauth2client/unused]
  pipelines:
    metrics: {receivers: [k8s_cluster], exporters: [otlphttp]}
    traces: {receivers: [otlp], exporters: [debug]}
";
        let split = split(config, PORT).unwrap().unwrap();
        let leader = map(&split.leader);
        assert_eq!(keys(leader.map("extensions")), ["bearertokenauth"]);
        assert_eq!(
            strs(leader.map("service").unwrap(), "extensions"),
            ["bearertokenauth"]
        );
        assert_eq!(keys(leader.map("exporters")), ["otlphttp"]);
        // The main collector loses the pipeline, keeps the definitions.
        let node = map(&split.node);
        assert_eq!(keys(node.at(&["service", "pipelines"])), ["traces"]);
        assert_eq!(keys(node.map("exporters")), ["otlphttp", "debug"]);
        assert_eq!(keys(node.map("receivers")), ["otlp"]);
        assert!(
            split
                .moved
                .iter()
                .any(|m| m.starts_with("pipeline metrics"))
        );
    }

    #[test]
    fn shared_file_storage_is_refused() {
        let config = "\
extensions: {file_storage: {directory: /var/lib/otelcol}}
receivers: {otlp: {}, k8s_cluster: {}}
exporters: {otlp: {endpoint: x, sending_queue: {storage: file_storage}}}
service:
  extensions: [file_storage]
  pipelines:
    metrics: {receivers: [otlp, k8s_cluster], exporters: [otlp]}
";
        let err = split(config, PORT).unwrap_err();
        assert!(err.contains("file_storage"), "{err}");
    }

    #[test]
    fn a_cluster_pipeline_exporting_to_a_listening_exporter_is_refused() {
        let config = "receivers: {otlp: {}, k8s_cluster: {}}\n\
                      exporters: {prometheus: {endpoint: '0.0.0.0:8889'}, debug: {}}\n\
                      service: {pipelines: {metrics: {receivers: [otlp, k8s_cluster], exporters: [prometheus]}, traces: {receivers: [otlp], exporters: [debug]}}}\n";
        let error = split(config, 18888).unwrap_err();
        assert!(
            error.contains("exports to prometheus, which listens"),
            "{error}"
        );
    }
}
