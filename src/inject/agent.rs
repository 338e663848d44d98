//! Elastic Agent, standalone in a DaemonSet, whose cluster-wide inputs its own
//! `kubernetes_leaderelection` provider gates, turned into what the file gate
//! places: every input whose `condition` names the agent's leader moves,
//! without that term, into a leader-only `inputs.d` file kept in a ConfigMap of
//! its own; the provider is disabled, and the reload that picks the file up and
//! drops it is kept on, at a period the timings are derived from.
//!
//! What this relies on, in elastic/elastic-agent at 000546bd (8.19.7, the
//! version of tests/fixtures/upstream's manifest; main at 07adab5b still
//! places, reloads and merges inputs.d the same way: its
//! application.go:171-185, container.go:935-950). `agent/` is
//! internal/pkg/agent/, `docker/` dev-tools/packaging/templates/docker/:
//!
//! - Where the agent reads `inputs.d`: in standalone mode (no `fleet.enabled:
//!   true`, agent/configuration/info.go:8-10) it loads `paths.ExternalInputs()`
//!   beside its configuration file (agent/application/application.go:165-181),
//!   which is `paths.Config()/inputs.d/*.yml`
//!   (agent/application/paths/common.go:54-55, 186-189). The image's entrypoint
//!   runs `elastic-agent container "$@"`
//!   (docker/Dockerfile.elastic-agent.tmpl:318,
//!   docker/docker-entrypoint.elastic-agent.tmpl:14-19), which sets
//!   `paths.Config()` to `$CONFIG_PATH`, else `$STATE_PATH`, else
//!   `/usr/share/elastic-agent/state` (agent/cmd/container.go:60-61, 830-845,
//!   862-864; an empty variable counts as unset, 658-666). `-c FILE` names only
//!   the configuration file, absolute or relative to that directory
//!   (paths/common.go:88-90, 175-184). So the manifest's agent (`-c
//!   /etc/elastic-agent/agent.yml`, neither variable) reads
//!   `/usr/share/elastic-agent/state/inputs.d/*.yml`, inside its hostPath state
//!   volume: the file gate's emptyDir is mounted there, where the manifest's
//!   own commented hints setup mounts one.
//! - That it reloads them: `agent.reload.enabled` defaults to true and
//!   `agent.reload.period` to 10 s (agent/configuration/reload.go:34-40, under
//!   `agent`: settings.go:28, configuration.go:16); enabled, a periodic manager
//!   globs the files again every period (application.go:175-181,
//!   agent/application/periodic.go:30-48), and a file gone since the last tick
//!   is a change (internal/pkg/filewatcher/watcher.go:75-123,
//!   periodic.go:74-118). The new configuration, whose inputs are agent.yml's
//!   plus each `inputs.d` file's `inputs`
//!   (internal/pkg/config/loader.go:37-93), recomputes the component model
//!   (agent/application/coordinator/coordinator.go:1364-1366); a unit no longer
//!   in it is told STOPPED at once (pkg/component/runtime/state.go:183-193,
//!   command.go:174-181), a component with no unit left is stopped
//!   (runtime/manager.go:770-799): the path the agent's own election takes when
//!   `${kubernetes_leaderelection.leader}` turns false. Hence Metricbeat's
//!   timings ([`super::plan::Timings::for_gate`]) with the agent's period.
//!   Disabled, the files are read once, at start-up (application.go:175-177):
//!   the conversion turns it on.
//! - Owners and modes: the agent opens its configuration files without checking
//!   either (internal/pkg/config/config.go:306-312; Beats' `strict.perms` is
//!   not there). The file gate runs as the agent's user ([`super::pod`]), which
//!   need only read the copy. The image runs as `elastic-agent`, uid 1000
//!   (docker/Dockerfile.elastic-agent.tmpl:169-171, 297); the manifest as root
//!   (`runAsUser: 0`).
//! - The provider: enabled unless `providers.kubernetes_leaderelection.enabled:
//!   false`, or unlisted under `agent.providers.initial_default: false`
//!   (internal/pkg/composable/controller.go:100-137, config.go:14-19). 8.19
//!   runs a provider only while the configuration names its variables
//!   (controller.go:313-407); disabling it keeps any version from contending
//!   for its own Lease (`elastic-agent-cluster-leader`,
//!   internal/pkg/composable/providers/kubernetesleaderelection/config.go:25-30).
//! - The file gate's temporary `.leader-only.yml.leader-gate.tmp` never matches
//!   `*.yml`, and the copy appears by rename: the agent never reads half a
//!   file, which would fail its load (loader.go:42-47). What can fail it is the
//!   copy going between the glob and the read of one reload
//!   (periodic.go:65-111): the agent then exits (periodic.go:44-46,
//!   coordinator.go:1237-1243, agent/cmd/run.go:430-433) and is restarted, on
//!   the pod that stopped leading, without the copy.

use std::time::Duration;

use super::metricbeat::{self, Converted};
use super::pod::{VOL_PLACED, file_placement};
use super::workload::{
    Workload, config_map_doc, config_map_key, leader_config_map, mounted_config_map,
    put_leader_config_map, sharing,
};
use super::yaml::{Map, Node, read_one, write_one};
use crate::duration::HumanDuration;
use condition::{PROVIDER, mentions, without_leader};

pub mod condition;

/// The leader-only inputs file's name, in its ConfigMap and where it is placed.
pub const FILE: &str = "leader-only.yml";
/// `paths.Config()` under the image's entrypoint when neither `CONFIG_PATH`
/// nor `STATE_PATH` is set.
pub const DEFAULT_CONFIG_DIR: &str = "/usr/share/elastic-agent/state";
/// The agent's configuration file when `-c` names none.
pub const DEFAULT_CONFIG_FILE: &str = "elastic-agent.yml";
/// The agent's reload period when its configuration gives none.
pub const DEFAULT_RELOAD: Duration = Duration::from_secs(10);

/// `paths.Config()` as the image's entrypoint sets it, from the container's
/// variables (`env` gives a variable's value, `None` when unset).
pub fn config_dir(env: impl Fn(&str) -> Option<String>) -> String {
    ["CONFIG_PATH", "STATE_PATH"]
        .iter()
        .filter_map(|name| env(name))
        .find(|value| !value.is_empty())
        .unwrap_or_else(|| DEFAULT_CONFIG_DIR.to_owned())
}

/// Where the agent reads the `inputs.d` files, for a configuration directory.
pub fn inputs_dir(config_dir: &str) -> String {
    format!("{}/inputs.d", config_dir.trim_end_matches('/'))
}

/// The configuration file the agent's arguments name (`-c FILE`,
/// `--config FILE`, either with `=`), absolute or under `config_dir`.
pub fn config_file(args: &[String], config_dir: &str) -> String {
    let flags = ["-c", "--c", "-config", "--config"];
    let mut named = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if flags.contains(&word.as_str()) {
            named = words.next().cloned();
        } else if let Some((flag, value)) = word.split_once('=')
            && flags.contains(&flag)
        {
            named = Some(value.to_owned());
        }
    }
    let file = named.unwrap_or_else(|| DEFAULT_CONFIG_FILE.to_owned());
    if file.starts_with('/') {
        file
    } else {
        format!("{}/{file}", config_dir.trim_end_matches('/'))
    }
}

/// Whether the configuration leaves the provider off: `enabled: false`
/// under it, or it unlisted while providers are off by default.
pub fn provider_disabled(config: &Map) -> bool {
    match config.dotted(&["providers", PROVIDER, "enabled"]) {
        Some(enabled) => *enabled == Node::Bool(false),
        None => {
            config.dotted(&["providers", PROVIDER]).is_none()
                && config.dotted(&["agent", "providers", "initial_default"])
                    == Some(&Node::Bool(false))
        }
    }
}

/// `agent.reload` of a configuration: whether it is on (the default), and
/// its period when written (else [`DEFAULT_RELOAD`]).
pub fn reload(config: &Map) -> Result<(bool, Option<Duration>), String> {
    let enabled = match config.dotted(&["agent", "reload", "enabled"]) {
        None => true,
        Some(Node::Bool(on)) => *on,
        Some(_) => return Err("agent.reload.enabled is not true or false".to_owned()),
    };
    let period = match config.dotted(&["agent", "reload", "period"]) {
        None => None,
        // Read as Beats read a period (the agent's is the same go-ucfg duration).
        Some(value) => {
            metricbeat::reload_period(&Map(vec![("reload.period".to_owned(), value.clone())]))
                .map_err(|e| format!("agent.{e}"))?
        }
    };
    if enabled && period == Some(Duration::ZERO) {
        // The agent refuses to start on it (configuration/reload.go:25-31).
        return Err("agent.reload.period is 0, which the agent refuses".to_owned());
    }
    Ok((enabled, period))
}

/// Where `node` (under `path`) names the provider: each place as a path.
pub fn references(node: &Node, path: &str, out: &mut Vec<String>) {
    match node {
        Node::Str(text) if mentions(text) => out.push(path.to_owned()),
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                references(item, &format!("{path}[{i}]"), out);
            }
        }
        Node::Map(map) => {
            for (key, value) in &map.0 {
                let path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                references(value, &path, out);
            }
        }
        _ => {}
    }
}

/// Converts the Elastic Agent in `workload` (container `container`): its
/// leader-elected inputs go to the leader-only file; on a second run (none
/// left) finds the leader-only ConfigMap an earlier run wrote.
pub fn convert(
    docs: &mut Vec<Node>,
    workload: &Workload,
    container: &Map,
) -> Result<Converted, String> {
    let mut notes = Vec::new();
    let (placed_dir, doc, key) = locate(docs, workload, container, &mut notes)?;
    let cm_name = docs[doc]
        .at_str_path(&["metadata", "name"])
        .unwrap_or("?")
        .to_owned();
    let text = docs[doc]
        .at(&["data"])
        .and_then(|d| d.str(&key))
        .unwrap_or("");
    let mut config = match read_one(text) {
        Ok(Node::Map(config)) => config,
        Ok(Node::Null) => Map::default(),
        Ok(_) => return Err(format!("{key} of ConfigMap {cm_name} is not a mapping")),
        Err(e) => return Err(format!("{key} of ConfigMap {cm_name} is not YAML: {e}")),
    };
    if config.dotted(&["fleet", "enabled"]) == Some(&Node::Bool(true)) {
        return Err(format!(
            "its Elastic Agent is Fleet-managed (fleet.enabled: true in {key}): it reads no inputs.d; gate it in Fleet"
        ));
    }
    let moved = take_leader_inputs(&mut config, &mut notes)?;
    let mut left = Vec::new();
    references(&Node::Map(config.clone()), "", &mut left);
    if !left.is_empty() {
        return Err(format!(
            "{key} of ConfigMap {cm_name} names {PROVIDER} where inject cannot move it ({}): only an input's own `condition` moves; move the rest into an input of its own, or gate by hand",
            left.join(", ")
        ));
    }
    let leader_map = metricbeat::config_map_name(workload);
    let existing = config_map_doc(docs, &workload.namespace, &leader_map);
    let leader_cm = match (moved.is_empty(), existing) {
        (true, None) => {
            return Err(format!(
                "its Elastic Agent has no input whose condition is ${{{PROVIDER}.leader}} and no leader-only ConfigMap {leader_map}: nothing runs once per cluster; name it by hand, or pass --gate exec to run the whole agent on one node only"
            ));
        }
        (true, Some(_)) => None,
        (false, _) => {
            notes.push(format!(
                "moved the inputs its own leader election ran once per cluster into ConfigMap {leader_map} ({FILE}), placed only on the leader in {placed_dir}, which the agent reloads: {}",
                summary(&moved)
            ));
            let inputs = merged(docs, existing, moved);
            let mut file = Map::default();
            file.insert("inputs", Node::Seq(inputs));
            Some(leader_config_map(
                docs,
                doc,
                &leader_map,
                &workload.namespace,
                FILE,
                write_one(&Node::Map(file)),
            ))
        }
    };
    let reload_period = settle(&mut config, &mut notes)?;
    if let Some(data) = docs[doc].at_mut(&["data"]) {
        data.insert(&key, Node::str(write_one(&Node::Map(config))));
    }
    if let Some(cm) = leader_cm {
        put_leader_config_map(docs, existing, doc, cm);
    }
    Ok(Converted {
        placement: file_placement(leader_map, placed_dir, FILE),
        reload_period,
        notes,
    })
}

/// The agent's own election off and its reload on, in `config`: returns
/// the reload period (written out when the agent's default).
fn settle(config: &mut Map, notes: &mut Vec<String>) -> Result<Duration, String> {
    if !provider_disabled(config) {
        set(
            config,
            &["providers", PROVIDER, "enabled"],
            Node::Bool(false),
        );
        notes.push(format!(
            "providers.{PROVIDER}.enabled: false: leader-gate elects the leader now (the agent's Lease rule may stay, unused)"
        ));
    }
    let (enabled, period) = reload(config)?;
    if !enabled {
        set(config, &["agent", "reload", "enabled"], Node::Bool(true));
        notes.push("agent.reload.enabled: true (the leader-only file comes and goes)".to_owned());
    }
    Ok(match period {
        Some(period) => period,
        None => {
            let text = HumanDuration(DEFAULT_RELOAD).to_string();
            set(config, &["agent", "reload", "period"], Node::str(&text));
            notes.push(format!(
                "agent.reload.period: {text}, the agent's default, written out: the timings follow it"
            ));
            DEFAULT_RELOAD
        }
    })
}

/// Where the agent of `workload` reads inputs.d (the file gate's
/// directory), and the ConfigMap document and key of its configuration
/// file; an error for an agent whose places inject cannot know.
fn locate(
    docs: &[Node],
    workload: &Workload,
    container: &Map,
    notes: &mut Vec<String>,
) -> Result<(String, usize, String), String> {
    if workload.kind == "Agent" {
        return Err("ECK's Agent: the operator writes the agent's configuration, arguments and paths, which inject does not see; gate a DaemonSet of the standalone agent, or by hand".to_owned());
    }
    // The paths below are the image entrypoint's (`elastic-agent container`).
    if !container.seq("command").is_empty() {
        return Err("its Elastic Agent container sets a command of its own: inject knows where the agent reads inputs.d only under the image's entrypoint (elastic-agent container); remove the command, or gate by hand".to_owned());
    }
    let env = literal_env(container)?;
    if let Some(name) = ["FLEET_ENROLL", "FLEET_SERVER_ENABLE"]
        .into_iter()
        .find(|name| env(name).is_some_and(|v| is_true(&v)))
    {
        return Err(format!(
            "its Elastic Agent enrolls in Fleet ({name}): Fleet gives it its inputs, and a Fleet-managed agent reads no inputs.d; gate it in Fleet, or run it standalone"
        ));
    }
    if !container.seq("envFrom").is_empty() {
        notes.push("its container takes envFrom: were CONFIG_PATH or STATE_PATH set there, the agent would read inputs.d elsewhere and the leader-only inputs would run nowhere; inject took neither as set (--check sees what the stream's ConfigMaps set)".to_owned());
    }
    let placed_dir = inputs_dir(&config_dir(&env));
    let pod = workload.pod_spec(docs).ok_or("no pod spec")?;
    if let Some(mount) = container
        .seq("volumeMounts")
        .iter()
        .filter_map(Node::as_map)
        .find(|m| {
            m.str("mountPath").map(|p| p.trim_end_matches('/')) == Some(placed_dir.as_str())
                && m.str("name") != Some(VOL_PLACED)
        })
    {
        return Err(format!(
            "its Elastic Agent container already mounts volume {} at {placed_dir}, where the agent reads inputs.d (Elastic's hints templates?) and where the file gate would place the leader-only inputs: merge the two by hand",
            mount.str("name").unwrap_or("?")
        ));
    }
    let args: Vec<String> = container
        .seq("args")
        .iter()
        .filter_map(Node::as_str)
        .map(str::to_owned)
        .collect();
    let file = config_file(&args, &config_dir(&env));
    let (doc, key) = config_map_file(docs, workload, pod, container, &file).ok_or_else(|| {
        format!("its Elastic Agent reads {file}, which is in no ConfigMap of this input that its container mounts")
    })?;
    if let Some(other) = sharing(docs, workload, doc) {
        return Err(format!(
            "its Elastic Agent configuration's ConfigMap {} is also mounted by {other}: converting it for one would change the other; give each workload a ConfigMap of its own, or gate both by hand",
            docs[doc].at_str_path(&["metadata", "name"]).unwrap_or("?")
        ));
    }
    Ok((placed_dir, doc, key))
}

/// The container's literal variables by name (the last of a name wins, as
/// the kubelet sets them); an error for the two that place `inputs.d` when
/// their value is not written out.
fn literal_env(container: &Map) -> Result<impl Fn(&str) -> Option<String>, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for var in container.seq("env").iter().filter_map(Node::as_map) {
        let Some(name) = var.str("name") else {
            continue;
        };
        let value = var.str("value");
        let placing = name == "CONFIG_PATH" || name == "STATE_PATH";
        if placing && (var.get("valueFrom").is_some() || value.is_some_and(|v| v.contains("$("))) {
            return Err(format!(
                "its Elastic Agent container takes {name} from elsewhere, and {name} decides where the agent reads inputs.d: write its value out, or gate by hand"
            ));
        }
        vars.retain(|(n, _)| n != name);
        vars.push((name.to_owned(), value.unwrap_or("").to_owned()));
    }
    Ok(move |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
}

/// The agent's reading of a true environment flag (container.go:712-721).
fn is_true(value: &str) -> bool {
    ["1", "true", "yes", "y"].contains(&value.to_lowercase().as_str())
}

/// Takes the inputs whose condition names the leader out of `config`, each
/// without that term.
fn take_leader_inputs(config: &mut Map, notes: &mut Vec<String>) -> Result<Vec<Node>, String> {
    let Some(inputs) = config.dotted_mut(&["inputs"]).and_then(Node::as_seq_mut) else {
        return Ok(Vec::new());
    };
    let mut moved = Vec::new();
    let mut kept = Vec::new();
    for (i, input) in inputs.drain(..).enumerate() {
        let Some(condition) = input
            .as_map()
            .and_then(|m| m.str("condition"))
            .filter(|c| mentions(c))
        else {
            kept.push(input);
            continue;
        };
        let id = input.as_map().and_then(|m| m.str("id")).unwrap_or("?");
        let rest = without_leader(condition).map_err(|why| {
            format!("inputs[{i}] ({id}): {why}; split it into inputs by hand, or gate by hand")
        })?;
        let mut input = input.as_map().cloned().unwrap_or_default();
        let mut elsewhere = Vec::new();
        for (key, value) in input.0.iter().filter(|(k, _)| k != "condition") {
            references(value, &format!("inputs[{i}].{key}"), &mut elsewhere);
        }
        if !elsewhere.is_empty() {
            return Err(format!(
                "inputs[{i}] ({id}) names {PROVIDER} beside its condition ({}): only the condition's leader term goes; remove the rest by hand",
                elsewhere.join(", ")
            ));
        }
        match rest {
            Some(rest) => {
                notes.push(format!(
                    "input {id} keeps the rest of its condition on the leader: {rest}"
                ));
                input.insert("condition", Node::str(rest));
            }
            None => {
                input.remove("condition");
            }
        }
        moved.push(Node::Map(input));
    }
    *inputs = kept;
    Ok(moved)
}

/// The leader-only file's inputs: an earlier run's (in ConfigMap `existing`)
/// with `moved` in place of those of the same id, or after them.
fn merged(docs: &[Node], existing: Option<usize>, moved: Vec<Node>) -> Vec<Node> {
    let id = |n: &Node| n.as_map().and_then(|m| m.str("id")).map(str::to_owned);
    let mut inputs: Vec<Node> = existing
        .and_then(|at| docs[at].at(&["data"])?.str(FILE))
        .and_then(|text| read_one(text).ok())
        .and_then(|file| file.as_map()?.get("inputs")?.as_seq().map(<[Node]>::to_vec))
        .unwrap_or_default();
    for input in moved {
        match inputs
            .iter_mut()
            .find(|old| id(old).is_some() && id(old) == id(&input))
        {
            Some(slot) => *slot = input,
            None => inputs.push(input),
        }
    }
    inputs
}

/// `id [metricsets or datasets]` for each input, for the note.
fn summary(inputs: &[Node]) -> String {
    inputs
        .iter()
        .filter_map(Node::as_map)
        .map(|input| {
            let streams: Vec<&str> = input
                .seq("streams")
                .iter()
                .filter_map(Node::as_map)
                .flat_map(|s| match s.seq("metricsets") {
                    [] => s
                        .dotted(&["data_stream", "dataset"])
                        .and_then(Node::as_str)
                        .into_iter()
                        .collect::<Vec<_>>(),
                    sets => sets.iter().filter_map(Node::as_str).collect(),
                })
                .collect();
            format!(
                "{} [{}]",
                input.str("id").unwrap_or("(no id)"),
                streams.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The ConfigMap (document) and key that `container` sees at `file`: a
/// `subPath` mount of one key, or a whole ConfigMap mounted at its
/// directory; of mounts that both hold `file`, the deeper one, as the
/// kubelet stacks them.
fn config_map_file(
    docs: &[Node],
    workload: &Workload,
    pod: &Map,
    container: &Map,
    file: &str,
) -> Option<(usize, String)> {
    let (mount, inside) = container
        .seq("volumeMounts")
        .iter()
        .filter_map(Node::as_map)
        .filter_map(|mount| {
            let at = mount.str("mountPath")?.trim_end_matches('/');
            let inside = match mount.str("subPath") {
                Some(sub) if at == file => sub.to_owned(),
                None => file.strip_prefix(at)?.strip_prefix('/')?.to_owned(),
                Some(_) => return None,
            };
            Some((mount, inside, at.len()))
        })
        .max_by_key(|(_, _, depth)| *depth)
        .map(|(mount, inside, _)| (mount, inside))?;
    let cm = mounted_config_map(pod, mount)?;
    let key = config_map_key(cm, &inside)?;
    let doc = config_map_doc(docs, &workload.namespace, cm.str("name")?)?;
    docs[doc].at(&["data"])?.str(&key)?;
    Some((doc, key))
}

/// Sets `path` where it is written (nested or dotted); else in the deepest
/// mapping it names, the rest as one dotted key (the agent reads `a.b: x`
/// as `a: {b: x}`).
fn set(map: &mut Map, path: &[&str], value: Node) {
    if let Some(slot) = map.dotted_mut(path) {
        *slot = value;
        return;
    }
    let depth = (1..path.len())
        .rev()
        .find(|&i| map.dotted(&path[..i]).is_some_and(|n| n.as_map().is_some()))
        .unwrap_or(0);
    let inner = match depth {
        0 => map,
        _ => map
            .dotted_mut(&path[..depth])
            .and_then(Node::as_map_mut)
            .expect("just found a mapping there"),
    };
    inner.insert(&path[depth..].join("."), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_directory_is_config_path_else_state_path_else_the_images() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(config_dir(env(&[])), DEFAULT_CONFIG_DIR);
        assert_eq!(config_dir(env(&[("STATE_PATH", "/s")])), "/s");
        assert_eq!(
            config_dir(env(&[("STATE_PATH", "/s"), ("CONFIG_PATH", "/c")])),
            "/c"
        );
        // Empty is unset to the agent.
        assert_eq!(config_dir(env(&[("CONFIG_PATH", "")])), DEFAULT_CONFIG_DIR);
        assert_eq!(inputs_dir("/c/"), "/c/inputs.d");
    }

    #[test]
    fn the_config_file_is_what_c_names_under_the_config_directory() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            config_file(&args(&["-c", "/etc/elastic-agent/agent.yml", "-e"]), "/d"),
            "/etc/elastic-agent/agent.yml"
        );
        assert_eq!(config_file(&args(&["--config=a.yml"]), "/d"), "/d/a.yml");
        assert_eq!(config_file(&args(&["-e"]), "/d"), "/d/elastic-agent.yml");
    }

    #[test]
    fn settings_go_where_they_are_written_or_into_the_mapping_that_holds_them() {
        let mut config =
            read_one("agent: {monitoring: {enabled: true}}\nproviders.kubernetes: {node: x}\n")
                .unwrap()
                .as_map()
                .cloned()
                .unwrap();
        set(
            &mut config,
            &["agent", "reload", "period"],
            Node::str("10s"),
        );
        set(
            &mut config,
            &["providers", PROVIDER, "enabled"],
            Node::Bool(false),
        );
        assert_eq!(
            write_one(&Node::Map(config.clone())),
            "agent:\n  monitoring:\n    enabled: true\n  reload.period: 10s\nproviders.kubernetes:\n  node: x\nproviders.kubernetes_leaderelection.enabled: false\n"
        );
        assert!(provider_disabled(&config));
        assert_eq!(reload(&config), Ok((true, Some(Duration::from_secs(10)))));
        set(&mut config, &["agent", "reload", "period"], Node::str("5s"));
        assert_eq!(reload(&config), Ok((true, Some(Duration::from_secs(5)))));
    }

    #[test]
    fn a_provider_is_on_unless_disabled_by_name_or_by_default() {
        let config = |text: &str| read_one(text).unwrap().as_map().cloned().unwrap();
        assert!(!provider_disabled(&config("inputs: []")));
        assert!(!provider_disabled(&config(
            "providers.kubernetes_leaderelection: {leader_lease: x}"
        )));
        assert!(provider_disabled(&config(
            "agent.providers.initial_default: false"
        )));
        assert!(!provider_disabled(&config(
            "agent.providers.initial_default: false\nproviders:\n  kubernetes_leaderelection: {enabled: true}"
        )));
    }
}
