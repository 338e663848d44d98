//! Metricbeat's `unique: true` autodiscover, turned into what the file gate
//! places: the provider's templates become a leader-only module file (every
//! module it ran once per cluster: `state_*`, `event`, `apiserver`), kept in
//! a ConfigMap of its own; the modules path becomes a glob over the image's
//! modules directory and the file gate's, and live reloading goes on.

use std::time::Duration;

use super::plan::FilePlacement;
use super::pod::file_placement;
use super::workload::{
    Workload, config_map_doc, leader_config_map, mounted_config_map, put_leader_config_map, sharing,
};
use super::yaml::{Map, Node, read_one, write_one};
use crate::duration::{HumanDuration, parse_duration};

/// The leader-only module file's name, in its ConfigMap and where it is placed.
pub const FILE: &str = "leader-only.yml";
/// Where `${path.config}` points in Elastic's images: `path.home`, by
/// default, whatever `-c` names.
pub const PATH_CONFIG: &str = "/usr/share/metricbeat";

/// A modules path with the Beat's own path variables resolved as Elastic's
/// images resolve them by default.
pub fn resolve_paths(path: &str) -> String {
    path.replace("${path.config}", PATH_CONFIG)
        .replace("${path.home}", PATH_CONFIG)
}
/// Metricbeat's reload period when the configuration gives none.
pub const DEFAULT_RELOAD: Duration = Duration::from_secs(10);

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
    let source = find_config(docs, workload, container)?;
    if let Source::ConfigMap { doc, .. } = &source
        && let Some(other) = sharing(docs, workload, *doc)
    {
        return Err(format!(
            "its Metricbeat configuration's ConfigMap {} is also mounted by {other}: converting it for one would change the other; give each workload a ConfigMap of its own, or gate both in one run by hand",
            docs[*doc].at_str_path(&["metadata", "name"]).unwrap_or("?")
        ));
    }
    let mut config = source.load(docs).unwrap_or_default();
    let mut notes = Vec::new();
    let mut leader_cm = None;
    let modules = take_unique_modules(&mut config)?;
    let existing = config_map_doc(docs, &workload.namespace, &leader_map);
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
            leader_cm = Some(leader_config_map(
                docs,
                source.doc(),
                &leader_map,
                &workload.namespace,
                FILE,
                write_one(&Node::Seq(modules)),
            ));
        }
    }
    // The modules directory: a glob over the image's and the gate's.
    let modules_cfg = config_modules(&mut config);
    let path = modules_cfg
        .dotted(&["path"])
        .and_then(Node::as_str)
        .unwrap_or("${path.config}/modules.d/*.yml")
        .to_owned();
    let (dir, pattern) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("metricbeat.config.modules path {path:?} has no directory"))?;
    if !pattern.ends_with(".yml") {
        // `*` would also load the file gate's half-written temporary copy.
        return Err(format!(
            "metricbeat.config.modules path {path:?} does not end in .yml: make it *.yml, so Metricbeat never loads the file gate's temporary copy"
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
    set_dotted(modules_cfg, &["path"], Node::str(glob));
    if modules_cfg.dotted(&["reload", "enabled"]) != Some(&Node::Bool(true)) {
        notes.push(
            "metricbeat.config.modules reload.enabled: true (the leader-only file comes and goes)"
                .to_owned(),
        );
        set_dotted(modules_cfg, &["reload", "enabled"], Node::Bool(true));
    }
    let reload_period = match reload_period(modules_cfg)? {
        Some(period) => period,
        None => {
            set_dotted(
                modules_cfg,
                &["reload", "period"],
                Node::str(HumanDuration(DEFAULT_RELOAD).to_string()),
            );
            DEFAULT_RELOAD
        }
    };
    let proof = status_proof(&mut config, &mut notes);
    source.store(docs, config);
    if let Some(cm) = leader_cm {
        // Before the document holding the configuration (its ConfigMap, or the Beat).
        put_leader_config_map(docs, existing, source.doc(), cm);
    }
    Ok(Converted {
        placement: FilePlacement {
            proof,
            ..file_placement(leader_map, placed_dir, FILE)
        },
        reload_period,
        notes,
    })
}

/// What proves the leader-only modules stopped (`file-gate --status-url`):
/// Metricbeat's own count of its reloaded modules on its HTTP endpoint
/// (`/stats`, `libbeat.config.module.running`) back to what it was before
/// the file was placed. The endpoint is turned on, on 127.0.0.1:5066, when
/// it is off. None with autodiscover left in the same Metricbeat, which sets
/// that count to its own list's size, nor with an endpoint the gate cannot
/// reach on loopback: the release then waits the gate lag.
fn status_proof(config: &mut Map, notes: &mut Vec<String>) -> Option<(String, &'static str)> {
    const WHEN: &str = "libbeat.config.module.running <= before";
    if config.dotted(&["metricbeat", "autodiscover"]).is_some() {
        notes.push("no status proof for the file gate: the autodiscover left in this Metricbeat sets the module count /stats would prove the stop by, so a graceful hand-over waits the gate lag".to_owned());
        return None;
    }
    if config.dotted(&["http", "enabled"]) != Some(&Node::Bool(true)) {
        set_dotted(config, &["http", "enabled"], Node::Bool(true));
        if config.dotted(&["http", "host"]).is_none() {
            set_dotted(config, &["http", "host"], Node::str("127.0.0.1"));
        }
        notes.push("http.enabled: true (the file gate reads Metricbeat's /stats on loopback to prove the leader-only modules stopped, so a graceful hand-over need not wait the gate lag)".to_owned());
    }
    let host = config
        .dotted(&["http", "host"])
        .and_then(Node::as_str)
        .unwrap_or("localhost");
    let port = match config.dotted(&["http", "port"]) {
        None => Some(5066),
        Some(port) => port
            .as_u64()
            .or_else(|| port.as_str().and_then(|p| p.parse().ok())),
    };
    match (host, port) {
        ("localhost" | "127.0.0.1" | "0.0.0.0" | "::" | "[::]", Some(port)) => {
            Some((format!("http://127.0.0.1:{port}/stats"), WHEN))
        }
        _ => {
            notes.push(format!("no status proof for the file gate: Metricbeat's http.host {host} is not on loopback or its port is not a number, so a graceful hand-over waits the gate lag"));
            None
        }
    }
}

/// `reload.period` of Metricbeat's `metricbeat.config.modules` settings: a
/// duration (`10s`) or bare seconds, as Beats reads it; `None` when unset
/// (Metricbeat then reloads every [`DEFAULT_RELOAD`]).
pub fn reload_period(modules: &Map) -> Result<Option<Duration>, String> {
    Ok(Some(match modules.dotted(&["reload", "period"]) {
        None => return Ok(None),
        Some(Node::Str(text)) => {
            parse_duration(text).map_err(|e| format!("reload.period {text}: {e}"))?
        }
        // A bare number is seconds, to Beats as to leader-gate.
        Some(number @ (Node::Int(_) | Node::Uint(_))) => {
            Duration::from_secs(number.as_u64().ok_or("reload.period is negative")?)
        }
        Some(Node::Float(f)) => {
            Duration::try_from_secs_f64(*f).map_err(|e| format!("reload.period {f}: {e}"))?
        }
        Some(_) => return Err("reload.period is not a duration".to_owned()),
    }))
}

/// Where a Metricbeat's configuration is written.
enum Source {
    /// A ConfigMap's key, as text (`metricbeat.yml`).
    ConfigMap { doc: usize, key: String },
    /// ECK's `Beat` `spec.config`, a mapping.
    Inline { doc: usize },
}

impl Source {
    fn doc(&self) -> usize {
        match *self {
            Source::ConfigMap { doc, .. } | Source::Inline { doc } => doc,
        }
    }

    fn load(&self, docs: &[Node]) -> Option<Map> {
        match self {
            Source::ConfigMap { doc, key } => {
                let text = docs[*doc].at(&["data"])?.str(key)?;
                read_one(text).ok()?.as_map().cloned()
            }
            Source::Inline { doc } => docs[*doc].at(&["spec", "config"]).cloned(),
        }
    }

    fn store(&self, docs: &mut [Node], config: Map) {
        match self {
            Source::ConfigMap { doc, key } => {
                if let Some(data) = docs[*doc].at_mut(&["data"]) {
                    data.insert(key, Node::str(write_one(&Node::Map(config))));
                }
            }
            Source::Inline { doc } => {
                if let Some(spec) = docs[*doc].at_mut(&["spec"]) {
                    spec.insert("config", Node::Map(config));
                }
            }
        }
    }
}

/// The Metricbeat configuration of the workload: ECK's inline `spec.config`,
/// else the first ConfigMap key its container mounts that reads as one.
fn find_config(docs: &[Node], workload: &Workload, container: &Map) -> Result<Source, String> {
    if workload.kind == "Beat" {
        return match docs[workload.doc].at(&["spec", "config"]) {
            Some(_) => Ok(Source::Inline { doc: workload.doc }),
            None => Err("its Beat has no inline spec.config (a configRef Secret inject cannot read): move the configuration inline, or gate by hand".to_owned()),
        };
    }
    for (doc, key) in mounted_config_maps(docs, workload, container) {
        let source = Source::ConfigMap { doc, key };
        let Some(config) = source.load(docs) else {
            continue;
        };
        if config.dotted(&["metricbeat", "autodiscover"]).is_some()
            || config
                .dotted(&["metricbeat", "config", "modules"])
                .is_some()
        {
            return Ok(source);
        }
    }
    Err("found no metricbeat.yml in the ConfigMaps its container mounts".to_owned())
}

/// Sets `path` where it is (nested or dotted), else as one dotted key.
fn set_dotted(map: &mut Map, path: &[&str], value: Node) {
    match map.dotted_mut(path) {
        Some(slot) => *slot = value,
        None => map.insert(&path.join("."), value),
    }
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
        let Some(cm) = mounted_config_map(pod, mount).and_then(|cm| cm.str("name")) else {
            continue;
        };
        let Some(doc) = config_map_doc(docs, &workload.namespace, cm) else {
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
    let Some(providers) = config
        .dotted_mut(&["metricbeat", "autodiscover", "providers"])
        .and_then(Node::as_seq_mut)
    else {
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
    let none_left = kept.is_empty();
    *providers = kept;
    if none_left {
        // No provider left: no autodiscover, however it was written.
        if config.remove("metricbeat.autodiscover").is_none()
            && let Some(beat) = config.map_mut("metricbeat")
        {
            beat.remove("autodiscover");
        }
    }
    Ok(modules)
}

/// `metricbeat.config.modules` where it is written, else a new dotted key.
fn config_modules(config: &mut Map) -> &mut Map {
    if config
        .dotted(&["metricbeat", "config", "modules"])
        .is_some_and(|n| n.as_map().is_some())
    {
        return config
            .dotted_mut(&["metricbeat", "config", "modules"])
            .and_then(Node::as_map_mut)
            .expect("just found");
    }
    // Beside a nested `metricbeat:` mapping, nested too.
    if config.map("metricbeat").is_some() {
        return config
            .map_entry("metricbeat")
            .map_entry("config")
            .map_entry("modules");
    }
    config.map_entry("metricbeat.config.modules")
}
