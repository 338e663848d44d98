//! Metricbeat behind a file gate: its `metricbeat.yml` (in a ConfigMap of
//! the stream mounted into the collector) must load the file gate's DST
//! from a live-reloaded modules directory — the modules glob matching DST
//! and never the gate's temporary `.NAME.leader-gate.tmp`, `reload.enabled`,
//! and `reload.period` below the margin and at most the gate lag (Metricbeat
//! may run a removed module that long after "not leading"). An ECK `Beat`'s
//! configuration is its inline `spec.config`. Then Metricbeat's
//! `strict.perms`: it loads a module file only if root or its own user owns
//! it and neither group nor others may write it, so the file gate must
//! write as one of those, with a --mode without group or other write.

use super::Stream;
use super::workload::{Container, Pod};
use crate::duration::HumanDuration;
use crate::inject::metricbeat as mb;
use crate::inject::yaml::{self, Node};
use crate::serve::config::ServeConfig;

/// `key` in a Beats config, where `a.b.c` may be written dotted or nested.
fn lookup<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    node.as_map()?.dotted(&key.split('.').collect::<Vec<_>>())
}

/// The user Elastic's Metricbeat image runs as (`metricbeat`).
const METRICBEAT_IMAGE_USER: u64 = 1000;
/// The user leader-gate's image runs as (its Dockerfile's USER).
const LEADER_GATE_IMAGE_USER: u64 = 65532;

/// The file gate whose copy a Metricbeat reads.
pub struct Gate<'a> {
    pub container: &'a Container,
    /// Its `--mode`.
    pub mode: u32,
}

/// Checks the Metricbeat `reader` that sees a file gate's DST at `dst`.
pub fn check(
    stream: &Stream<'_>,
    pod: &Pod,
    reader: &Container,
    gate: &Gate<'_>,
    dst: &str,
    config: &ServeConfig,
    out: &mut Vec<String>,
) {
    let at = pod.at(reader);
    // The ConfigMap holding metricbeat.yml, mounted into the reader.
    let found = reader
        .node
        .seq("volumeMounts")
        .iter()
        .filter_map(Node::as_map)
        .filter_map(|m| pod.volume(m.str("name")?))
        .filter_map(|v| v.map("configMap")?.str("name"))
        .find_map(|name| {
            let cm = stream.config_map(&pod.namespace, name)?;
            let text = cm.map("data")?.str("metricbeat.yml")?.to_owned();
            Some((format!("ConfigMap {name}"), text))
        });
    let beat = match (found, &pod.beat_config) {
        (Some((cm, text)), _) => match yaml::read_one(&text) {
            Ok(beat) => (cm, beat),
            Err(error) => {
                out.push(format!("{at}: metricbeat.yml of {cm} is not YAML: {error}"));
                return;
            }
        },
        // ECK's Beat: its container named after the type reads spec.config.
        (None, Some((kind, config))) if kind == "metricbeat" && reader.name == *kind => {
            ("the Beat's spec.config".to_owned(), config.clone())
        }
        _ => return, // Not Metricbeat, or its configuration is not in the stream.
    };
    let (cm, beat) = beat;
    strict_perms(pod, reader, gate, out);
    // Beats' own election beside leader-gate's: the two can pick different
    // pods, and the modules it runs would run beside the gated ones.
    let unique = lookup(&beat, "metricbeat.autodiscover.providers")
        .and_then(Node::as_seq)
        .unwrap_or(&[])
        .iter()
        .filter_map(Node::as_map)
        .any(|p| p.get("unique") == Some(&Node::Bool(true)));
    if unique {
        out.push(format!(
            "{at}: metricbeat.yml of {cm} still has a `unique: true` autodiscover provider: Beats elects its own leader for those modules, which may be another pod than leader-gate's; move its modules into the file gate's file (`leader-gate inject` does)"
        ));
    }
    let Some(pattern) = lookup(&beat, "metricbeat.config.modules.path").and_then(Node::as_str)
    else {
        out.push(format!(
            "{at}: metricbeat.yml of {cm} sets no metricbeat.config.modules.path: the file gate's DST {dst} is never loaded"
        ));
        return;
    };
    if lookup(&beat, "metricbeat.config.modules.reload.enabled") != Some(&Node::Bool(true)) {
        out.push(format!(
            "{at}: metricbeat.config.modules reload.enabled is not true ({cm}): Metricbeat would never notice the file gate's copy come and go"
        ));
    }
    let margin = config.lease_duration - config.renew_deadline;
    let lag = config.shutdown.gate_lag;
    let modules = lookup(&beat, "metricbeat.config.modules").and_then(Node::as_map);
    match modules.map_or(Ok(None), mb::reload_period) {
        Ok(p) => {
            let p = p.unwrap_or(mb::DEFAULT_RELOAD);
            if !(p < margin && p <= lag) {
                out.push(format!(
                    "{at}: reload.period {} ({cm}) must be below the margin {} and at most --gate-lag {}: Metricbeat may run the module that long after leadership ended",
                    HumanDuration(p),
                    HumanDuration(margin),
                    HumanDuration(lag)
                ));
            }
        }
        Err(error) => out.push(format!("{at}: {error} ({cm})")),
    }
    let pattern = &crate::inject::metricbeat::resolve_paths(pattern);
    if !glob_match(pattern, dst) {
        out.push(format!(
            "{at}: modules glob {pattern} ({cm}) does not match the file gate's DST {dst}: the leader's module would never load"
        ));
    }
    // The gate's own files beside DST: its temporary copy and its marker.
    let dst = std::path::Path::new(dst);
    let tmp = crate::client::file_gate::temporary_path(dst);
    let tmp = tmp.to_string_lossy();
    if glob_match(pattern, &tmp) {
        let marker = crate::client::file_gate::marker_path(dst);
        out.push(format!(
            "{at}: modules glob {pattern} ({cm}) matches the file gate's temporary file {tmp}: a half-written copy could be loaded (and its marker {} read as modules)",
            marker.display()
        ));
    }
}

/// `runAsUser` of `container`, else of the pod, else `image_user`.
fn user_of(pod: &Pod, container: &Container, image_user: Option<u64>) -> Option<u64> {
    container
        .node
        .map("securityContext")
        .and_then(|s| s.get("runAsUser"))
        .and_then(Node::as_u64)
        .or(pod.run_as_user)
        .or(image_user)
}

/// Metricbeat's strict.perms against the file gate's copy: owned by root or
/// Metricbeat's user, written by nobody else. Unknown users go unchecked.
fn strict_perms(pod: &Pod, reader: &Container, gate: &Gate<'_>, out: &mut Vec<String>) {
    let relaxed = ["command", "args"].iter().any(|key| {
        reader
            .node
            .seq(key)
            .iter()
            .filter_map(Node::as_str)
            .any(|a| a == "-strict.perms=false" || a == "--strict.perms=false")
    });
    if relaxed {
        return;
    }
    let at = pod.at(reader);
    let name = &gate.container.name;
    let image = |c: &Container| c.node.str("image").unwrap_or("").to_owned();
    let reader_image = image(reader);
    let elastic = pod.beat_config.is_some()
        || reader_image
            .rsplit('/')
            .next()
            .is_some_and(|last| last.starts_with("metricbeat"));
    let gate_image =
        super::line::is_leader_gate_image(&image(gate.container)).then_some(LEADER_GATE_IMAGE_USER);
    let reader_user = user_of(pod, reader, elastic.then_some(METRICBEAT_IMAGE_USER));
    let gate_user = user_of(pod, gate.container, gate_image);
    if let (Some(reader_user), Some(gate_user)) = (reader_user, gate_user)
        && gate_user != 0
        && gate_user != reader_user
    {
        let users = match reader_user {
            0 => "0".to_owned(),
            user => format!("{user} (or 0)"),
        };
        out.push(format!(
            "{at}: strict.perms: Metricbeat runs as uid {reader_user} and loads only module files owned by it or root, but the file gate {name} writes its copy as uid {gate_user}: the leader's module would be refused; run {name} as uid {users}, or start Metricbeat with -strict.perms=false"
        ));
    }
    if gate.mode & 0o022 != 0 {
        out.push(format!(
            "{at}: strict.perms: the file gate {name}'s --mode {:04o} lets group or others write the copy, which Metricbeat refuses to load: use 0644 or narrower",
            gate.mode
        ));
    }
}

/// Go's `filepath.Match`: `*` any run of characters but `/`, `?` one of
/// them, `[…]` a class (`^` negates, `a-z` ranges), `\` escapes.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    matches(&p, &s)
}

fn matches(p: &[char], s: &[char]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some('*') => (0..=s.len())
            .take_while(|&i| i == 0 || s[i - 1] != '/')
            .any(|i| matches(&p[1..], &s[i..])),
        Some('?') => s.first().is_some_and(|&c| c != '/') && matches(&p[1..], &s[1..]),
        Some('[') => {
            let Some(&c) = s.first().filter(|&&c| c != '/') else {
                return false;
            };
            let Some((hit, rest)) = class(&p[1..], c) else {
                return false; // A malformed class matches nothing.
            };
            hit && matches(rest, &s[1..])
        }
        Some('\\') if p.len() > 1 => s.first() == Some(&p[1]) && matches(&p[2..], &s[1..]),
        Some(&c) => s.first() == Some(&c) && matches(&p[1..], &s[1..]),
    }
}

/// Whether `c` is in the class starting at `p` (after `[`), and the pattern after `]`.
fn class(p: &[char], c: char) -> Option<(bool, &[char])> {
    let (negated, mut p) = match p.first() {
        Some('^') => (true, &p[1..]),
        _ => (false, p),
    };
    let mut hit = false;
    let mut first = true;
    loop {
        match p.first()? {
            ']' if !first => return Some((hit != negated, &p[1..])),
            _ => {}
        }
        first = false;
        let (lo, rest) = one(p)?;
        let (hi, rest) = match rest.first() {
            Some('-') if rest.get(1) != Some(&']') => one(&rest[1..])?,
            _ => (lo, rest),
        };
        hit |= lo <= c && c <= hi;
        p = rest;
    }
}

fn one(p: &[char]) -> Option<(char, &[char])> {
    match p {
        ['\\', c, rest @ ..] => Some((*c, rest)),
        [c, rest @ ..] => Some((*c, rest)),
        [] => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glob_is_gos_a_star_never_crosses_a_slash() {
        let glob = "/usr/share/metricbeat/*modules.d/*.yml";
        assert!(glob_match(glob, "/usr/share/metricbeat/modules.d/k.yml"));
        assert!(glob_match(
            glob,
            "/usr/share/metricbeat/node-modules.d/k.yml"
        ));
        assert!(!glob_match(
            glob,
            "/usr/share/metricbeat/modules.d/.k.yml.leader-gate.tmp"
        ));
        assert!(!glob_match(glob, "/usr/share/metricbeat/a/modules.d/k.yml"));
        assert!(
            glob_match("/m/*", "/m/.k.yml.leader-gate.tmp"),
            "Go's * matches a leading dot"
        );
        assert!(glob_match("/m/[a-c]?.yml", "/m/bx.yml"));
        assert!(!glob_match("/m/[^a-c]?.yml", "/m/bx.yml"));
        assert!(!glob_match("/m/[a-c", "/m/a"), "malformed");
    }

    #[test]
    fn dotted_and_nested_keys_are_the_same_setting() {
        let beat =
            yaml::read_one("metricbeat:\n  config.modules:\n    reload.period: 5s\n").unwrap();
        assert_eq!(
            lookup(&beat, "metricbeat.config.modules.reload.period").and_then(Node::as_str),
            Some("5s")
        );
    }
}
