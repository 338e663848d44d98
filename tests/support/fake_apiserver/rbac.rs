//! RBAC as the fake applies it: one Role (rules of apiGroups, resources, resourceNames and
//! verbs), bound to every client in the server's namespace, read by default from the
//! project's own `manifests/rbac.yaml`.
//!
//! The manifest is YAML; it is parsed with `serde-saphyr`, the YAML parser kube-rs already
//! brings for kubeconfigs (a dev-dependency here, so no new crate), each document into
//! JSON, and the first `kind: Role` is taken.

use serde::Deserialize;
use serde_json::Value;

/// `manifests/rbac.yaml`, as the repository has it (compiled in, so a changed manifest
/// rebuilds the tests that enforce it).
pub const RBAC_MANIFEST: &str = include_str!("../../../manifests/rbac.yaml");

/// The Lease name `manifests/rbac.yaml` grants, which its comment tells users to replace
/// with their own; the fake replaces it with the lease name it serves.
pub const MANIFEST_LEASE_NAME: &str = "metricbeat-leader";

/// One rule of a Role, with the fields RBAC matches on.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    /// Empty: any name (and requests without a name, such as create).
    #[serde(default)]
    pub resource_names: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
}

/// What one request asks RBAC for.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: &'a str,
    /// `""` for the core group.
    pub group: &'a str,
    pub resource: &'a str,
    /// The name in the path, or of the `metadata.name` field selector of a list or watch;
    /// `""` for create and for collection requests without that selector.
    pub name: &'a str,
}

impl PolicyRule {
    /// A rule as a Role in YAML would spell it.
    pub fn new(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            api_groups: own(groups),
            resources: own(resources),
            resource_names: own(names),
            verbs: own(verbs),
        }
    }

    /// Whether this rule allows the request, as the RBAC authorizer decides: verb, group
    /// and resource match (`*` matches all), and `resourceNames` is empty or lists the
    /// request's name (a request without a name never matches a rule with names).
    pub fn allows(&self, req: &Attributes) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        has(&self.verbs, req.verb)
            && has(&self.api_groups, req.group)
            && has(&self.resources, req.resource)
            && (self.resource_names.is_empty()
                || (!req.name.is_empty() && self.resource_names.iter().any(|n| n == req.name)))
    }
}

/// A namespaced Role: what its subjects may do in the namespace it is bound in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Role {
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
}

impl Role {
    /// The Role of `manifests/rbac.yaml`, with its Lease name replaced by `lease_name`
    /// (what the manifest's header asks of its users).
    pub fn from_repository_manifest(lease_name: &str) -> Role {
        Self::from_manifest(RBAC_MANIFEST)
            .unwrap_or_else(|e| panic!("manifests/rbac.yaml: {e}"))
            .with_lease_name(MANIFEST_LEASE_NAME, lease_name)
    }

    /// The first `kind: Role` document of a multi-document YAML manifest.
    pub fn from_manifest(yaml: &str) -> Result<Role, String> {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(yaml).map_err(|e| format!("not YAML: {e}"))?;
        for value in documents {
            if value["kind"] == "Role" {
                return serde_json::from_value(value).map_err(|e| format!("bad Role: {e}"));
            }
        }
        Err("no document of kind Role".to_string())
    }

    /// The same Role with every resourceName `from` replaced by `to`.
    pub fn with_lease_name(mut self, from: &str, to: &str) -> Role {
        for name in self
            .rules
            .iter_mut()
            .flat_map(|r| r.resource_names.iter_mut())
        {
            if name == from {
                *name = to.to_string();
            }
        }
        self
    }

    /// The same Role without `verb` on `resource` of `group` in any rule (rules left
    /// without a verb are dropped): e.g. a Role that lacks `update` on Leases.
    /// With the Events rule of `manifests/rbac.yaml` (for `--record-events`), for a Role without it:
    /// create on `events` (core group), which cannot be limited by name.
    pub fn with_events(mut self) -> Role {
        self.rules
            .push(PolicyRule::new(&[""], &["events"], &[], &["create"]));
        self
    }

    pub fn without(mut self, group: &str, resource: &str, verb: &str) -> Role {
        for rule in &mut self.rules {
            if rule.api_groups.iter().any(|g| g == group)
                && rule.resources.iter().any(|r| r == resource)
            {
                rule.verbs.retain(|v| v != verb);
            }
        }
        self.rules.retain(|r| !r.verbs.is_empty());
        self
    }

    /// Whether any rule allows the request.
    pub fn allows(&self, req: &Attributes) -> bool {
        self.rules.iter().any(|r| r.allows(req))
    }
}

// === lease-protection: the Role as a kustomize JSON patch leaves it ===

impl Role {
    /// The Role of `manifests/rbac.yaml` after the JSON patch (RFC 6902, as YAML) that
    /// kustomize applies to it, e.g. `manifests/lease-protection/role-without-create.yaml`;
    /// its Lease name replaced by `lease_name`. A failed `test` operation panics, as
    /// kustomize fails.
    pub fn from_repository_manifest_patched(lease_name: &str, patch: &str) -> Role {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(RBAC_MANIFEST).expect("manifests/rbac.yaml is YAML");
        let mut role = documents
            .into_iter()
            .find(|d| d["kind"] == "Role")
            .expect("a Role in manifests/rbac.yaml");
        let operations: Vec<Value> = serde_saphyr::from_str(patch).expect("the patch is YAML");
        apply_json_patch(&mut role, &operations).unwrap_or_else(|e| panic!("JSON patch: {e}"));
        serde_json::from_value::<Role>(role)
            .expect("a Role after the patch")
            .with_lease_name(MANIFEST_LEASE_NAME, lease_name)
    }
}

/// The RFC 6902 operations kustomize patches use here: `test`, `remove`, `add`, `replace`
/// (JSON pointers into objects and arrays; `-` appends).
pub fn apply_json_patch(doc: &mut Value, operations: &[Value]) -> Result<(), String> {
    for op in operations {
        let path = op["path"].as_str().ok_or("an operation without a path")?;
        let (parent, last) = match path.rfind('/') {
            Some(at) => (
                &path[..at],
                path[at + 1..].replace("~1", "/").replace("~0", "~"),
            ),
            None => return Err(format!("{path:?} is not a JSON pointer")),
        };
        match op["op"].as_str() {
            Some("test") => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!("test of {path} failed: {:?}", doc.pointer(path)));
                }
            }
            Some(kind @ ("remove" | "add" | "replace")) => {
                let target = doc
                    .pointer_mut(parent)
                    .ok_or_else(|| format!("{path}: no {parent}"))?;
                match target {
                    Value::Array(items) => {
                        let index = if last == "-" {
                            items.len()
                        } else {
                            last.parse::<usize>().map_err(|e| format!("{path}: {e}"))?
                        };
                        let in_range =
                            index < items.len() || (kind == "add" && index == items.len());
                        if !in_range {
                            return Err(format!("{path}: index out of range"));
                        }
                        match kind {
                            "remove" => {
                                items.remove(index);
                            }
                            "add" => items.insert(index, op["value"].clone()),
                            _ => items[index] = op["value"].clone(),
                        }
                    }
                    Value::Object(map) => match kind {
                        "remove" => {
                            map.remove(&last).ok_or_else(|| format!("{path}: absent"))?;
                        }
                        _ => {
                            map.insert(last, op["value"].clone());
                        }
                    },
                    _ => return Err(format!("{path}: {parent} is neither object nor array")),
                }
            }
            other => return Err(format!("unsupported operation {other:?}")),
        }
    }
    Ok(())
}
