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
