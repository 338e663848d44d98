//! The two exposition formats `/metrics` offers, and which one a scraper gets.
//!
//! prometheus-client writes only OpenMetrics. Prometheus asks for that, but
//! other scrapers and `promtool check metrics` read the classic text format
//! 0.0.4, where OpenMetrics' counter family `foo` (samples `foo_total`) is
//! invalid: its `# HELP`/`# TYPE` must name `foo_total`, and `# UNIT` and
//! `# EOF` do not exist. [`to_text_004`] rewrites exactly those lines of
//! prometheus-client's output; samples are the same text in both formats.
//! It relies on what prometheus-client writes (no exemplars: the registry
//! holds plain counters and histograms; help text without `\` or newlines).

use std::collections::HashMap;

/// An exposition format of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0, for scrapers that ask for it (Prometheus does).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4, for everyone else.
    Text004,
}

impl Format {
    /// The format for a request's `Accept` header(s), joined by commas
    /// (`None`: no header): OpenMetrics when `application/openmetrics-text`
    /// is asked for by name with a quality at least that of plain text.
    /// Wildcards alone (`*/*`) get the classic text, which every scraper reads.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let (mut openmetrics, mut text) = (0.0_f32, 0.0_f32);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut quality = Some(1.0);
            for param in parts {
                if let Some((key, value)) = param.split_once('=')
                    && key.trim().eq_ignore_ascii_case("q")
                {
                    // A malformed q ignores the range rather than guessing.
                    quality = value.trim().parse::<f32>().ok().filter(|q| q.is_finite());
                }
            }
            let Some(quality) = quality else { continue };
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics exposition as classic text 0.0.4:
/// counters' `# HELP`/`# TYPE` get the `_total` suffix their samples carry,
/// `info` becomes a `gauge` named `…_info` and `unknown` becomes `untyped`
/// (the 0.0.4 names of those types), `# UNIT` and `# EOF` are dropped.
/// Every other line is passed through unchanged.
pub fn to_text_004(openmetrics: &str) -> String {
    // prometheus-client writes `# HELP` before `# TYPE`, so learn every
    // family's type first.
    let types: HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_once(' '))
        .collect();
    let classic = |family: &str| -> (String, &'static str) {
        match types.get(family).copied() {
            Some("counter") => (format!("{family}_total"), "counter"),
            Some("info") => (format!("{family}_info"), "gauge"),
            Some("gauge") => (family.to_owned(), "gauge"),
            Some("histogram") => (family.to_owned(), "histogram"),
            _ => (family.to_owned(), "untyped"),
        }
    };
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            text.push_str(&format!("# HELP {} {help}\n", classic(family).0));
        } else if let Some((family, _)) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.split_once(' '))
        {
            let (name, kind) = classic(family);
            text.push_str(&format!("# TYPE {name} {kind}\n"));
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus 2.42's scrape `Accept` header, verbatim.
    const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn a_counter_family_is_named_with_its_total_suffix() {
        let om = "# HELP jobs_done Jobs done.\n# TYPE jobs_done counter\njobs_done_total{kind=\"a\"} 3\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP jobs_done_total Jobs done.\n# TYPE jobs_done_total counter\njobs_done_total{kind=\"a\"} 3\n"
        );
    }

    #[test]
    fn a_gauge_is_unchanged_and_eof_is_dropped() {
        let om = "# HELP up 1 while up (NaN: unknown).\n# TYPE up gauge\nup NaN\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP up 1 while up (NaN: unknown).\n# TYPE up gauge\nup NaN\n"
        );
    }

    #[test]
    fn a_histogram_with_a_unit_loses_only_its_unit_line() {
        let om = concat!(
            "# HELP rtt_seconds Round trips.\n",
            "# TYPE rtt_seconds histogram\n",
            "# UNIT rtt_seconds seconds\n",
            "rtt_seconds_sum 0.25\n",
            "rtt_seconds_count 2\n",
            "rtt_seconds_bucket{le=\"0.1\"} 1\n",
            "rtt_seconds_bucket{le=\"+Inf\"} 2\n",
            "# EOF\n",
        );
        assert_eq!(
            to_text_004(om),
            concat!(
                "# HELP rtt_seconds Round trips.\n",
                "# TYPE rtt_seconds histogram\n",
                "rtt_seconds_sum 0.25\n",
                "rtt_seconds_count 2\n",
                "rtt_seconds_bucket{le=\"0.1\"} 1\n",
                "rtt_seconds_bucket{le=\"+Inf\"} 2\n",
            )
        );
    }

    #[test]
    fn a_gauge_with_a_unit_loses_only_its_unit_line() {
        let om = "# HELP age_seconds Age.\n# TYPE age_seconds gauge\n# UNIT age_seconds seconds\nage_seconds 1.5\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP age_seconds Age.\n# TYPE age_seconds gauge\nage_seconds 1.5\n"
        );
    }

    #[test]
    fn info_and_unknown_get_their_classic_types() {
        let om = "# HELP build Build.\n# TYPE build info\nbuild_info{v=\"1\"} 1\n# HELP odd Odd.\n# TYPE odd unknown\nodd 2\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP build_info Build.\n# TYPE build_info gauge\nbuild_info{v=\"1\"} 1\n# HELP odd Odd.\n# TYPE odd untyped\nodd 2\n"
        );
    }

    #[test]
    fn only_the_family_name_in_help_is_rewritten() {
        // The help text mentions the family name and the word counter.
        let om = "# HELP hits hits counter, see hits\n# TYPE hits counter\nhits_total 1\n# EOF\n";
        assert!(to_text_004(om).starts_with("# HELP hits_total hits counter, see hits\n"));
    }

    #[test]
    fn prometheus_and_explicit_openmetrics_get_openmetrics() {
        for accept in [
            PROMETHEUS_ACCEPT,
            "application/openmetrics-text",
            "Application/OpenMetrics-Text; version=1.0.0",
            "text/plain;q=0.5, application/openmetrics-text",
            "text/plain, application/openmetrics-text",
        ] {
            assert_eq!(
                Format::negotiate(Some(accept)),
                Format::OpenMetrics,
                "{accept}"
            );
        }
    }

    #[test]
    fn anything_else_gets_the_classic_text() {
        for accept in [
            None,
            Some(""),
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/json"),
            Some("text/plain, application/openmetrics-text;q=0.5"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=bogus"),
        ] {
            assert_eq!(Format::negotiate(accept), Format::Text004, "{accept:?}");
        }
    }
}
