//! `inject --helm-values FILE…`: what `inject` changed in a rendering of
//! the OpenTelemetry Collector chart, said as a values file to pass after
//! the user's own (`helm upgrade REL CHART -f FILE… -f leader-gate.yaml`),
//! for those who keep a chart's values rather than its rendering. The
//! post-renderer (`--post-renderer leader-gate --post-renderer-args
//! inject`) needs no values and works with any chart; this is for the one
//! chart whose keys `inject` knows (open-telemetry/opentelemetry-helm-charts,
//! `charts/opentelemetry-collector`, `templates/_pod.tpl` and
//! `_config.tpl`):
//!
//! - `initContainers` and `extraContainers` (the pod's containers after the
//!   chart's own first one): whole lists, as the chart has none of its own;
//! - `extraVolumes`, `extraVolumeMounts` (the collector's), `extraEnvs`,
//!   `extraManifests` (leader-gate's objects): the user's, then the ones
//!   inject added; Helm replaces lists, so a values file that gave only
//!   ours would drop theirs;
//! - `lifecycleHooks`, `terminationGracePeriodSeconds`, `podAnnotations`;
//! - the collector's configuration as inject left it, in `alternateConfig`,
//!   with the presets that add cluster receivers (`clusterMetrics`,
//!   `kubernetesObjects`, `kubernetesEvents`) off: they would add them back
//!   to any configuration. Their ClusterRole rules, which the leader-only
//!   collector still needs, then come from `clusterRole.rules` (a rule a
//!   preset that stays on also grants is listed twice, which RBAC allows).
//!
//! Anything else inject changed (a collector run whole under `exec`, its
//! command and probes) has no key in the chart, and is refused naming the
//! post-renderer. The values name the objects as rendered: render with the
//! release name and namespace you install with.

use super::yaml::{Map, Node};

/// The label every object of the chart carries.
const CHART_LABEL: &str = "helm.sh/chart";
const CHART: &str = "opentelemetry-collector-";
/// The key of the chart's ConfigMap that holds the collector's config.
const CONFIG_KEY: &str = "relay";
/// The volume through which the chart mounts that ConfigMap.
const CONFIG_VOLUME: &str = "opentelemetry-collector-configmap";
/// The chart's presets that put a cluster receiver into the config.
const CLUSTER_PRESETS: [&str; 3] = ["clusterMetrics", "kubernetesObjects", "kubernetesEvents"];

/// Helm's merge of values files: maps merge key by key, a later file's
/// value replaces anything else, and a null deletes the key.
pub fn merge(base: &mut Map, over: &Map) {
    for (key, value) in &over.0 {
        match (base.get_mut(key), value) {
            (_, Node::Null) => {
                base.remove(key);
            }
            (Some(Node::Map(b)), Node::Map(o)) => merge(b, o),
            _ => base.insert(key, value.clone()),
        }
    }
}

/// What identifies an object of a stream: kind, namespace, name.
fn identity(doc: &Node) -> Option<(&str, &str, &str)> {
    let m = doc.as_map()?;
    Some((
        m.str("kind")?,
        m.at_str(&["metadata", "namespace"]).unwrap_or(""),
        m.at_str(&["metadata", "name"])?,
    ))
}

fn find<'a>(docs: &'a [Node], id: (&str, &str, &str)) -> Option<&'a Map> {
    docs.iter()
        .find(|d| identity(d) == Some(id))
        .and_then(Node::as_map)
}

/// The user's list at `key`, then the items of `gated` that `rendered`
/// lacks (by `field`); `None` when there are none.
fn extended(
    values: &Map,
    key: &str,
    rendered: &[Node],
    gated: &[Node],
    field: &str,
) -> Option<Node> {
    let had = |item: &Node| {
        let id = item.as_map().and_then(|m| m.get(field));
        rendered
            .iter()
            .any(|r| r.as_map().and_then(|m| m.get(field)) == id)
    };
    let added: Vec<Node> = gated.iter().filter(|g| !had(g)).cloned().collect();
    if added.is_empty() {
        return None;
    }
    let mut list = values.seq(key).to_vec();
    list.extend(added);
    Some(Node::Seq(list))
}

/// A map without the keys that `inject` owns in a pod's collector, to tell
/// whether anything else changed.
fn without(map: &Map, keys: &[&str]) -> Map {
    Map(map
        .0
        .iter()
        .filter(|(k, _)| !keys.contains(&k.as_str()))
        .cloned()
        .collect())
}

const POST_RENDERER: &str = "use inject as Helm's post-renderer instead (--post-renderer leader-gate --post-renderer-args inject)";

/// The values that make the chart render `gated` where it rendered
/// `rendered` with the user's `values`.
pub fn values(rendered: &[Node], gated: &[Node], values: &Map) -> Result<Node, String> {
    let mut out = Map::default();
    let mut gated_workloads = 0;
    for doc in gated {
        let Some(id) = identity(doc) else { continue };
        let new = doc.as_map().expect("identity has a map");
        let Some(old) = find(rendered, id) else {
            continue;
        };
        if old == new || !matches!(id.0, "DaemonSet" | "Deployment" | "StatefulSet") {
            continue;
        }
        let label = format!("{}/{}", id.0, id.2);
        if !old
            .at_str(&["metadata", "labels", CHART_LABEL])
            .is_some_and(|c| c.starts_with(CHART))
        {
            return Err(format!(
                "{label}: not made by the opentelemetry-collector chart (label {CHART_LABEL}); --helm-values knows only that chart's keys: {POST_RENDERER}"
            ));
        }
        gated_workloads += 1;
        workload_values(&label, old, new, values, &mut out)?;
        config_values(&label, rendered, gated, old, values, &mut out)?;
    }
    if gated_workloads != 1 {
        return Err(format!(
            "--helm-values needs the rendering of one release of the chart, with your own values only (not leader-gate's), and one collector to gate; this input had {gated_workloads} that inject changed"
        ));
    }
    // Objects inject added: leader-gate's Role and RoleBinding, the
    // leader-only collector's ConfigMap.
    let added: Vec<Node> = gated
        .iter()
        .filter(|d| identity(d).is_some_and(|id| find(rendered, id).is_none()))
        .cloned()
        .collect();
    let mut manifests = values.seq("extraManifests").to_vec();
    manifests.extend(added);
    out.insert("extraManifests", Node::Seq(manifests));
    // Any other object inject changed has no key here.
    for doc in gated {
        let Some(id) = identity(doc) else { continue };
        let changed = find(rendered, id).is_some_and(|old| Some(old) != doc.as_map());
        if changed
            && !matches!(
                id.0,
                "DaemonSet" | "Deployment" | "StatefulSet" | "ConfigMap"
            )
        {
            return Err(format!(
                "{}/{}: inject changed it, and the chart has no value for that: {POST_RENDERER}",
                id.0, id.2
            ));
        }
    }
    Ok(Node::Map(out))
}

/// The pod's part: containers, volumes, hook, grace period, annotations.
fn workload_values(
    label: &str,
    old: &Map,
    new: &Map,
    values: &Map,
    out: &mut Map,
) -> Result<(), String> {
    let pod_path = ["spec", "template", "spec"];
    let (Some(old_pod), Some(new_pod)) = (old.at(&pod_path), new.at(&pod_path)) else {
        return Err(format!("{label}: no pod template"));
    };
    let refuse = |what: &str| {
        Err(format!(
            "{label}: inject changed {what}, which the chart's values cannot say: {POST_RENDERER}"
        ))
    };
    let (old_c, new_c) = (old_pod.seq("containers"), new_pod.seq("containers"));
    let (Some(old_collector), Some(new_collector)) = (
        old_c.first().and_then(Node::as_map),
        new_c.first().and_then(Node::as_map),
    ) else {
        return refuse("the containers");
    };
    // The collector keeps its command, args and probes: inject only adds
    // mounts, environment and the preStop hook to it.
    let owned = ["volumeMounts", "env", "lifecycle"];
    if without(old_collector, &owned) != without(new_collector, &owned)
        || old_collector.get("name") != new_collector.get("name")
    {
        return refuse(&format!(
            "the collector's own container ({}: run whole under exec, its command or probes)",
            new_collector.str("name").unwrap_or("?")
        ));
    }
    let lists = [
        (
            "extraVolumeMounts",
            old_collector,
            new_collector,
            "volumeMounts",
            "mountPath",
        ),
        ("extraEnvs", old_collector, new_collector, "env", "name"),
        ("extraVolumes", old_pod, new_pod, "volumes", "name"),
    ];
    for (key, old, new, field, by) in lists {
        if let Some(list) = extended(values, key, old.seq(field), new.seq(field), by) {
            out.insert(key, list);
        }
    }
    if let Some(hook) = new_collector.get("lifecycle") {
        out.insert("lifecycleHooks", hook.clone());
    }
    if new_pod.seq("initContainers") != old_pod.seq("initContainers") {
        out.insert(
            "initContainers",
            Node::Seq(new_pod.seq("initContainers").to_vec()),
        );
    }
    if new_c[1..] != old_c[1..] {
        out.insert("extraContainers", Node::Seq(new_c[1..].to_vec()));
    }
    if let Some(grace) = new_pod.get("terminationGracePeriodSeconds") {
        out.insert("terminationGracePeriodSeconds", grace.clone());
    }
    let pod_owned = [
        "containers",
        "initContainers",
        "volumes",
        "terminationGracePeriodSeconds",
    ];
    if without(old_pod, &pod_owned) != without(new_pod, &pod_owned) {
        return refuse("the pod (a ServiceAccount, hostNetwork or another pod field)");
    }
    let annotations = ["spec", "template", "metadata", "annotations"];
    if let Some(new_a) = new.at(&annotations) {
        let old_a = old.at(&annotations);
        let added = Map(new_a
            .0
            .iter()
            .filter(|(k, v)| old_a.and_then(|a| a.get(k)) != Some(v))
            .cloned()
            .collect());
        if !added.0.is_empty() {
            out.map_entry("podAnnotations").0.extend(added.0);
        }
    }
    Ok(())
}

/// The collector's configuration as inject left it, and the presets and
/// RBAC that go with it.
fn config_values(
    label: &str,
    rendered: &[Node],
    gated: &[Node],
    old: &Map,
    values: &Map,
    out: &mut Map,
) -> Result<(), String> {
    let namespace = old.at_str(&["metadata", "namespace"]).unwrap_or("");
    let config_map = old
        .at(&["spec", "template", "spec"])
        .map(|pod| pod.seq("volumes"))
        .unwrap_or_default()
        .iter()
        .filter_map(Node::as_map)
        .find(|v| v.str("name") == Some(CONFIG_VOLUME))
        .and_then(|v| v.at_str(&["configMap", "name"]))
        .ok_or_else(|| format!("{label}: no volume {CONFIG_VOLUME}, which the chart mounts"))?;
    let id = ("ConfigMap", namespace, config_map);
    let text = |docs: &[Node]| {
        find(docs, id)
            .and_then(|m| m.at_str(&["data", CONFIG_KEY]))
            .map(str::to_owned)
    };
    let (Some(before), Some(after)) = (text(rendered), text(gated)) else {
        return Err(format!(
            "{label}: ConfigMap {config_map} has no key {CONFIG_KEY}"
        ));
    };
    if before == after {
        return Ok(());
    }
    let config = super::yaml::read_one(&after)
        .map_err(|e| format!("{label}: ConfigMap {config_map}: {e}"))?;
    out.insert("alternateConfig", config);
    let on: Vec<&str> = CLUSTER_PRESETS
        .into_iter()
        .filter(|p| {
            values
                .at(&["presets", p])
                .and_then(|m| m.get("enabled"))
                .is_some_and(|e| *e == Node::Bool(true))
        })
        .collect();
    if on.is_empty() {
        return Ok(());
    }
    let presets = out.map_entry("presets");
    for preset in &on {
        presets
            .map_entry(preset)
            .insert("enabled", Node::Bool(false));
    }
    // The ClusterRole those presets made, as inject leaves it.
    let cluster_role = rendered
        .iter()
        .filter_map(Node::as_map)
        .find(|d| {
            d.str("kind") == Some("ClusterRole")
                && d.at_str(&["metadata", "labels", CHART_LABEL])
                    .is_some_and(|c| c.starts_with(CHART))
        })
        .ok_or_else(|| format!("{label}: presets {} on, but no ClusterRole", on.join(", ")))?;
    let mut rules = values
        .at(&["clusterRole"])
        .map(|c| c.seq("rules").to_vec())
        .unwrap_or_default();
    for rule in cluster_role.seq("rules") {
        if !rules.contains(rule) {
            rules.push(rule.clone());
        }
    }
    let role = out.map_entry("clusterRole");
    role.insert("create", Node::Bool(true));
    role.insert("rules", Node::Seq(rules));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::yaml::read_one;

    fn map(text: &str) -> Map {
        read_one(text).unwrap().as_map().unwrap().clone()
    }

    /// The chart's example `daemonset-cluster-metrics`, as rendered upstream.
    const RENDERED: &str =
        include_str!("../../tests/fixtures/upstream/otel-helm-daemonset-cluster-metrics.yaml");

    fn gate(text: &str) -> (Vec<Node>, Vec<Node>) {
        let rendered = crate::inject::yaml::read_stream(text).unwrap();
        let mut gated = rendered.clone();
        #[derive(clap::Parser)]
        struct Inject {
            #[command(flatten)]
            args: crate::inject::InjectArgs,
        }
        let Inject { args } = clap::Parser::parse_from(["inject"]);
        crate::inject::inject(&mut gated, &args).unwrap();
        (rendered, gated)
    }

    #[test]
    fn the_charts_daemonset_gets_the_leader_only_collector_and_loses_the_cluster_preset() {
        let (rendered, gated) = gate(RENDERED);
        let values = map("presets: {clusterMetrics: {enabled: true}}\n");
        let out = super::values(&rendered, &gated, &values).unwrap();
        let out = out.as_map().unwrap();
        let extra: Vec<&str> = out
            .seq("extraContainers")
            .iter()
            .filter_map(|c| c.at_str_path(&["name"]))
            .collect();
        assert_eq!(extra, ["opentelemetry-collector-leader-only"]);
        let init: Vec<&str> = out
            .seq("initContainers")
            .iter()
            .filter_map(|c| c.at_str_path(&["name"]))
            .collect();
        assert_eq!(init, ["leader-gate-install", "leader-gate"]);
        assert_eq!(
            out.dotted(&["presets", "clusterMetrics", "enabled"]),
            Some(&Node::Bool(false))
        );
        // The cluster receiver is gone from the config the chart will use.
        let config = out.map("alternateConfig").unwrap();
        assert!(
            config
                .at(&["receivers"])
                .unwrap()
                .get("k8s_cluster")
                .is_none()
        );
        // The Role, RoleBinding and leader-only ConfigMap inject added.
        let kinds: Vec<&str> = out
            .seq("extraManifests")
            .iter()
            .filter_map(|m| m.at_str_path(&["kind"]))
            .collect();
        assert!(
            kinds.contains(&"Role")
                && kinds.contains(&"RoleBinding")
                && kinds.contains(&"ConfigMap"),
            "{kinds:?}"
        );
    }

    #[test]
    fn a_workload_the_chart_did_not_make_is_refused_naming_the_post_renderer() {
        let text = RENDERED.replace(
            "helm.sh/chart: opentelemetry-collector-",
            "helm.sh/chart: other-",
        );
        let (rendered, gated) = gate(&text);
        let error = super::values(&rendered, &gated, &Map::default()).unwrap_err();
        assert!(
            error.contains("not made by the opentelemetry-collector chart")
                && error.contains("--post-renderer"),
            "{error}"
        );
    }

    #[test]
    fn a_rendering_already_gated_is_refused_saying_to_render_with_your_own_values() {
        let (_, gated) = gate(RENDERED);
        let error = super::values(&gated, &gated, &Map::default()).unwrap_err();
        assert!(error.contains("your own values only"), "{error}");
    }

    #[test]
    fn values_merge_as_helm_merges_them() {
        let mut base = map("a: {b: 1, c: [1, 2]}\nd: x\ne: 1\n");
        merge(&mut base, &map("a: {c: [3]}\nd: null\ne: {f: 2}\n"));
        assert_eq!(base, map("a: {b: 1, c: [3]}\ne: {f: 2}\n"));
    }

    #[test]
    fn a_list_keeps_the_users_items_before_the_added_ones() {
        let values = map("extraVolumes: [{name: mine}]\n");
        let rendered = read_one("[{name: conf}, {name: mine}]").unwrap();
        let gated = read_one("[{name: conf}, {name: mine}, {name: ours}]").unwrap();
        let got = extended(
            &values,
            "extraVolumes",
            rendered.as_seq().unwrap(),
            gated.as_seq().unwrap(),
            "name",
        );
        assert_eq!(got, Some(read_one("[{name: mine}, {name: ours}]").unwrap()));
        // Nothing added: the user's list is left to the user's file.
        let same = extended(
            &values,
            "extraVolumes",
            rendered.as_seq().unwrap(),
            rendered.as_seq().unwrap(),
            "name",
        );
        assert_eq!(same, None);
    }
}
