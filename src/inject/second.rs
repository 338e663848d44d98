//! A second collector container for the part of a DaemonSet collector's
//! configuration that must run once per cluster (an OpenTelemetry
//! Collector's `k8s_cluster`, `k8sobjects`, `k8s_events` receivers): the
//! collector keeps its node work on every pod, and a copy of it, reading the
//! leader-only configuration from a ConfigMap of its own, runs under `exec`
//! on the leader only (docs/gates.md, "Which gate for my collector").

use super::otel;
use super::workload::{SECOND_SUFFIX as SUFFIX, Workload, config_map_doc, mounted_config_map};
use super::yaml::{Map, Node};

/// Where the second container reads its configuration.
pub const CONFIG_DIR: &str = "/etc/leader-gate/collector";
pub const VOL_CONFIG: &str = "leader-gate-collector-config";
/// The leader-only collector's own metrics port: the collector's 8888 is
/// taken in the pod's network namespace (under hostNetwork the port comes
/// from `--host-port-base` instead).
pub const LEADER_METRICS_PORT: u16 = 18888;

/// Where a collector container's `--config` comes from.
struct ConfigSource {
    /// The `--config` argument's place in `args`.
    arg: usize,
    config_map: String,
    key: String,
}

/// The ConfigMap key a collector reads through `--config=PATH` (or
/// `--config PATH`) in its args, through the ConfigMap volume mounted above PATH.
fn config_source(pod: &Map, container: &Map) -> Result<ConfigSource, String> {
    let args = container.seq("args");
    let (arg, path) = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| {
            let a = a.as_str()?;
            match a.strip_prefix("--config=") {
                Some(path) => Some((i, path.to_owned())),
                None if a == "--config" => Some((i + 1, args.get(i + 1)?.as_str()?.to_owned())),
                None => None,
            }
        })
        .ok_or("its collector has no --config argument to read its configuration from")?;
    for mount in container
        .seq("volumeMounts")
        .iter()
        .filter_map(Node::as_map)
    {
        let Some(dir) = mount.str("mountPath") else {
            continue;
        };
        let Some(rel) = path.strip_prefix(dir).map(|r| r.trim_start_matches('/')) else {
            continue;
        };
        let Some(cm) = mounted_config_map(pod, mount) else {
            continue;
        };
        let key = cm
            .seq("items")
            .iter()
            .filter_map(Node::as_map)
            .find(|i| i.str("path") == Some(rel))
            .and_then(|i| i.str("key"))
            .unwrap_or(rel);
        return Ok(ConfigSource {
            arg,
            config_map: cm
                .str("name")
                .ok_or("a configMap volume without a name")?
                .to_owned(),
            key: key.to_owned(),
        });
    }
    Err(format!(
        "its collector's --config {path} is not in a ConfigMap it mounts"
    ))
}

/// Splits the collector's configuration (its ConfigMap keeps the node
/// part, `<workload>-leader-only` gets the cluster part) and adds the second
/// container; returns its index in `containers`, and what it did.
pub fn add(
    docs: &mut Vec<Node>,
    w: &Workload,
    collector: usize,
    metrics_port: u16,
) -> Result<(usize, Vec<String>), String> {
    let pod = w.pod_spec(docs).ok_or("no pod spec")?;
    let container = pod.seq("containers")[collector]
        .as_map()
        .cloned()
        .unwrap_or_default();
    let name = container.str("name").unwrap_or("collector").to_owned();
    let source = config_source(pod, &container)?;
    let cm_doc = config_map_doc(docs, &w.namespace, &source.config_map).ok_or_else(|| {
        format!(
            "its collector's ConfigMap {} is not in the input",
            source.config_map
        )
    })?;
    let text = docs[cm_doc]
        .at(&["data"])
        .and_then(|d| d.str(&source.key))
        .ok_or_else(|| format!("ConfigMap {} has no key {}", source.config_map, source.key))?
        .to_owned();
    let leader_map = format!("{}{SUFFIX}", w.name);
    let target = LeaderMap {
        namespace: &w.namespace,
        name: &leader_map,
        key: &source.key,
    };
    let (node, notes) = split_config(docs, &target, &text, metrics_port, cm_doc + 1, &name)?;
    if let (Some(node), Some(data)) = (node, docs[cm_doc].at_mut(&["data"])) {
        data.insert(&source.key, Node::str(node));
    }
    // The copy: the collector's image, command, env, resources and mounts;
    // none of its ports (hostPorts would clash), probes or hooks.
    let mut second = container.clone();
    second.insert("name", Node::str(format!("{name}{SUFFIX}")));
    for key in [
        "ports",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
    ] {
        second.remove(key);
    }
    if let Some(args) = second.get_mut("args").and_then(Node::as_seq_mut) {
        let file = format!("{CONFIG_DIR}/{}", source.key);
        match args.get(source.arg).and_then(Node::as_str) {
            Some(a) if a.starts_with("--config=") => {
                args[source.arg] = Node::str(format!("--config={file}"))
            }
            Some(_) => args[source.arg] = Node::str(file),
            None => return Err("its collector's --config has no value".to_owned()),
        }
    }
    second.seq_entry("volumeMounts").push(config_mount());
    // The ConfigMap added before it moved the workload.
    let w = &w.refind(docs).ok_or("no pod spec")?;
    let pod = w.pod_spec_mut(docs).ok_or("no pod spec")?;
    put_config_volume(pod.seq_entry("volumes"), &leader_map);
    let containers = pod.seq_entry("containers");
    let second_name = format!("{name}{SUFFIX}");
    let at = match containers
        .iter()
        .position(|c| c.as_map().and_then(|c| c.str("name")) == Some(&second_name))
    {
        Some(at) => {
            containers[at] = Node::Map(second);
            at
        }
        None => {
            containers.insert(collector + 1, Node::Map(second));
            collector + 1
        }
    };
    Ok((at, notes))
}

/// The ConfigMap that holds the leader-only collector's configuration.
#[derive(Clone, Copy)]
pub struct LeaderMap<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The configuration's key (its file name in [`CONFIG_DIR`]).
    pub key: &'a str,
}

/// Splits `text`, the collector configuration of container `container`:
/// the leader half goes to `target` (in place when it exists, else
/// inserted at document `at`). Returns the node half, `None` when there
/// was nothing to split (a run before split it), and what it did.
pub fn split_config(
    docs: &mut Vec<Node>,
    target: &LeaderMap<'_>,
    text: &str,
    metrics_port: u16,
    at: usize,
    container: &str,
) -> Result<(Option<String>, Vec<String>), String> {
    let LeaderMap {
        namespace,
        name: leader_map,
        key,
    } = *target;
    let split = match otel::split(text, metrics_port)? {
        Some(split) => split,
        None if config_map_doc(docs, namespace, leader_map).is_some() => {
            return Ok((None, Vec::new()));
        }
        None => {
            return Err(format!(
                "its collector runs none of the receivers that work once per cluster ({}): nothing to gate; or pass --gate exec to run the whole collector on one node only",
                otel::CLUSTER_RECEIVERS.join(", ")
            ));
        }
    };
    let mut notes = vec![format!(
        "the cluster receivers run in container {container}{SUFFIX}, on the leader only, from ConfigMap {leader_map}; the node work stays in {container} on every pod"
    )];
    notes.extend(split.moved);
    let mut cm = Map::default();
    cm.insert("apiVersion", Node::str("v1"));
    cm.insert("kind", Node::str("ConfigMap"));
    let mut metadata = Map::default();
    metadata.insert("name", Node::str(leader_map));
    metadata.insert("namespace", Node::str(namespace));
    cm.insert("metadata", Node::Map(metadata));
    let mut data = Map::default();
    data.insert(key, Node::str(split.leader));
    cm.insert("data", Node::Map(data));
    match config_map_doc(docs, namespace, leader_map) {
        Some(at) => docs[at] = Node::Map(cm),
        None => docs.insert(at, Node::Map(cm)),
    }
    Ok((Some(split.node), notes))
}

/// The leader-only collector's mount of its configuration.
pub fn config_mount() -> Node {
    let mut mount = Map::default();
    mount.insert("name", Node::str(VOL_CONFIG));
    mount.insert("mountPath", Node::str(CONFIG_DIR));
    mount.insert("readOnly", Node::Bool(true));
    Node::Map(mount)
}

/// Puts the volume of ConfigMap `leader_map` in `volumes` (in place on a
/// second run).
pub fn put_config_volume(volumes: &mut Vec<Node>, leader_map: &str) {
    let mut volume = Map::default();
    volume.insert("name", Node::str(VOL_CONFIG));
    let mut cm = Map::default();
    cm.insert("name", Node::str(leader_map));
    volume.insert("configMap", Node::Map(cm));
    match volumes
        .iter()
        .position(|v| v.as_map().and_then(|v| v.str("name")) == Some(VOL_CONFIG))
    {
        Some(at) => volumes[at] = Node::Map(volume),
        None => volumes.push(Node::Map(volume)),
    }
}
