//! Where a stream's workloads keep their pods: the pod template of a
//! DaemonSet, Deployment or StatefulSet, and the pod templates of the
//! operators' resources people gate (ECK's `Beat` and `Agent`,
//! prometheus-operator's `Prometheus`, the OpenTelemetry Operator's
//! `OpenTelemetryCollector`), and which of a pod's containers is the collector.

use super::yaml::{Map, Node};

/// A gateable workload of the stream.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Its document's place in the stream.
    pub doc: usize,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// The path from the document to its pod spec.
    pub pod_path: &'static [&'static str],
    /// A PrometheusAgent with `spec.mode: DaemonSet`, an
    /// OpenTelemetryCollector with `spec.mode: daemonset`.
    pub per_node_mode: bool,
}

impl Workload {
    /// `KIND/NAME`, as every message names it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    pub fn pod_spec<'a>(&self, docs: &'a [Node]) -> Option<&'a Map> {
        docs[self.doc].at(self.pod_path)
    }

    pub fn pod_spec_mut<'a>(&self, docs: &'a mut [Node]) -> Option<&'a mut Map> {
        docs[self.doc].at_mut(self.pod_path)
    }

    /// The pod template's metadata (its labels and annotations), made if missing.
    pub fn pod_metadata_mut<'a>(&self, docs: &'a mut [Node]) -> Option<&'a mut Map> {
        if self.otel_operator() {
            // Its pod annotations are `spec.podAnnotations` (super::otel_operator).
            return None;
        }
        if self.operator_merges_containers() {
            return Some(docs[self.doc].at_mut(&["spec"])?.map_entry("podMetadata"));
        }
        let template = &self.pod_path[..self.pod_path.len() - 1];
        Some(docs[self.doc].at_mut(template)?.map_entry("metadata"))
    }

    /// prometheus-operator's resources: what `inject` writes in
    /// `spec.containers` is merged into the container the operator makes,
    /// whose command, args and probes `inject` does not see.
    pub fn operator_merges_containers(&self) -> bool {
        self.pod_path == ["spec"] && !self.otel_operator()
    }

    /// The OpenTelemetry Operator's `OpenTelemetryCollector`: its `spec`
    /// holds the pod's init containers, volumes and grace period, and its
    /// containers beside the operator's own as `additionalContainers`
    /// ([`super::otel_operator`]).
    pub fn otel_operator(&self) -> bool {
        self.kind == OTEL_KIND
    }

    /// This workload in `docs` as they are now (documents added before it
    /// move it).
    pub fn refind(&self, docs: &[Node]) -> Option<Workload> {
        find(docs).into_iter().find(|w| {
            (&w.kind, &w.name, &w.namespace, w.pod_path)
                == (&self.kind, &self.name, &self.namespace, self.pod_path)
        })
    }

    /// The pod label that names its revision, for `--revision`: a
    /// Deployment's ReplicaSets label their pods `pod-template-hash`;
    /// DaemonSets and StatefulSets (also as operators make them)
    /// `controller-revision-hash`. (An OpenTelemetry Operator collector in
    /// `statefulset` mode gets the Deployment's label, which its pods lack:
    /// no revision, the successor chosen as without one.)
    pub fn revision_label(&self) -> &'static str {
        let deployment = self.kind == "Deployment"
            || self.pod_path.contains(&"deployment")
            || (self.otel_operator() && !self.per_node());
        if deployment {
            "pod-template-hash"
        } else {
            "controller-revision-hash"
        }
    }

    /// DaemonSets run one pod per node: their collectors do node work too.
    pub fn per_node(&self) -> bool {
        self.kind == "DaemonSet" || self.pod_path.contains(&"daemonSet") || self.per_node_mode
    }
}

/// Every workload of the stream whose pod spec is where its kind keeps it.
pub fn find(docs: &[Node]) -> Vec<Workload> {
    let mut found = Vec::new();
    for (doc, node) in docs.iter().enumerate() {
        let Some(map) = node.as_map() else { continue };
        let (Some(kind), Some(name)) = (map.str("kind"), map.at_str(&["metadata", "name"])) else {
            continue;
        };
        let namespace = map
            .at_str(&["metadata", "namespace"])
            .unwrap_or("default")
            .to_owned();
        let paths: &[&'static [&'static str]] = match kind {
            "DaemonSet" | "Deployment" | "StatefulSet" => &[&["spec", "template", "spec"]],
            "Beat" | "Agent" => &[
                &["spec", "daemonSet", "podTemplate", "spec"],
                &["spec", "deployment", "podTemplate", "spec"],
            ],
            // prometheus-operator merges `spec.containers` into the pods it
            // makes, by name (a strategic-merge patch), and takes
            // `initContainers`, `volumes` and `serviceAccountName` as a pod's.
            "Prometheus" | "PrometheusAgent" if api_group(map) == "monitoring.coreos.com" => {
                &[&["spec"]]
            }
            OTEL_KIND if api_group(map) == "opentelemetry.io" => &[&["spec"]],
            _ => &[],
        };
        let mode = map.at_str(&["spec", "mode"]);
        for &pod_path in paths {
            if node.at(pod_path).is_some() {
                found.push(Workload {
                    doc,
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    namespace: namespace.clone(),
                    pod_path,
                    per_node_mode: mode == Some("DaemonSet")
                        || (kind == OTEL_KIND && mode == Some("daemonset")),
                });
            }
        }
    }
    found
}

/// The API group of an object's `apiVersion` (`""` for the core group).
fn api_group(object: &Map) -> &str {
    object
        .str("apiVersion")
        .and_then(|v| v.rsplit_once('/'))
        .map_or("", |(group, _)| group)
}

/// An image's repository name, without registry, path, tag or digest:
/// `docker.elastic.co/beats/metricbeat:8.1.1` is `metricbeat`.
pub fn repository(image: &str) -> &str {
    let repo = image.rsplit('/').next().unwrap_or(image);
    repo.split([':', '@']).next().unwrap_or(repo)
}

/// The ConfigMap `name` of `namespace` in `docs` (an unset namespace is
/// `default`), by its place.
pub fn config_map_doc(docs: &[Node], namespace: &str, name: &str) -> Option<usize> {
    docs.iter().position(|d| {
        d.as_map().is_some_and(|m| {
            m.str("kind") == Some("ConfigMap")
                && m.at_str(&["metadata", "name"]) == Some(name)
                && m.at_str(&["metadata", "namespace"]).unwrap_or("default") == namespace
        })
    })
}

/// Another workload of the stream, in `workload`'s namespace, that mounts
/// the ConfigMap at `doc`: a conversion of its configuration for one
/// would change the other's.
pub fn sharing(docs: &[Node], workload: &Workload, doc: usize) -> Option<String> {
    let name = docs[doc].at_str_path(&["metadata", "name"])?;
    find(docs)
        .into_iter()
        .filter(|w| {
            (&w.kind, &w.name) != (&workload.kind, &workload.name)
                && w.namespace == workload.namespace
        })
        .find(|w| {
            w.pod_spec(docs).is_some_and(|pod| {
                pod.seq("volumes")
                    .iter()
                    .filter_map(Node::as_map)
                    .any(|v| v.at_str(&["configMap", "name"]) == Some(name))
            })
        })
        .map(|w| w.label())
}

/// A leader-only ConfigMap `name` in `namespace` holding `text` at `key`,
/// with the labels of the object at `source` (the configuration it was
/// taken from).
pub fn leader_config_map(
    docs: &[Node],
    source: usize,
    name: &str,
    namespace: &str,
    key: &str,
    text: String,
) -> Node {
    let labels = docs[source]
        .at(&["metadata"])
        .and_then(|m| m.get("labels"))
        .cloned();
    let mut metadata = Map::default();
    metadata.insert("name", Node::str(name));
    metadata.insert("namespace", Node::str(namespace));
    if let Some(labels) = labels {
        metadata.insert("labels", labels);
    }
    let mut data = Map::default();
    data.insert(key, Node::str(text));
    let mut cm = Map::default();
    cm.insert("apiVersion", Node::str("v1"));
    cm.insert("kind", Node::str("ConfigMap"));
    cm.insert("metadata", Node::Map(metadata));
    cm.insert("data", Node::Map(data));
    Node::Map(cm)
}

/// The `configMap` of the volume a container's `mount` names, in `pod`.
pub fn mounted_config_map<'a>(pod: &'a Map, mount: &Map) -> Option<&'a Map> {
    pod.seq("volumes")
        .iter()
        .filter_map(Node::as_map)
        .find(|v| v.str("name") == mount.str("name"))?
        .map("configMap")
}

/// Puts a leader-only ConfigMap in the stream: in place of the one an
/// earlier run wrote (at `existing`), else before the document at `before`
/// (the configuration it came from), so that, applied in order, it exists
/// when the pods start.
pub fn put_leader_config_map(
    docs: &mut Vec<Node>,
    existing: Option<usize>,
    before: usize,
    cm: Node,
) {
    match existing {
        Some(at) => docs[at] = cm,
        None => docs.insert(before, cm),
    }
}

/// The key a ConfigMap volume (`configMap` of a pod's volume) holds at
/// `inside`, a path in the volume: the key itself, or the one `items` puts
/// there.
pub fn config_map_key(volume: &Map, inside: &str) -> Option<String> {
    match volume.get("items") {
        Some(Node::Seq(items)) => items
            .iter()
            .filter_map(Node::as_map)
            .find(|i| i.str("path") == Some(inside))?
            .str("key")
            .map(str::to_owned),
        _ => Some(inside.to_owned()),
    }
}

/// The name of the leader-only copy of a collector container, after the
/// collector's ([`super::second`]).
pub const SECOND_SUFFIX: &str = "-leader-only";

/// The OpenTelemetry Operator's resource, and the name of the collector
/// container it makes for one (its `naming.Container()`).
pub const OTEL_KIND: &str = "OpenTelemetryCollector";
pub const OTEL_CONTAINER: &str = "otc-container";

/// The collectors `inject` knows by their image, with what it needs of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collector {
    Metricbeat,
    ElasticAgent,
    OtelCollector,
    Prometheus,
    /// Named by `--container`, image unknown to `inject`.
    Other,
}

impl Collector {
    /// Which collector an image is, by the name of its repository.
    pub fn of_image(image: &str) -> Option<Collector> {
        let repo = repository(image);
        match repo {
            "metricbeat" => Some(Collector::Metricbeat),
            "elastic-agent" | "elastic-agent-complete" => Some(Collector::ElasticAgent),
            r if r.starts_with("opentelemetry-collector") || r.starts_with("otelcol") => {
                Some(Collector::OtelCollector)
            }
            "prometheus" => Some(Collector::Prometheus),
            _ => None,
        }
    }

    /// The image's ENTRYPOINT, which a container without `command` runs,
    /// for the images `inject` knows; `exec` must be told it.
    pub fn entrypoint(image: &str) -> Option<Vec<&'static str>> {
        let repo = repository(image);
        Some(match repo {
            "prometheus" => vec!["/bin/prometheus"],
            "opentelemetry-collector-contrib" | "otelcol-contrib" => vec!["/otelcol-contrib"],
            "opentelemetry-collector-k8s" | "otelcol-k8s" => vec!["/otelcol-k8s"],
            "opentelemetry-collector" | "otelcol" => vec!["/otelcol"],
            "metricbeat" => vec![
                "/usr/bin/tini",
                "-s",
                "--",
                "/usr/local/bin/docker-entrypoint",
            ],
            _ => return None,
        })
    }
}

/// The collector container of a workload, by name, and which collector it
/// is: the one `--container` names, else the one an operator's resource
/// says (ECK's `Beat` runs container `spec.type`, its `Agent` container
/// `agent`, their images chosen by the operator), else the one container
/// whose image `inject` knows.
pub fn collector(
    docs: &[Node],
    workload: &Workload,
    named: Option<&str>,
) -> Result<(String, Collector), String> {
    let pod = workload.pod_spec(docs).ok_or("no pod spec")?;
    let containers = pod.seq("containers");
    let image_of = |name: &str| {
        containers
            .iter()
            .filter_map(Node::as_map)
            .find(|c| c.str("name") == Some(name))
            .and_then(|c| c.str("image"))
            .and_then(Collector::of_image)
    };
    let operator = match workload.kind.as_str() {
        "Beat" => docs[workload.doc]
            .at(&["spec"])
            .and_then(|s| s.str("type"))
            .map(|t| {
                let kind = if t == "metricbeat" {
                    Collector::Metricbeat
                } else {
                    Collector::Other
                };
                (t.to_owned(), kind)
            }),
        "Agent" => Some(("agent".to_owned(), Collector::ElasticAgent)),
        OTEL_KIND => {
            let mode = docs[workload.doc].at(&["spec"]).and_then(|s| s.str("mode"));
            if mode == Some("sidecar") {
                return Err(SIDECAR_MODE.to_owned());
            }
            Some((OTEL_CONTAINER.to_owned(), Collector::OtelCollector))
        }
        _ if workload.operator_merges_containers() => {
            Some(("prometheus".to_owned(), Collector::Prometheus))
        }
        _ => None,
    };
    if let Some(named) = named {
        if let Some((name, kind)) = operator.filter(|(name, _)| name == named) {
            return Ok((name, kind));
        }
        if !containers
            .iter()
            .any(|c| c.as_map().and_then(|c| c.str("name")) == Some(named))
        {
            return Err(format!("no container named {named}"));
        }
        return Ok((
            named.to_owned(),
            image_of(named).unwrap_or(Collector::Other),
        ));
    }
    if let Some(operator) = operator {
        return Ok(operator);
    }
    let known: Vec<(String, Collector)> = containers
        .iter()
        .filter_map(|c| {
            let c = c.as_map()?;
            let name = c.str("name")?;
            // A leader-only copy an earlier run added is not a collector of its own.
            if name.ends_with(SECOND_SUFFIX) {
                return None;
            }
            Some((name.to_owned(), Collector::of_image(c.str("image")?)?))
        })
        .collect();
    match known.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err("no container runs a collector inject knows (Metricbeat, Elastic Agent, OpenTelemetry Collector, Prometheus): name it with --container".to_owned()),
        _ => Err("several collector containers: name one with --container".to_owned()),
    }
}

/// Why an OpenTelemetryCollector in `mode: sidecar` is not gated.
pub const SIDECAR_MODE: &str = "spec.mode sidecar: the operator injects this collector into each application pod that asks for it, so it does each pod's own work and nothing once per cluster; there is nothing to elect (the operator also refuses additionalContainers in that mode). Gate a collector in mode daemonset, deployment or statefulset";

/// The index of container `name` in `pod`, added as `{name: NAME}` when an
/// operator's pod template leaves it out (the operator merges by name).
pub fn container_index(pod: &mut Map, name: &str) -> usize {
    let containers = pod.seq_entry("containers");
    match containers
        .iter()
        .position(|c| c.as_map().and_then(|c| c.str("name")) == Some(name))
    {
        Some(at) => at,
        None => {
            let mut c = Map::default();
            c.insert("name", Node::str(name));
            containers.push(Node::Map(c));
            containers.len() - 1
        }
    }
}
