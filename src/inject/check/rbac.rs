//! What the pod's service account may do, as the stream's Roles,
//! ClusterRoles and their bindings grant it, against what the sidecar's
//! flags need: get, update, list and watch on each of its Leases (a rule's
//! resourceNames honoured), create on Leases unless the stream ships them,
//! create on Events with --record-events, get and update on the
//! EndpointSlice of --route-service.
//!
//! A stream without any RBAC object still gets a finding per Lease: an SRE
//! applying it alone gets a pod that cannot take its Lease, and the line
//! says to ignore it when the grant lives elsewhere.

use std::collections::BTreeSet;

use super::Stream;
use super::workload::Pod;
use crate::inject::yaml::{Map, Node};
use crate::serve::config::ServeConfig;

const VERBS: [&str; 4] = ["get", "update", "list", "watch"];

/// `""` (kubectl's current namespace) goes with any.
fn same_namespace(a: &str, b: &str) -> bool {
    a == b || a.is_empty() || b.is_empty()
}

fn listed(rule: &Map, key: &str, value: &str) -> bool {
    rule.seq(key)
        .iter()
        .any(|v| v.as_str().is_some_and(|v| v == value || v == "*"))
}

/// The rules of every Role and ClusterRole bound to `sa` of `namespace`,
/// with the role's `KIND/NAME`.
fn bound_rules<'s>(stream: &'s Stream<'_>, namespace: &str, sa: &str) -> Vec<(String, &'s Map)> {
    let binds = |binding: &Map, default_ns: &str| {
        binding
            .seq("subjects")
            .iter()
            .filter_map(Node::as_map)
            .any(|s| {
                s.str("kind") == Some("ServiceAccount")
                    && s.str("name") == Some(sa)
                    && same_namespace(s.str("namespace").unwrap_or(default_ns), namespace)
            })
    };
    let mut roles = Vec::new();
    let mut add = |kind: &'static str, name: &str, role_ns: Option<&str>| {
        for role in stream.objects(kind) {
            let (n, ns) = Stream::name_of(role);
            if n == name && role_ns.is_none_or(|want| same_namespace(ns, want)) {
                for rule in role.seq("rules").iter().filter_map(Node::as_map) {
                    roles.push((format!("{kind} {name}"), rule));
                }
            }
        }
    };
    for binding in stream.objects("RoleBinding") {
        let (_, ns) = Stream::name_of(binding);
        if !same_namespace(ns, namespace) || !binds(binding, ns) {
            continue;
        }
        let Some(role) = binding.map("roleRef") else {
            continue;
        };
        match (role.str("kind"), role.str("name")) {
            (Some("Role"), Some(name)) => add("Role", name, Some(ns)),
            (Some("ClusterRole"), Some(name)) => add("ClusterRole", name, None),
            _ => {}
        }
    }
    for binding in stream.objects("ClusterRoleBinding") {
        if !binds(binding, "") {
            continue;
        }
        if let Some(role) = binding.map("roleRef")
            && role.str("kind") == Some("ClusterRole")
            && let Some(name) = role.str("name")
        {
            add("ClusterRole", name, None);
        }
    }
    roles
}

/// What the bound rules grant on one object: the verbs, and the roles that
/// would have granted more had their resourceNames named it.
fn grants(
    rules: &[(String, &Map)],
    group: &str,
    resource: &str,
    name: Option<&str>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut verbs = BTreeSet::new();
    let mut other_names = BTreeSet::new();
    for (role, rule) in rules {
        if !listed(rule, "apiGroups", group) || !listed(rule, "resources", resource) {
            continue;
        }
        let names: Vec<&str> = rule
            .seq("resourceNames")
            .iter()
            .filter_map(Node::as_str)
            .collect();
        let named = names.is_empty() || name.is_some_and(|n| names.contains(&n));
        for verb in rule.seq("verbs").iter().filter_map(Node::as_str) {
            // A create request has no name yet: resourceNames never grant it.
            let granted = if verb == "create" {
                names.is_empty()
            } else {
                named
            };
            if granted && verb == "*" {
                verbs.extend(VERBS.map(String::from));
                if names.is_empty() {
                    verbs.insert("create".to_owned());
                }
            } else if granted {
                verbs.insert(verb.to_owned());
            } else {
                other_names.insert(format!("{role} names only {}", names.join(", ")));
            }
        }
    }
    (verbs, other_names)
}

/// What the flags need on one object: (what, API group, resource, name, verbs).
type Need = (
    String,
    &'static str,
    &'static str,
    Option<String>,
    Vec<&'static str>,
);

/// Says what the service account of `pod` lacks for the sidecar `config`.
pub fn check(
    stream: &Stream<'_>,
    pod: &Pod,
    sidecar: &str,
    config: &ServeConfig,
    out: &mut Vec<String>,
) {
    let _ = sidecar;
    let namespace = config.lease_namespace.as_deref().unwrap_or(&pod.namespace);
    let sa = &pod.service_account;
    let rules = bound_rules(stream, namespace, sa);
    let any_rbac = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]
        .iter()
        .any(|kind| stream.objects(kind).next().is_some());
    let shipped = |lease: &str| {
        stream.objects("Lease").any(|l| {
            let (n, ns) = Stream::name_of(l);
            n == lease && same_namespace(ns, namespace)
        })
    };
    let mut needs: Vec<Need> = Vec::new();
    for lease in &config.leases {
        let mut verbs = VERBS.to_vec();
        if !shipped(lease) {
            verbs.push("create");
        }
        needs.push((
            format!("Lease {lease}"),
            "coordination.k8s.io",
            "leases",
            Some(lease.clone()),
            verbs,
        ));
    }
    if config.record_events {
        needs.push((
            "Events (--record-events)".to_owned(),
            "",
            "events",
            None,
            vec!["create"],
        ));
    }
    if let Some(route) = &config.route {
        let slice = route.slice_name();
        needs.push((
            format!("EndpointSlice {slice} (--route-service)"),
            "discovery.k8s.io",
            "endpointslices",
            Some(slice),
            vec!["get", "update"],
        ));
    }
    for (what, group, resource, name, verbs) in needs {
        let (granted, other_names) = grants(&rules, group, resource, name.as_deref());
        let missing: Vec<&str> = verbs
            .iter()
            .copied()
            .filter(|verb| !granted.contains(*verb))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let in_ns = if namespace.is_empty() {
            String::new()
        } else {
            format!(" in namespace {namespace}")
        };
        if granted.is_empty() && (rules.is_empty() || !any_rbac) {
            out.push(format!(
                "{}: service account {sa} is granted nothing on {what}{in_ns} in this stream: bind it a Role granting {} (or ignore this if it is granted elsewhere)",
                pod.name,
                missing.join(", ")
            ));
        } else {
            let why = if other_names.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    other_names.into_iter().collect::<Vec<_>>().join("; ")
                )
            };
            out.push(format!(
                "{}: service account {sa} lacks {} on {what}{in_ns}{why}: add them to a Role bound to it",
                pod.name,
                missing.join(", ")
            ));
        }
    }
}
