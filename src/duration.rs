//! Durations as people write them: [`parse_duration`] reads the flags'
//! `15s`, `1500ms`, `1m30s`, and [`HumanDuration`] prints a duration back
//! the same way (`2s`, `1m30s`, `250ms`) in messages.

use std::fmt;
use std::time::Duration;

/// Parses `15s`, `1500ms`, `2m`, `1m30s`, `0.5s`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{text:?} lacks a unit (ms, s, m, h)"))?;
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 15s, 500ms or 1m"))?;
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "{text:?} has an unknown unit {unit:?} (use ms, s, m or h)"
                ));
            }
        };
        total = Duration::try_from_secs_f64(value * scale)
            .ok()
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("{text:?} is too long a duration"))?;
        rest = tail;
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    Ok(total)
}

/// Prints a duration as [`parse_duration`] reads it and people write it:
/// hours, minutes and seconds with zero parts left out (`1h`, `1m30s`,
/// `1.5s`), below a second in milliseconds (`250ms`, `0.5ms`), `0s` for
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        let nanos = duration.subsec_nanos();
        if duration.is_zero() {
            return f.write_str("0s");
        }
        if duration < Duration::from_secs(1) {
            write!(f, "{}", nanos / 1_000_000)?;
            write_fraction(f, nanos % 1_000_000, 6)?;
            return f.write_str("ms");
        }
        let seconds = duration.as_secs();
        let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        if seconds > 0 || nanos > 0 {
            write!(f, "{seconds}")?;
            write_fraction(f, nanos, 9)?;
            f.write_str("s")?;
        }
        Ok(())
    }
}

/// `.` and the `digits` digits of `part`, trailing zeros dropped; nothing for 0.
fn write_fraction(f: &mut fmt::Formatter<'_>, part: u32, digits: usize) -> fmt::Result {
    if part == 0 {
        return Ok(());
    }
    let text = format!("{part:0digits$}");
    write!(f, ".{}", text.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_parse_in_the_usual_units() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
        // No overflow panic on absurd input: an error naming it.
        assert!(parse_duration("18446744073709551615s18446744073709551615s").is_err());
    }

    #[test]
    fn durations_print_as_people_write_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(500), "0.5ms"),
            (Duration::from_nanos(1), "0.000001ms"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(4800), "4.8s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(86_400), "24h"),
            (Duration::from_millis(3_661_250), "1h1m1.25s"),
            (Duration::new(60, 1), "1m0.000000001s"),
        ];
        for (duration, text) in cases {
            assert_eq!(HumanDuration(duration).to_string(), text, "{duration:?}");
        }
    }

    proptest! {
        /// What is printed reads back as the same duration (to the
        /// millisecond, the finest the flags are written in).
        #[test]
        fn a_printed_duration_parses_back(millis in 0u64..10_000_000_000) {
            let duration = Duration::from_millis(millis);
            let text = HumanDuration(duration).to_string();
            prop_assert_eq!(parse_duration(&text), Ok(duration), "{}", text);
        }
    }
}
