//! Elastic Agent behind a file gate (what of the agent's source each rule
//! rests on: [`crate::inject::agent`]): the gate's DST is a `*.yml` in the
//! `inputs.d` the agent reads (`$CONFIG_PATH`, else `$STATE_PATH`, else
//! `/usr/share/elastic-agent/state`, then `/inputs.d`); `agent.reload` is
//! on, its period below the margin and at most the gate lag (the agent may
//! run a removed file's inputs that long after "not leading"); and the
//! agent's own election is gone: no `${kubernetes_leaderelection…}` left in
//! its configuration (the file `-c` names, in a ConfigMap of the stream) or
//! in the gate's file, its provider disabled. A container is taken for an
//! Elastic Agent by its image.

use super::Stream;
use super::line::Env;
use super::metricbeat::glob_match;
use super::workload::{Container, Pod};
use crate::duration::HumanDuration;
use crate::inject::agent::{self, condition::PROVIDER};
use crate::inject::workload::{Collector, config_map_key};
use crate::inject::yaml::{self, Node};
use crate::serve::config::ServeConfig;

/// Checks the Elastic Agent `reader` that sees a file gate's DST at `dst`;
/// `gate` is the file gate, `src` its SRC.
#[allow(clippy::too_many_arguments)]
pub fn check(
    stream: &Stream<'_>,
    pod: &Pod,
    reader: &Container,
    gate: &Container,
    src: &str,
    dst: &str,
    config: &ServeConfig,
    out: &mut Vec<String>,
) {
    let image = reader.node.str("image").unwrap_or("");
    if Collector::of_image(image) != Some(Collector::ElasticAgent) {
        return;
    }
    let at = pod.at(reader);
    let env = Env::of(reader, pod, &|name| stream.config_map(&pod.namespace, name));
    let dir = agent::config_dir(|name| env.value(name));
    let inputs = agent::inputs_dir(&dir);
    // `*.yml` never matches the gate's temporary `.NAME.leader-gate.tmp`.
    if !glob_match(&format!("{inputs}/*.yml"), dst) {
        out.push(format!(
            "{at}: the file gate's DST {dst} is not a *.yml in {inputs}, where this agent reads inputs.d (CONFIG_PATH, else STATE_PATH, else {}, then /inputs.d): the leader's inputs would never run",
            agent::DEFAULT_CONFIG_DIR
        ));
    }
    if let Some((file, text)) = config_map_text(stream, pod, gate, src) {
        leftover(&at, &format!("the file gate's file {file}"), &text, out);
    }
    let args: Vec<String> = reader
        .node
        .seq("args")
        .iter()
        .filter_map(Node::as_str)
        .map(|a| env.expand(a))
        .collect();
    let path = agent::config_file(&args, &dir);
    let Some((file, text)) = config_map_text(stream, pod, reader, &path) else {
        return; // Its configuration is not in the stream.
    };
    let Some(settings) = leftover(&at, &file, &text, out) else {
        return;
    };
    if !agent::provider_disabled(&settings) {
        out.push(format!(
            "{at}: the agent's {PROVIDER} provider is not disabled ({file}): set providers.{PROVIDER}.enabled: false, so it contends for no Lease of its own beside leader-gate's"
        ));
    }
    match agent::reload(&settings) {
        Err(error) => out.push(format!("{at}: {error} ({file})")),
        Ok((false, _)) => out.push(format!(
            "{at}: agent.reload.enabled is false ({file}): the agent reads inputs.d once, at start-up, and would never notice the file gate's copy come and go"
        )),
        Ok((true, period)) => {
            let period = period.unwrap_or(agent::DEFAULT_RELOAD);
            let margin = config.lease_duration - config.renew_deadline;
            let lag = config.shutdown.gate_lag;
            if !(period < margin && period <= lag) {
                out.push(format!(
                    "{at}: agent.reload.period {} ({file}) must be below the margin {} and at most --gate-lag {}: the agent may run the leader's inputs that long after leadership ended",
                    HumanDuration(period),
                    HumanDuration(margin),
                    HumanDuration(lag)
                ));
            }
        }
    }
}

/// Says where `text` (agent settings in `file`) still names the agent's
/// own leader; returns it as a mapping, or says it is not one.
fn leftover(at: &str, file: &str, text: &str, out: &mut Vec<String>) -> Option<yaml::Map> {
    let node = match yaml::read_one(text) {
        Ok(node) => node,
        Err(error) => {
            out.push(format!("{at}: {file} is not YAML: {error}"));
            return None;
        }
    };
    let mut places = Vec::new();
    agent::references(&node, "", &mut places);
    if !places.is_empty() {
        out.push(format!(
            "{at}: {file} still names {PROVIDER} ({}): the agent's own election may pick another pod than leader-gate's, or, the provider disabled, none; move each such input into the file gate's file without that condition (`leader-gate inject` does)",
            places.join(", ")
        ));
    }
    match node {
        Node::Map(map) => Some(map),
        Node::Null => Some(yaml::Map::default()),
        _ => {
            out.push(format!("{at}: {file} is not a mapping"));
            None
        }
    }
}

/// The ConfigMap key `container` sees at `path`, if the stream holds it:
/// (`KEY of ConfigMap NAME`, its text).
fn config_map_text(
    stream: &Stream<'_>,
    pod: &Pod,
    container: &Container,
    path: &str,
) -> Option<(String, String)> {
    let mount = container.mount_of(path)?;
    let volume = pod.volume(mount.volume)?.map("configMap")?;
    let name = volume.str("name")?;
    let key = config_map_key(volume, &mount.inside)?;
    let text = stream
        .config_map(&pod.namespace, name)?
        .map("data")?
        .str(&key)?
        .to_owned();
    Some((format!("{key} of ConfigMap {name}"), text))
}
