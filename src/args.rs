//! What several sides' flags share: Kubernetes names as the API server
//! checks them (DNS-1123 labels and subdomains), the Lease's namespace
//! ([`resolve_namespace`], for `serve` and `handover`), the error of a flag
//! that breaks a rule ([`ConfigError`]: one line naming the flag and the
//! rule, exit 64), and the bound on `/events` keep-alives that the sidecar's
//! flag obeys and its clients rely on ([`MAX_KEEP_ALIVE`]). Durations are
//! in [`crate::duration`]. Every subcommand's `--log-format`
//! ([`LogArgs`]) is here too, so one pod's containers log in one format.
//! Nothing of the project is imported here.

use std::time::Duration;

/// The longest keep-alive interval a sidecar may send (`--events-keep-alive`
/// is bounded by it): a stream may miss two keep-alives before its client
/// gives it up.
pub const MAX_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How every subcommand writes its log lines on stderr: `text` for a
/// person, `json` one object per line (`timestamp`, `level`,
/// `fields.message`, `target`) for a log pipeline. A pod's containers
/// should all say the same, so its log is one format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-format`, the same flag and variable for every subcommand.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr (the level comes from RUST_LOG, default info).
    /// Give every leader-gate container of a pod the same.
    #[arg(long, env = "LEADER_GATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A configuration value that breaks a rule.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {flag}: {rule}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub rule: String,
}

/// The error of `flag` breaking `rule`.
pub fn invalid(flag: &'static str, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        rule: rule.into(),
    }
}

/// The namespace: the flag or `POD_NAMESPACE` if given, else what kube-rs
/// inferred (the in-cluster namespace file, the kubeconfig context, `default`).
pub fn resolve_namespace(configured: Option<&str>, inferred: &str) -> Result<String, ConfigError> {
    let namespace = configured.unwrap_or(inferred).to_owned();
    validate_namespace(&namespace)?;
    Ok(namespace)
}

/// `--lease-namespace`: a DNS-1123 label, as the API server requires.
pub fn validate_namespace(namespace: &str) -> Result<(), ConfigError> {
    if is_dns1123_label(namespace) {
        Ok(())
    } else {
        Err(invalid(
            "--lease-namespace",
            format!(
                "{namespace:?} must be a DNS-1123 label (lowercase letters, digits and '-', starting and ending alphanumeric, at most 63 characters)"
            ),
        ))
    }
}

/// A DNS-1123 label: a namespace, or (starting with a letter) a Service name.
pub fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// A label value: at most 63 of `A-Z a-z 0-9 - _ .`, starting and ending
/// with a letter or digit (or empty).
pub fn is_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric())
}

/// A DNS-1123 subdomain: a Lease's or a pod's name.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_resolution_prefers_the_configured_one() {
        assert_eq!(resolve_namespace(Some("ops"), "default"), Ok("ops".into()));
        assert_eq!(
            resolve_namespace(None, "kube-system"),
            Ok("kube-system".into())
        );
        assert_eq!(
            resolve_namespace(None, "Bad").unwrap_err().flag,
            "--lease-namespace"
        );
    }
}
