//! Where `inject --check` finds pods in a stream: the plain workloads'
//! `spec.template` (a CronJob's `spec.jobTemplate.spec.template`), a Pod's
//! `spec`, and the pod templates of the operators that run collectors (ECK
//! `Beat`/`Agent`, prometheus-operator `Prometheus`/`PrometheusAgent`, the
//! OpenTelemetry Operator's `OpenTelemetryCollector`), each read into one
//! [`Pod`] shape the rules work on. A field of the wrong type is a finding
//! here, never a panic: the rules then see it as absent.

use crate::inject::otel_operator::operator_account;
use crate::inject::workload::{OTEL_CONTAINER, OTEL_KIND};
use crate::inject::yaml::{Map, Node};

/// One container of a pod, as the rules read it.
#[derive(Debug)]
pub struct Container {
    pub name: String,
    /// The container's own mapping (for an OpenTelemetryCollector's
    /// collector, one made of the CR's fields that describe it).
    pub node: Map,
    /// Listed under `initContainers`.
    pub init: bool,
}

impl Container {
    /// An init container with `restartPolicy: Always`: started before the
    /// others, running for the pod's lifetime, stopped after them.
    pub fn native_sidecar(&self) -> bool {
        self.init && self.node.str("restartPolicy") == Some("Always")
    }

    /// The container's volume mount whose directory holds `path` (the
    /// longest `mountPath` that is `path` or a parent of it), with where
    /// `path` lies inside the volume (`subPath` included).
    pub fn mount_of(&self, path: &str) -> Option<Mount<'_>> {
        let mut best: Option<Mount<'_>> = None;
        for mount in self
            .node
            .seq("volumeMounts")
            .iter()
            .filter_map(Node::as_map)
        {
            let (Some(volume), Some(at)) = (mount.str("name"), mount.str("mountPath")) else {
                continue;
            };
            let at = at.trim_end_matches('/');
            let rest = if path == at {
                ""
            } else if let Some(rest) = path.strip_prefix(at).and_then(|r| r.strip_prefix('/')) {
                rest
            } else {
                continue;
            };
            if best
                .as_ref()
                .is_some_and(|b| b.mount_path.len() >= at.len())
            {
                continue;
            }
            let sub = mount.str("subPath").unwrap_or("").trim_matches('/');
            let inside = match (sub, rest) {
                ("", rest) => rest.to_owned(),
                (sub, "") => sub.to_owned(),
                (sub, rest) => format!("{sub}/{rest}"),
            };
            best = Some(Mount {
                volume,
                mount_path: at,
                inside,
                read_only: mount.get("readOnly") == Some(&Node::Bool(true)),
            });
        }
        best
    }

    /// Where this container sees the place `inside` of `volume`, if it mounts it.
    pub fn path_of(&self, volume: &str, inside: &str) -> Option<String> {
        self.node
            .seq("volumeMounts")
            .iter()
            .filter_map(Node::as_map)
            .filter(|m| m.str("name") == Some(volume))
            .find_map(|m| {
                let at = m.str("mountPath")?.trim_end_matches('/');
                let sub = m.str("subPath").unwrap_or("").trim_matches('/');
                let rest = if sub.is_empty() {
                    inside
                } else if inside == sub {
                    ""
                } else {
                    inside.strip_prefix(sub)?.strip_prefix('/')?
                };
                Some(if rest.is_empty() {
                    at.to_owned()
                } else {
                    format!("{at}/{rest}")
                })
            })
    }
}

/// A path's place in a volume, as [`Container::mount_of`] finds it.
#[derive(Debug)]
pub struct Mount<'a> {
    pub volume: &'a str,
    pub mount_path: &'a str,
    /// The path inside the volume, without a leading `/`.
    pub inside: String,
    pub read_only: bool,
}

/// One pod (template) of the stream.
#[derive(Debug)]
pub struct Pod {
    /// `KIND/NAME` of the object that holds it.
    pub name: String,
    /// `metadata.namespace`, `""` when the stream leaves it to kubectl.
    pub namespace: String,
    /// `DaemonSet` or `StatefulSet` when the pods roll out one at a time,
    /// each waiting for the previous to be ready.
    pub rolls_by_readiness: Option<&'static str>,
    /// Init containers first, in order, then the others.
    pub containers: Vec<Container>,
    pub volumes: Vec<Map>,
    pub service_account: String,
    /// `terminationGracePeriodSeconds`, or what the controller puts there.
    pub grace_period: u64,
    pub host_network: bool,
    /// A pod name as the controller would make one, for `metadata.name`.
    pub pod_name: String,
    /// The pod's `securityContext.runAsUser` (an OpenTelemetryCollector's
    /// `podSecurityContext`).
    pub run_as_user: Option<u64>,
    /// An ECK `Beat`'s `spec.type` and inline `spec.config`: ECK writes the
    /// config into the beat.yml of the container named after the type.
    pub beat_config: Option<(String, Node)>,
    /// An OpenTelemetryCollector's `spec.config`: the operator renders it
    /// into the file its own collector container reads.
    pub otel_config: Option<Node>,
}

impl Pod {
    pub fn volume(&self, name: &str) -> Option<&Map> {
        self.volumes.iter().find(|v| v.str("name") == Some(name))
    }

    /// `KIND/NAME container C`.
    pub fn at(&self, container: &Container) -> String {
        format!("{} container {}", self.name, container.name)
    }
}

/// Every pod of the stream, in its order; what cannot be read is a finding.
pub fn pods(docs: &[Node], out: &mut Vec<String>) -> Vec<Pod> {
    let mut pods = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let Some(object) = doc.as_map() else {
            out.push(format!(
                "document {}: not a Kubernetes object (a mapping with kind and metadata)",
                i + 1
            ));
            continue;
        };
        let Some(kind) = object.str("kind") else {
            out.push(format!("document {}: has no kind", i + 1));
            continue;
        };
        let name = object
            .map("metadata")
            .and_then(|m| m.str("name"))
            .unwrap_or("")
            .to_owned();
        let namespace = object
            .map("metadata")
            .and_then(|m| m.str("namespace"))
            .unwrap_or("")
            .to_owned();
        let at = format!("{kind}/{name}");
        let first = pods.len();
        let spec = object.get("spec");
        let group = object
            .str("apiVersion")
            .and_then(|v| v.split_once('/'))
            .map_or("", |(group, _)| group);
        let mut read = |template: Option<&Node>, path: &str, rolls, defaults: Defaults| {
            let Some(spec) = template else {
                out.push(format!("{at}: no {path}"));
                return;
            };
            let Some(spec) = spec.as_map() else {
                out.push(format!("{at}: {path} is not a mapping"));
                return;
            };
            let mut pod = Pod {
                name: at.clone(),
                namespace: namespace.clone(),
                rolls_by_readiness: rolls,
                containers: Vec::new(),
                volumes: Vec::new(),
                service_account: defaults.service_account.unwrap_or("default").to_owned(),
                grace_period: defaults.grace_period,
                host_network: spec.get("hostNetwork") == Some(&Node::Bool(true)),
                pod_name: match rolls {
                    Some("StatefulSet") => format!("{name}-0"),
                    _ if kind == "Pod" => name.clone(),
                    _ => format!("{name}-x7k2p"),
                },
                run_as_user: None,
                beat_config: None,
                otel_config: None,
            };
            read_pod_spec(&mut pod, spec, path, defaults.collector, out);
            pods.push(pod);
        };
        let at_path = |path: &[&str]| -> Option<&Node> {
            let (last, parents) = path.split_last()?;
            doc.at(parents)?.get(last)
        };
        match (group, kind) {
            ("apps", "DaemonSet") => read(
                at_path(&["spec", "template", "spec"]),
                "spec.template.spec",
                Some("DaemonSet"),
                Defaults::plain(),
            ),
            ("apps", "StatefulSet") => read(
                at_path(&["spec", "template", "spec"]),
                "spec.template.spec",
                Some("StatefulSet"),
                Defaults::plain(),
            ),
            ("apps", "Deployment" | "ReplicaSet") | ("batch", "Job") => read(
                at_path(&["spec", "template", "spec"]),
                "spec.template.spec",
                None,
                Defaults::plain(),
            ),
            ("batch", "CronJob") => read(
                at_path(&["spec", "jobTemplate", "spec", "template", "spec"]),
                "spec.jobTemplate.spec.template.spec",
                None,
                Defaults::plain(),
            ),
            ("", "Pod") => read(spec, "spec", None, Defaults::plain()),
            ("beat.k8s.elastic.co", "Beat") | ("agent.k8s.elastic.co", "Agent") => {
                // One of daemonSet, deployment (statefulSet for Agent).
                let eck_sa = doc.at(&["spec"]).and_then(|s| s.str("serviceAccountName"));
                for (key, rolls) in [
                    ("daemonSet", Some("DaemonSet")),
                    ("deployment", None),
                    ("statefulSet", Some("StatefulSet")),
                ] {
                    if doc.at(&["spec", key]).is_some() {
                        read(
                            at_path(&["spec", key, "podTemplate", "spec"]),
                            &format!("spec.{key}.podTemplate.spec"),
                            rolls,
                            Defaults {
                                service_account: eck_sa,
                                ..Defaults::plain()
                            },
                        );
                    }
                }
            }
            ("monitoring.coreos.com", "Prometheus" | "PrometheusAgent") => {
                let daemon =
                    spec.and_then(Node::as_map).and_then(|s| s.str("mode")) == Some("DaemonSet");
                read(
                    spec,
                    "spec",
                    Some(if daemon { "DaemonSet" } else { "StatefulSet" }),
                    // The operator's default grace period for Prometheus.
                    Defaults {
                        grace_period: 600,
                        ..Defaults::plain()
                    },
                )
            }
            ("opentelemetry.io", OTEL_KIND) => {
                let mode = spec
                    .and_then(Node::as_map)
                    .and_then(|s| s.str("mode"))
                    .unwrap_or("deployment");
                let rolls = match mode {
                    "daemonset" => Some("DaemonSet"),
                    "statefulset" => Some("StatefulSet"),
                    // Injected into other pods: nothing to check here.
                    "sidecar" => continue,
                    _ => None,
                };
                let operator_sa = operator_account(&name);
                let sa = spec
                    .and_then(Node::as_map)
                    .and_then(|s| s.str("serviceAccount"))
                    .unwrap_or(&operator_sa)
                    .to_owned();
                read(
                    spec,
                    "spec",
                    rolls,
                    Defaults {
                        service_account: Some(&sa),
                        collector: true,
                        ..Defaults::plain()
                    },
                )
            }
            _ => {}
        }
        if (group, kind) == ("opentelemetry.io", OTEL_KIND) && pods.len() > first {
            misplaced(&at, spec, out);
            let config = spec.and_then(Node::as_map).and_then(|s| s.get("config"));
            for pod in &mut pods[first..] {
                pod.otel_config = config.cloned();
            }
        }
        if kind == "Beat"
            && let (Some(beat), Some(config)) = (
                doc.at(&["spec"]).and_then(|s| s.str("type")),
                doc.at(&["spec"]).and_then(|s| s.get("config")),
            )
        {
            for pod in &mut pods[first..] {
                pod.beat_config = Some((beat.to_owned(), config.clone()));
            }
        }
    }
    pods
}

/// What a controller fills in that the pod template leaves out.
#[derive(Clone, Copy)]
struct Defaults<'a> {
    service_account: Option<&'a str>,
    grace_period: u64,
    /// An OpenTelemetryCollector: its own collector container is made of
    /// the CR's `image`, `env`, `volumeMounts`, `lifecycle`…
    collector: bool,
}

impl Defaults<'_> {
    fn plain() -> Self {
        Defaults {
            service_account: None,
            // Kubernetes' default terminationGracePeriodSeconds.
            grace_period: 30,
            collector: false,
        }
    }
}

fn read_pod_spec(pod: &mut Pod, spec: &Map, path: &str, collector: bool, out: &mut Vec<String>) {
    let at = pod.name.clone();
    let list = |key: &str, out: &mut Vec<String>| -> Vec<Node> {
        match spec.get(key) {
            None | Some(Node::Null) => Vec::new(),
            Some(Node::Seq(items)) => items.clone(),
            Some(_) => {
                out.push(format!("{at}: {path}.{key} is not a list"));
                Vec::new()
            }
        }
    };
    let security = if collector {
        "podSecurityContext"
    } else {
        "securityContext"
    };
    pod.run_as_user = spec
        .map(security)
        .and_then(|s| s.get("runAsUser"))
        .and_then(Node::as_u64);
    // An OpenTelemetryCollector names it `serviceAccount` (its Defaults).
    if let Some(sa) = spec.str("serviceAccountName").filter(|_| !collector) {
        pod.service_account = sa.to_owned();
    }
    match spec.get("terminationGracePeriodSeconds") {
        None | Some(Node::Null) => {}
        Some(value) => match value.as_u64() {
            Some(seconds) => pod.grace_period = seconds,
            None => out.push(format!(
                "{at}: {path}.terminationGracePeriodSeconds is not a whole number of seconds"
            )),
        },
    }
    let main_key = if collector {
        "additionalContainers"
    } else {
        "containers"
    };
    for (key, init) in [("initContainers", true), (main_key, false)] {
        for (i, item) in list(key, out).into_iter().enumerate() {
            match item {
                Node::Map(node) if node.str("name").is_some() => pod.containers.push(Container {
                    name: node.str("name").unwrap_or_default().to_owned(),
                    node,
                    init,
                }),
                _ => out.push(format!(
                    "{at}: {path}.{key}[{i}] is not a container (a mapping with a name)"
                )),
            }
        }
    }
    if collector {
        // The operator's own container, named as it names it.
        let mut node = Map::default();
        node.insert("name", Node::str(OTEL_CONTAINER));
        for key in [
            "image",
            "env",
            "envFrom",
            "volumeMounts",
            "lifecycle",
            "readinessProbe",
        ] {
            if let Some(value) = spec.get(key) {
                node.insert(key, value.clone());
            }
        }
        pod.containers.push(Container {
            name: OTEL_CONTAINER.to_owned(),
            node,
            init: false,
        });
    }
    for (i, item) in list("volumes", out).into_iter().enumerate() {
        match item {
            Node::Map(volume) if volume.str("name").is_some() => pod.volumes.push(volume),
            _ => out.push(format!(
                "{at}: {path}.volumes[{i}] is not a volume (a mapping with a name)"
            )),
        }
    }
}

/// Pod-spec fields an OpenTelemetryCollector does not have, which the API
/// server drops from it (the CRD prunes unknown fields): what is there
/// never reaches the pod.
fn misplaced(at: &str, spec: Option<&Node>, out: &mut Vec<String>) {
    let Some(spec) = spec.and_then(Node::as_map) else {
        return;
    };
    for (field, instead) in [
        (
            "containers",
            "its containers go in spec.additionalContainers, beside the operator's own; init containers and native sidecars in spec.initContainers",
        ),
        (
            "serviceAccountName",
            "name the pod's ServiceAccount in spec.serviceAccount",
        ),
    ] {
        if spec.get(field).is_some() {
            out.push(format!(
                "{at}: spec.{field} is not a field of OpenTelemetryCollector, so the API server drops it: {instead}"
            ));
        }
    }
}
