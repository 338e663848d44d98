//! `--status-url` and `--stopped-when`: when a collector's own status says
//! that the gated work stopped — the proof `file-gate` acknowledges a term
//! on, instead of waiting the gate lag.
//!
//! The status is whatever the collector serves anyway, read with a GET:
//! Metricbeat's `/stats` (JSON), Prometheus' `/metrics` (the text
//! exposition format). `--stopped-when` is `SELECTOR OP VALUE`, separated
//! by spaces:
//!
//! - SELECTOR, in a JSON answer (one that starts with `{`), is a dotted path
//!   to a number: `libbeat.config.module.running`; in a text answer, a
//!   sample: a metric name with optional label matchers,
//!   `prometheus_target_scrape_pool_targets{scrape_job="cluster"}` — the
//!   sum of every series of that name whose labels include those.
//! - OP is `==`, `<=` or `<`.
//! - VALUE is a number, or `before`: the value the status answered just
//!   before this term's copies were placed (for a count shared with work
//!   that is not gated, such as Metricbeat's running modules).
//!
//! Nothing here guesses: an answer that is not 2xx, not parsed, without
//! the selector, or with a value that is not a finite number says nothing,
//! and neither does `before` when it was not read.

use std::fmt;
use std::time::Duration;

use hyper::Method;

use crate::client::url::GateUrl;

/// How long one status read may take, answer included.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// `--stopped-when`: a comparison of one number of the status.
#[derive(Clone, Debug, PartialEq)]
pub struct StoppedWhen {
    selector: Selector,
    op: Op,
    value: Bound,
}

/// Where the number is in the answer.
#[derive(Clone, Debug, PartialEq)]
enum Selector {
    /// A dotted path into a JSON answer; in a text answer, a sample of
    /// this name without label matchers.
    Path(Vec<String>),
    /// A sample of a text answer: a metric name and label matchers.
    Sample {
        name: String,
        labels: Vec<(String, String)>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Le,
    Lt,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bound {
    Number(f64),
    /// The value read before the term's copies were placed.
    Before,
}

/// What one read of the status came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// The selected number.
    Value(f64),
    /// Why it says nothing (said once per episode by the caller).
    Unreadable(String),
}

// === impl StoppedWhen ===

impl StoppedWhen {
    /// Parses `SELECTOR OP VALUE`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = "expected SELECTOR OP VALUE separated by spaces, e.g. \
                     'libbeat.config.module.running <= before' or \
                     'prometheus_target_scrape_pool_targets{scrape_job=\"cluster\"} == 0'";
        let split = |text: &str| {
            text.trim()
                .rsplit_once(char::is_whitespace)
                .map(|(rest, last)| (rest.trim_end().to_owned(), last.to_owned()))
        };
        let Some((selector, op, value)) =
            split(text).and_then(|(rest, value)| split(&rest).map(|(sel, op)| (sel, op, value)))
        else {
            return Err(usage.into());
        };
        let (op, value) = (op.as_str(), value.as_str());
        let op = match op {
            "==" => Op::Eq,
            "<=" => Op::Le,
            "<" => Op::Lt,
            other => return Err(format!("unknown operator {other:?} (==, <= or <): {usage}")),
        };
        let value = match value {
            "before" => Bound::Before,
            number => match number.parse::<f64>() {
                Ok(n) if n.is_finite() => Bound::Number(n),
                _ => return Err(format!("{number:?} is neither a number nor `before`")),
            },
        };
        Ok(Self {
            selector: Selector::parse(selector.trim())?,
            op,
            value,
        })
    }

    /// Whether VALUE is `before`: the status must be read before a term's
    /// copies are placed.
    pub fn needs_before(&self) -> bool {
        self.value == Bound::Before
    }

    /// The selected number of one answer.
    pub fn select(&self, body: &[u8]) -> Reading {
        let Ok(text) = std::str::from_utf8(body) else {
            return Reading::Unreadable("the status is not UTF-8".into());
        };
        let found = if text.trim_start().starts_with('{') {
            self.selector.in_json(text)
        } else {
            self.selector.in_text(text)
        };
        match found {
            Ok(n) if n.is_finite() => Reading::Value(n),
            Ok(n) => Reading::Unreadable(format!("{} is {n}", self.selector)),
            Err(why) => Reading::Unreadable(why),
        }
    }

    /// Whether `value` says the work stopped; `None` when VALUE is `before`
    /// and it was not read.
    pub fn holds(&self, value: f64, before: Option<f64>) -> Option<bool> {
        let bound = match self.value {
            Bound::Number(n) => n,
            Bound::Before => before?,
        };
        Some(match self.op {
            Op::Eq => value == bound,
            Op::Le => value <= bound,
            Op::Lt => value < bound,
        })
    }
}

impl fmt::Display for StoppedWhen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            Op::Eq => "==",
            Op::Le => "<=",
            Op::Lt => "<",
        };
        match self.value {
            Bound::Number(n) => write!(f, "{} {op} {n}", self.selector),
            Bound::Before => write!(f, "{} {op} before", self.selector),
        }
    }
}

/// One GET of the status, and the selected number.
pub async fn read(url: &GateUrl, stopped_when: &StoppedWhen) -> Reading {
    match url.fetch(Method::GET, "", READ_TIMEOUT).await {
        Ok((status, body)) if (200..300).contains(&status) => stopped_when.select(&body),
        Ok((status, _)) => Reading::Unreadable(format!("{} answered {status}", url.path(""))),
        Err(error) => Reading::Unreadable(format!("{} failed: {error}", url.path(""))),
    }
}

// === impl Selector ===

impl Selector {
    fn parse(text: &str) -> Result<Self, String> {
        let Some((name, rest)) = text.split_once('{') else {
            let path: Vec<String> = text.split('.').map(str::to_owned).collect();
            if path
                .iter()
                .any(|p| p.is_empty() || p.contains(char::is_whitespace))
            {
                return Err(format!("{text:?} is not a dotted path or a metric name"));
            }
            return Ok(Self::Path(path));
        };
        let Some(inner) = rest.strip_suffix('}') else {
            return Err(format!("{text:?}: the label matchers must end with `}}`"));
        };
        if !is_metric_name(name) {
            return Err(format!("{name:?} is not a metric name"));
        }
        let labels = parse_labels(inner)
            .ok_or_else(|| format!("{text:?}: expected {{name=\"value\",…}}"))?;
        Ok(Self::Sample {
            name: name.to_owned(),
            labels,
        })
    }

    fn in_json(&self, text: &str) -> Result<f64, String> {
        let Self::Path(path) = self else {
            return Err(format!("{self} selects a sample, and the status is JSON"));
        };
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("the status is not JSON: {e}"))?;
        path.iter()
            .try_fold(&json, |at, key| at.get(key))
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| format!("the status has no number at {self}"))
    }

    fn in_text(&self, text: &str) -> Result<f64, String> {
        let (name, wanted): (&str, &[(String, String)]) = match self {
            Self::Path(path) if path.len() == 1 => (&path[0], &[]),
            Self::Path(_) => {
                return Err(format!("{self} is a JSON path, and the status is not JSON"));
            }
            Self::Sample { name, labels } => (name, labels),
        };
        let mut sum = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line)
                .ok_or_else(|| format!("the status has a line that is not a sample: {line:?}"))?;
            if sample.name == name && wanted.iter().all(|w| sample.labels.contains(w)) {
                *sum.get_or_insert(0.0) += sample.value;
            }
        }
        sum.ok_or_else(|| format!("the status has no sample {self}"))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => f.write_str(&path.join(".")),
            Self::Sample { name, labels } => {
                write!(f, "{name}{{")?;
                for (i, (k, v)) in labels.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{k}={v:?}")?;
                }
                f.write_str("}")
            }
        }
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `name="value",…` (a trailing comma allowed), values with the text
/// format's escapes (`\\`, `\"`, `\n`).
fn parse_labels(mut text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start();
        if text.is_empty() {
            return Some(labels);
        }
        let (name, rest) = text.split_once('=')?;
        let name = name.trim();
        if !is_metric_name(name) || name.contains(':') {
            return None;
        }
        let rest = rest.trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        text = rest[end + 1..].trim_start();
        text = match text.strip_prefix(',') {
            Some(rest) => rest,
            None if text.is_empty() => text,
            None => return None,
        };
    }
}

/// One line of the text format: `name{labels} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(String, String)>,
    value: f64,
}

/// One sample line.
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let close = closing_brace(inner)?;
        labels = parse_labels(&inner[..close])?;
        rest = &inner[close + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The index of the `}` that closes a label set, quotes respected.
fn closing_brace(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP prometheus_target_scrape_pool_targets Current number of targets in this scrape pool.
# TYPE prometheus_target_scrape_pool_targets gauge
prometheus_target_scrape_pool_targets{scrape_job="cluster"} 0
prometheus_target_scrape_pool_targets{scrape_job="node"} 3
prometheus_target_scrape_pool_targets{scrape_job="odd \"quoted\" } job"} 2
up{instance="a",job="x"} 1 1700000000000
up{instance="b",job="x"} 1
"#;

    const STATS: &str = r#"{"beat":{"info":{"uptime":{"ms":1}}},
        "libbeat":{"config":{"module":{"running":4,"starts":5,"stops":1}}}}"#;

    fn value(expr: &str, body: &str) -> Reading {
        StoppedWhen::parse(expr).unwrap().select(body.as_bytes())
    }

    #[test]
    fn a_sample_is_the_sum_of_the_series_whose_labels_include_the_matchers() {
        let cases = [
            (
                r#"prometheus_target_scrape_pool_targets{scrape_job="cluster"} == 0"#,
                0.0,
            ),
            (
                r#"prometheus_target_scrape_pool_targets{scrape_job="node"} == 0"#,
                3.0,
            ),
            (
                r#"prometheus_target_scrape_pool_targets{scrape_job="odd \"quoted\" } job"} == 0"#,
                2.0,
            ),
            ("prometheus_target_scrape_pool_targets == 0", 5.0),
            (r#"up{job="x"} == 0"#, 2.0),
            (r#"up{job="x",instance="b",} == 0"#, 1.0),
        ];
        for (expr, want) in cases {
            assert_eq!(value(expr, METRICS), Reading::Value(want), "{expr}");
        }
    }

    #[test]
    fn a_json_status_is_read_along_its_dotted_path() {
        let running = "libbeat.config.module.running <= before";
        assert_eq!(value(running, STATS), Reading::Value(4.0));
        assert_eq!(
            value("libbeat.config.module.stops == 1", STATS),
            Reading::Value(1.0)
        );
    }

    #[test]
    fn nothing_is_guessed_from_an_answer_without_the_number() {
        let unreadable = [
            (
                r#"prometheus_target_scrape_pool_targets{scrape_job="gone"} == 0"#,
                METRICS,
            ),
            ("libbeat.config.module.running == 0", METRICS),
            ("libbeat.config.module == 0", STATS),
            ("libbeat.config.module.missing == 0", STATS),
            (r#"up{job="x"} == 0"#, STATS),
            ("up == 0", "up not-a-number\n"),
            ("up == 0", "<html>503 Service Unavailable</html>"),
            ("up == 0", "up +Inf\n"),
            ("libbeat.x == 0", "{\"libbeat\": {\"x\": \"4\"}}"),
            ("libbeat.x == 0", "{truncated"),
        ];
        for (expr, body) in unreadable {
            assert!(
                matches!(value(expr, body), Reading::Unreadable(_)),
                "{expr} in {body:?}: {:?}",
                value(expr, body)
            );
        }
        assert!(matches!(
            StoppedWhen::parse("up == 0").unwrap().select(&[0xff, 0xfe]),
            Reading::Unreadable(_)
        ));
    }

    #[test]
    fn the_comparison_holds_only_as_written_and_before_only_once_read() {
        let le = StoppedWhen::parse("running <= before").unwrap();
        assert!(le.needs_before());
        assert_eq!(le.holds(3.0, None), None, "before was not read");
        assert_eq!(le.holds(3.0, Some(3.0)), Some(true));
        assert_eq!(le.holds(4.0, Some(3.0)), Some(false));
        let eq = StoppedWhen::parse("targets == 0").unwrap();
        assert!(!eq.needs_before());
        assert_eq!(eq.holds(0.0, None), Some(true));
        assert_eq!(eq.holds(1.0, None), Some(false));
        let lt = StoppedWhen::parse("x < 2").unwrap();
        assert_eq!(lt.holds(2.0, None), Some(false));
        assert_eq!(lt.holds(1.0, None), Some(true));
    }

    #[test]
    fn a_malformed_expression_is_refused_with_what_was_expected() {
        for bad in [
            "",
            "running",
            "running ==",
            "running => 0",
            "running == ten",
            "running == NaN",
            "running == inf",
            "a..b == 0",
            "9bad{a=\"b\"} == 0",
            "m{a=b} == 0",
            "m{a=\"b\" == 0",
            "m{a=\"b\"c=\"d\"} == 0",
        ] {
            assert!(StoppedWhen::parse(bad).is_err(), "{bad:?}");
        }
        let parsed = StoppedWhen::parse(r#"m{a="x y",b="\""} <= before"#).unwrap();
        assert_eq!(parsed.to_string(), r#"m{a="x y",b="\""} <= before"#);
    }
}
