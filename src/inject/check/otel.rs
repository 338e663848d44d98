//! OpenTelemetry Collector containers of a gated pod: the receivers that
//! work once per cluster (`k8s_cluster`, `k8sobjects`, `k8s_events`) run
//! only in a container under `leader-gate exec`, and that one elects no
//! leader of its own (`k8s_leader_elector`), which could pick another pod.

use super::Stream;
use super::workload::{Container, Pod};
use crate::inject::otel;
use crate::inject::workload::OTEL_CONTAINER;
use crate::inject::yaml::{Node, read_one, write_one};

/// The collector configuration a container reads through `--config`, from
/// a ConfigMap of the stream; for the OpenTelemetry Operator's own
/// collector, its resource's `spec.config`.
fn config_of(stream: &Stream<'_>, pod: &Pod, container: &Container) -> Option<String> {
    if container.name == OTEL_CONTAINER
        && let Some(config) = &pod.otel_config
    {
        return Some(write_one(config));
    }
    let args = container.node.seq("args");
    let path = args.iter().enumerate().find_map(|(i, a)| {
        let a = a.as_str()?;
        match a.strip_prefix("--config=") {
            Some(path) => Some(path.to_owned()),
            None if a == "--config" => Some(args.get(i + 1)?.as_str()?.to_owned()),
            None => None,
        }
    })?;
    let mount = container.mount_of(&path)?;
    let volume = pod.volume(mount.volume)?;
    let cm = volume.map("configMap")?;
    let key = cm
        .seq("items")
        .iter()
        .filter_map(Node::as_map)
        .find(|i| i.str("path") == Some(mount.inside.as_str()))
        .and_then(|i| i.str("key"))
        .unwrap_or(mount.inside.as_str())
        .to_owned();
    let data = stream.config_map(&pod.namespace, cm.str("name")?)?;
    data.map("data")?.str(&key).map(str::to_owned)
}

/// `gated`: the names of the containers that run under `leader-gate exec`.
pub fn check(stream: &Stream<'_>, pod: &Pod, gated: &[&str], out: &mut Vec<String>) {
    for container in pod.containers.iter().filter(|c| !c.init) {
        let Some(text) = config_of(stream, pod, container) else {
            continue;
        };
        let at = pod.at(container);
        if gated.contains(&container.name.as_str()) {
            let elects = read_one(&text).ok().is_some_and(|config| {
                config.at(&["receivers"]).is_some_and(|r| {
                    r.0.iter().any(|(_, s)| {
                        s.as_map()
                            .is_some_and(|s| s.get(otel::LEADER_ELECTOR).is_some())
                    })
                })
            });
            if elects {
                out.push(format!(
                    "{at}: a receiver of its configuration keeps `{}`: it elects its own leader, which may be another pod than leader-gate's, and then runs nowhere; remove the setting (`leader-gate inject` does)",
                    otel::LEADER_ELECTOR
                ));
            }
        } else {
            let used = otel::cluster_receivers_in_use(&text);
            if !used.is_empty() {
                out.push(format!(
                    "{at}: runs receivers that work once per cluster ({}) outside `leader-gate exec`, so on every pod: move them to a collector under `leader-gate exec` (`leader-gate inject` does)",
                    used.join(", ")
                ));
            }
        }
    }
}
