//! Metricbeat's `unique: true` autodiscover, turned into what the file gate
//! places: the provider's templates become a leader-only module file (every
//! module it ran once per cluster: `state_*`, `event`, `apiserver`), kept in
//! a ConfigMap of its own; the modules path becomes a glob over the image's
//! modules directory and the file gate's, and live reloading goes on.

use std::time::Duration;

use super::plan::FilePlacement;
use super::pod::SOURCE_DIR;
use super::workload::Workload;
use super::yaml::{Map, Node, read_one, write_one};
use crate::duration::{HumanDuration, parse_duration};

/// The leader-only module file's name, in its ConfigMap and where it is placed.
pub const FILE: &str = "leader-only.yml";
/// Where `${path.config}` points in Elastic's images.
const PATH_CONFIG: &str = "/usr/share/metricbeat";
/// Metricbeat's reload period when the configuration gives none.
const DEFAULT_RELOAD: Duration = Duration::from_secs(10);

/// What the conversion found and did.
pub struct Converted {
    pub placement: FilePlacement,
    pub reload_period: Duration,
    pub notes: Vec<String>,
}

/// The leader-only ConfigMap's name for a workload.
pub fn config_map_name(workload: &Workload) -> String {
    format!("{}-leader-only", workload.name)
}

/// Converts the `unique: true` configuration of the Metricbeat in
/// `workload` (container `container`), in the ConfigMaps of `docs`; on a
/// second run (no such provider left) finds the leader-only ConfigMap an
/// earlier run wrote.
pub fn convert(
    docs: &mut Vec<Node>,
    workload: &Workload,
    container: &Map,
) -> Result<Converted, String> {
    let leader_map = config_map_name(workload);
    let mut found = None;
    for (doc, key) in mounted_config_maps(docs, workload, container) {
        let Some(text) = docs[doc].at(&["data"]).and_then(|d| d.str(&key)) else {
            continue;
        };
        let Ok(Node::Map(config)) = read_one(text) else {
            continue;
        };
        if config.get("metricbeat.autodiscover").is_some()
            || config.get("metricbeat.config.modules").is_some()
        {
            found = Some((doc, key, config));
            break;
        }
    }
    let Some((doc, key, mut config)) = found else {
        return Err("found no metricbeat.yml in the ConfigMaps its container mounts".to_owned());
    };
    let mut notes = Vec::new();
    let modules = take_unique_modules(&mut config)?;
    let existing = docs
        .iter()
        .position(|d| is_config_map(d, &leader_map, &workload.namespace));
    match (modules.is_empty(), existing) {
        (true, None) => {
            return Err("its Metricbeat has no `unique: true` autodiscover provider (the modules it runs once per cluster) and no leader-only ConfigMap: name what runs once per cluster by hand, or pass --gate exec to run the whole Metricbeat on one node only".to_owned());
        }
        (true, Some(_)) => {}
        (false, _) => {
            let names: Vec<String> = modules
                .iter()
                .filter_map(|m| {
                    let m = m.as_map()?;
                    let sets: Vec<&str> = m
                        .seq("metricsets")
                        .iter()
                        .filter_map(Node::as_str)
                        .collect();
                    Some(format!("{} [{}]", m.str("module")?, sets.join(", ")))
                })
                .collect();
            notes.push(format!(
                "moved the `unique: true` autodiscover provider's modules into ConfigMap {leader_map} ({FILE}), placed only on the leader: {}",
                names.join("; ")
            ));
            let source = docs[doc].as_map().cloned().unwrap_or_default();
            let labels = source
                .map("metadata")
                .and_then(|m| m.get("labels"))
                .cloned();
            let mut metadata = Map::default();
            metadata.insert("name", Node::str(&leader_map));
            metadata.insert("namespace", Node::str(&workload.namespace));
            if let Some(labels) = labels {
                metadata.insert("labels", labels);
            }
            let mut data = Map::default();
            data.insert(FILE, Node::str(write_one(&Node::Seq(modules))));
            let mut cm = Map::default();
            cm.insert("apiVersion", Node::str("v1"));
            cm.insert("kind", Node::str("ConfigMap"));
            cm.insert("metadata", Node::Map(metadata));
            cm.insert("data", Node::Map(data));
            match existing {
                Some(at) => docs[at] = Node::Map(cm),
                None => docs.insert(doc + 1, Node::Map(cm)),
            }
        }
    }
    // The modules directory: a glob over the image's and the gate's.
    let modules_cfg = config_modules(&mut config);
    let path = modules_cfg
        .str("path")
        .unwrap_or("${path.config}/modules.d/*.yml")
        .to_owned();
    let (dir, pattern) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("metricbeat.config.modules path {path:?} has no directory"))?;
    if !pattern.ends_with(".yml") && pattern != "*" {
        return Err(format!(
            "metricbeat.config.modules path {path:?} does not load *.yml files"
        ));
    }
    let (parent, base) = dir
        .rsplit_once('/')
        .ok_or_else(|| format!("metricbeat.config.modules path {path:?}: no parent directory"))?;
    let base = base.trim_start_matches('*');
    let glob = format!("{parent}/*{base}/{pattern}");
    let placed_dir = format!(
        "{}/leader-gate-{base}",
        parent.replace("${path.config}", PATH_CONFIG)
    );
    if placed_dir.contains("${") {
        return Err(format!(
            "metricbeat.config.modules path {path:?} uses a variable inject cannot resolve"
        ));
    }
    if glob != path {
        notes.push(format!("metricbeat.config.modules.path {path} -> {glob} (also loads the leader-only file from {placed_dir})"));
    }
    modules_cfg.insert("path", Node::str(glob));
    if modules_cfg.get("reload.enabled") != Some(&Node::Bool(true)) {
        notes.push(
            "metricbeat.config.modules reload.enabled: true (the leader-only file comes and goes)"
                .to_owned(),
        );
        modules_cfg.insert("reload.enabled", Node::Bool(true));
    }
    let reload_period = match modules_cfg.str("reload.period") {
        Some(text) => parse_duration(text).map_err(|e| format!("reload.period: {e}"))?,
        None => {
            modules_cfg.insert(
                "reload.period",
                Node::str(HumanDuration(DEFAULT_RELOAD).to_string()),
            );
            DEFAULT_RELOAD
        }
    };
    let text = write_one(&Node::Map(config));
    if let Some(data) = docs[doc].at_mut(&["data"]) {
        data.insert(&key, Node::str(text));
    }
    Ok(Converted {
        placement: FilePlacement {
            config_map: leader_map,
            mapping: format!("{SOURCE_DIR}/{FILE}:{placed_dir}/{FILE}"),
            placed_dir,
        },
        reload_period,
        notes,
    })
}

fn is_config_map(doc: &Node, name: &str, namespace: &str) -> bool {
    let Some(m) = doc.as_map() else { return false };
    m.str("kind") == Some("ConfigMap")
        && m.at_str(&["metadata", "name"]) == Some(name)
        && m.at_str(&["metadata", "namespace"]).unwrap_or("default") == namespace
}

/// The ConfigMaps (document, data key) the container mounts, every key when
/// a whole ConfigMap is mounted.
fn mounted_config_maps(
    docs: &[Node],
    workload: &Workload,
    container: &Map,
) -> Vec<(usize, String)> {
    let Some(pod) = workload.pod_spec(docs) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for mount in container
        .seq("volumeMounts")
        .iter()
        .filter_map(Node::as_map)
    {
        let Some(volume) = pod
            .seq("volumes")
            .iter()
            .filter_map(Node::as_map)
            .find(|v| v.str("name") == mount.str("name"))
        else {
            continue;
        };
        let Some(cm) = volume.at_str(&["configMap", "name"]) else {
            continue;
        };
        let Some(doc) = docs
            .iter()
            .position(|d| is_config_map(d, cm, &workload.namespace))
        else {
            continue;
        };
        let keys: Vec<String> = match mount.str("subPath") {
            Some(key) => vec![key.to_owned()],
            None => docs[doc]
                .at(&["data"])
                .map(|d| d.0.iter().map(|(k, _)| k.clone()).collect())
                .unwrap_or_default(),
        };
        out.extend(keys.into_iter().map(|k| (doc, k)));
    }
    out
}

/// Takes the `unique: true` providers out of `config` and returns the module
/// configurations of their templates.
fn take_unique_modules(config: &mut Map) -> Result<Vec<Node>, String> {
    let Some(auto) = config.map_mut("metricbeat.autodiscover") else {
        return Ok(Vec::new());
    };
    let Some(providers) = auto.get_mut("providers").and_then(Node::as_seq_mut) else {
        return Ok(Vec::new());
    };
    let mut modules = Vec::new();
    let mut kept = Vec::new();
    for provider in providers.drain(..) {
        let unique = provider.as_map().and_then(|p| p.get("unique")) == Some(&Node::Bool(true));
        if !unique {
            kept.push(provider);
            continue;
        }
        for template in provider.as_map().map(|p| p.seq("templates")).unwrap_or(&[]) {
            let Some(template) = template.as_map() else {
                continue;
            };
            if template.get("condition").is_some() {
                return Err("its `unique: true` provider has a template with a `condition`, which a module file cannot keep: move that template by hand".to_owned());
            }
            modules.extend(template.seq("config").iter().cloned());
        }
    }
    *providers = kept;
    if providers.is_empty() {
        config.remove("metricbeat.autodiscover");
    }
    Ok(modules)
}

/// `metricbeat.config.modules`, made a mapping when missing.
fn config_modules(config: &mut Map) -> &mut Map {
    config.map_entry("metricbeat.config.modules")
}
