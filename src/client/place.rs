//! The Lease a client gates and its place among the sidecar's Leases, as
//! the gated collector gets them: `LEADER_GATE_LEASE`, `LEADER_GATE_SHARD`
//! and `LEADER_GATE_SHARDS` in `exec`'s child's environment, and the same
//! names written `${NAME}` replaced in `exec`'s arguments (images without a
//! shell) and in the files `file-gate` copies. A sharded collector (e.g.
//! kube-state-metrics `--shard`, `--total-shards`) then takes the shard this
//! pod holds without knowing in advance which one it will be.

/// The followed Lease and its place (`shard` of `shards`, from 0), as the
/// sidecar's events say: 0 of 1 for a Lease alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub lease: String,
    pub shard: u64,
    pub shards: u64,
}

impl Place {
    /// The variables, by name.
    pub fn vars(&self) -> [(&'static str, String); 3] {
        [
            ("LEADER_GATE_LEASE", self.lease.clone()),
            ("LEADER_GATE_SHARD", self.shard.to_string()),
            ("LEADER_GATE_SHARDS", self.shards.to_string()),
        ]
    }

    /// `text` with every `${LEADER_GATE_LEASE}`, `${LEADER_GATE_SHARD}` and
    /// `${LEADER_GATE_SHARDS}` replaced; nothing else is touched (any other
    /// `${…}` is the collector's own to expand).
    pub fn substitute(&self, text: &[u8]) -> Vec<u8> {
        let vars = self.vars();
        let mut out = Vec::with_capacity(text.len());
        let mut rest = text;
        'scan: while let Some(at) = find(rest, b"${") {
            out.extend_from_slice(&rest[..at]);
            rest = &rest[at..];
            for (name, value) in &vars {
                let token_len = name.len() + 3;
                if rest.len() >= token_len
                    && &rest[2..token_len - 1] == name.as_bytes()
                    && rest[token_len - 1] == b'}'
                {
                    out.extend_from_slice(value.as_bytes());
                    rest = &rest[token_len..];
                    continue 'scan;
                }
            }
            out.extend_from_slice(b"${");
            rest = &rest[2..];
        }
        out.extend_from_slice(rest);
        out
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard_two_of_four() -> Place {
        Place {
            lease: "ksm-2".into(),
            shard: 2,
            shards: 4,
        }
    }

    #[test]
    fn only_the_three_names_are_replaced_and_everything_else_is_kept() {
        let place = shard_two_of_four();
        let cases: [(&str, &str); 7] = [
            (
                "--shard=${LEADER_GATE_SHARD} --total-shards=${LEADER_GATE_SHARDS}",
                "--shard=2 --total-shards=4",
            ),
            ("lease: ${LEADER_GATE_LEASE}", "lease: ksm-2"),
            // The collector's own variables, and near misses, stay.
            (
                "${NODE_NAME} ${LEADER_GATE_SHARDX}",
                "${NODE_NAME} ${LEADER_GATE_SHARDX}",
            ),
            (
                "$LEADER_GATE_SHARD ${LEADER_GATE_SHARD",
                "$LEADER_GATE_SHARD ${LEADER_GATE_SHARD",
            ),
            ("${${LEADER_GATE_SHARD}}", "${2}"),
            ("", ""),
            ("ünïcode ${LEADER_GATE_SHARDS}$", "ünïcode 4$"),
        ];
        for (text, expected) in cases {
            assert_eq!(
                String::from_utf8(place.substitute(text.as_bytes())).unwrap(),
                expected,
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_environment_names_the_lease_and_its_shard() {
        let vars = shard_two_of_four().vars();
        assert_eq!(
            vars.map(|(k, v)| format!("{k}={v}")),
            [
                "LEADER_GATE_LEASE=ksm-2",
                "LEADER_GATE_SHARD=2",
                "LEADER_GATE_SHARDS=4"
            ]
        );
    }
}
