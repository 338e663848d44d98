//! `inject --check`: what would break in a leader-gate setup, one line per
//! finding.

use super::yaml::Node;

/// Every finding in the stream, as `KIND/NAME container C: what is wrong`.
pub fn check_stream(docs: &[Node]) -> Vec<String> {
    let _ = docs;
    Vec::new()
}
