//! The leader-only copy of an OpenTelemetryCollector's collector: the
//! image the operator runs (the resource's, else its operator's
//! `--collector-image`), what that image's distribution has, and the
//! container made of the resource's fields as the operator makes its own
//! (`internal/manifests/collector/container.go` of the operator, cited in
//! [`super`]).

// `crate::inject::` rather than `super::`: scripts/module_graph.py reads a
// `super::` path in a file with inline tests as the file itself.
use crate::inject::otel_operator::operator_name;
use crate::inject::second;
use crate::inject::workload::{Collector, OTEL_CONTAINER, SECOND_SUFFIX, repository};
use crate::inject::yaml::{Map, Node, read_one};

/// The key of the leader-only configuration in its ConfigMap, the
/// operator's own file name for it.
pub const CONFIG_KEY: &str = "collector.yaml";

/// The image the operator's collector runs: `spec.image`, else the
/// `--collector-image` (or `RELATED_IMAGE_COLLECTOR`) of the operator's
/// Deployment in the stream. The note says where it came from.
pub fn image(docs: &[Node], spec: &Map) -> Result<(String, Option<String>), String> {
    // Empty is unset to the operator too.
    if let Some(image) = spec.str("image").filter(|i| !i.is_empty()) {
        return Ok((image.to_owned(), None));
    }
    let mut found: Vec<String> = Vec::new();
    for operator in docs
        .iter()
        .filter_map(Node::as_map)
        .filter(|d| d.str("kind") == Some("Deployment"))
        .flat_map(|d| {
            d.at(&["spec", "template", "spec"])
                .map(|p| p.seq("containers"))
                .unwrap_or_default()
        })
        .filter_map(Node::as_map)
        .filter(|c| c.str("image").map(repository) == Some("opentelemetry-operator"))
    {
        let args: Vec<&str> = operator
            .seq("args")
            .iter()
            .filter_map(Node::as_str)
            .collect();
        // The flag wins over the variable (the operator's config.Apply).
        let flag = args.iter().enumerate().find_map(|(i, a)| {
            a.strip_prefix("--collector-image=").or_else(|| {
                (*a == "--collector-image")
                    .then(|| args.get(i + 1).copied())
                    .flatten()
            })
        });
        let env = operator
            .seq("env")
            .iter()
            .filter_map(Node::as_map)
            .find(|e| e.str("name") == Some("RELATED_IMAGE_COLLECTOR"))
            .and_then(|e| e.str("value"));
        if let Some(image) = flag.or(env)
            && !found.iter().any(|f| f == image)
        {
            found.push(image.to_owned());
        }
    }
    match found.as_slice() {
        [one] => Ok((
            one.clone(),
            Some(format!(
                "spec.image is unset: the leader-only copy runs {one}, the --collector-image of the operator in this input; an operator upgrade changes its collector's image, not the copy's (run inject again, or set spec.image)"
            )),
        )),
        [] => Err("spec.image is unset, so the operator runs the image of its --collector-image, which inject cannot see (the operator's own default is the core distribution, without k8s_cluster, k8sobjects or k8s_events): set spec.image to the collector image you run".to_owned()),
        _ => Err(format!(
            "spec.image is unset and the operators in this input run different collector images ({}): set spec.image",
            found.join(", ")
        )),
    }
}

/// Whether `image` is the core distribution, which has no cluster receiver.
pub fn core_distribution(image: &str) -> bool {
    matches!(repository(image), "opentelemetry-collector" | "otelcol")
}

/// Whether `image`'s distribution has the nop receiver and exporter:
/// contrib from 0.98.0 (a tag that is no version, `latest`, is taken as
/// recent).
pub fn has_nop(image: &str) -> bool {
    if !matches!(
        repository(image),
        "opentelemetry-collector-contrib" | "otelcol-contrib"
    ) {
        return false;
    }
    let tag = image
        .split('@')
        .next()
        .and_then(|i| i.rsplit_once(':'))
        .map(|(_, tag)| tag.trim_start_matches('v'))
        .filter(|tag| !tag.contains('/'));
    let version: Option<(u64, u64)> = tag.and_then(|tag| {
        let mut parts = tag.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    });
    version.is_none_or(|v| v >= (0, 98))
}

/// The copy's arguments: its own `--config`, then `spec.args` as the
/// operator writes them (sorted `--KEY=VALUE`, no `config`).
fn copy_args(spec: &Map) -> Result<Vec<Node>, String> {
    let mut flags = Vec::new();
    for (key, value) in spec.map("args").map(|a| a.0.as_slice()).unwrap_or_default() {
        if key == "config" {
            continue;
        }
        let value = match value {
            Node::Str(s) => s.clone(),
            Node::Int(n) => n.to_string(),
            Node::Uint(n) => n.to_string(),
            Node::Bool(b) => b.to_string(),
            Node::Float(f) => f.to_string(),
            _ => return Err(format!("spec.args.{key} is not a string")),
        };
        flags.push(format!("--{key}={value}"));
    }
    flags.sort();
    let mut args = vec![Node::str(format!(
        "--config={}/{CONFIG_KEY}",
        second::CONFIG_DIR
    ))];
    args.extend(flags.into_iter().map(Node::Str));
    Ok(args)
}

/// The leader-only copy of the operator's collector: its image, command,
/// arguments, environment, resources, security context and mounts (those
/// of `spec.configmaps` as the operator makes them), the leader-only
/// configuration's mount; none of its ports, probes or hooks.
pub fn copy_container(spec: &Map, image: &str) -> Result<Map, String> {
    let mut copy = Map::default();
    copy.insert(
        "name",
        Node::str(format!("{OTEL_CONTAINER}{SECOND_SUFFIX}")),
    );
    copy.insert("image", Node::str(image));
    if let Some(policy) = spec.get("imagePullPolicy") {
        copy.insert("imagePullPolicy", policy.clone());
    }
    // The operator's `spec.command`, else the image's entrypoint (known:
    // checked before); [`pod::gate`] wraps it in `leader-gate exec`.
    let command = match spec.get("command") {
        Some(command) => command.clone(),
        None => Node::Seq(
            Collector::entrypoint(image)
                .unwrap_or_default()
                .into_iter()
                .map(Node::str)
                .collect(),
        ),
    };
    copy.insert("command", command);
    copy.insert("args", Node::Seq(copy_args(spec)?));
    let mut env = spec.seq("env").to_vec();
    // The operator adds POD_NAME to its collector's environment.
    if !env
        .iter()
        .any(|e| e.as_map().and_then(|e| e.str("name")) == Some("POD_NAME"))
    {
        env.push(
            read_one("{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}")
                .expect("inject's own template is YAML"),
        );
    }
    copy.insert("env", Node::Seq(env));
    for key in ["envFrom", "resources", "securityContext"] {
        if let Some(value) = spec.get(key) {
            copy.insert(key, value.clone());
        }
    }
    let mut mounts = spec.seq("volumeMounts").to_vec();
    for extra in spec.seq("configmaps").iter().filter_map(Node::as_map) {
        let Some(name) = extra.str("name") else {
            continue;
        };
        let volume = operator_name("configmap-", name, "");
        let dir = extra.str("mountpath").unwrap_or("").trim_matches('/');
        let path = [String::from("/var/conf"), dir.to_owned(), volume.clone()]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        let mut mount = Map::default();
        mount.insert("name", Node::str(volume));
        mount.insert("mountPath", Node::str(path));
        mounts.push(Node::Map(mount));
    }
    mounts.push(second::config_mount());
    copy.insert("volumeMounts", Node::Seq(mounts));
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nop_components_are_in_contrib_from_0_98() {
        for (image, has) in [
            ("otel/opentelemetry-collector-contrib:0.158.0", true),
            ("otel/opentelemetry-collector-contrib:0.98.0", true),
            ("otel/opentelemetry-collector-contrib:0.97.0", false),
            ("ghcr.io/x/otelcol-contrib:v0.120.1@sha256:ab", true),
            ("otel/opentelemetry-collector-contrib:latest", true),
            ("otel/opentelemetry-collector-contrib", true),
            ("localhost:5000/otelcol-contrib", true),
            ("otel/opentelemetry-collector-k8s:0.158.0", false),
            ("otel/opentelemetry-collector:0.158.0", false),
        ] {
            assert_eq!(has_nop(image), has, "{image}");
        }
    }
}
