//! Clocks. The election runs on tokio's monotonic `Instant` (so tests can
//! pause time); readers of the published state check validity on the boot
//! clock, which keeps counting through suspend, and Lease timestamps are
//! formatted from the wall clock, which is written for humans and never
//! compared with (G3).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

/// A reading of `CLOCK_BOOTTIME` (Linux), which unlike `CLOCK_MONOTONIC`
/// advances while the machine is suspended: a deadline measured on it cannot
/// be outlived by a frozen process that wakes up and answers from memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

// === impl BootInstant ===

impl BootInstant {
    pub fn now() -> Self {
        Self(boot_clock())
    }

    /// The instant `since_boot` after boot: for tests that drive a clock.
    pub const fn from_since_boot(since_boot: Duration) -> Self {
        Self(since_boot)
    }

    /// The boot-clock instant `after` from now.
    pub fn after(after: Duration) -> Self {
        Self::now().plus(after)
    }

    pub fn plus(self, after: Duration) -> Self {
        Self(self.0 + after)
    }

    /// Milliseconds on the boot clock, for lock-free sharing.
    pub fn as_millis(self) -> u64 {
        self.0.as_millis() as u64
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time left until `self`, zero once it has passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_sub(boot_clock())
    }
}

#[cfg(target_os = "linux")]
fn boot_clock() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux this runs on, and the call cannot fail with valid arguments.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn boot_clock() -> Duration {
    // Elsewhere the best available clock is the monotonic one.
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

/// Which boot clock [`BootInstant`] readings belong to, so another process
/// can tell whether a deadline on it is comparable with its own clock: the
/// kernel's boot id (`/proc/sys/kernel/random/boot_id`, the same for every
/// container on the node), read once, with the boot-clock offset of this
/// process's time namespace appended when it is not zero (two processes in
/// different time namespaces read different `CLOCK_BOOTTIME`s). `None` when
/// the boot id cannot be read (not Linux): then no deadline is shared.
pub fn boot_clock_id() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let boot_id = boot_id.trim();
        if boot_id.is_empty() {
            return None;
        }
        let offset = std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| boottime_offset(&text));
        Some(match offset {
            Some(offset) => format!("{boot_id}+{offset}"),
            None => boot_id.to_owned(),
        })
    })
    .as_deref()
}

/// The `boottime` line of `/proc/self/timens_offsets` (`boottime <s> <ns>`),
/// if it is not zero.
fn boottime_offset(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("boottime"))?;
    let mut fields = line.split_whitespace().skip(1);
    let (secs, nanos) = (fields.next()?, fields.next()?);
    (secs != "0" || nanos != "0").then(|| format!("{secs}.{nanos}"))
}

/// Microseconds since the Unix epoch, as a Kubernetes `MicroTime` holds them.
pub fn wall_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Formats microseconds since the epoch as a Kubernetes `MicroTime`
/// (`2026-11-29T17:26:29.727769Z`, always six fractional digits).
pub fn format_micro_time(micros: i64) -> String {
    let ts = Timestamp::from_microsecond(micros).unwrap_or(Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// Parses an RFC 3339 timestamp to microseconds since the epoch.
pub fn parse_micro_time(text: &str) -> Option<i64> {
    text.parse::<Timestamp>()
        .ok()
        .map(Timestamp::as_microsecond)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_round_trips_with_six_digits() {
        let text = "2026-11-29T17:26:29.727769Z";
        let micros = parse_micro_time(text).unwrap();
        assert_eq!(format_micro_time(micros), text);
        assert_eq!(
            format_micro_time(parse_micro_time("2026-11-29T17:26:29Z").unwrap()),
            "2026-11-29T17:26:29.000000Z"
        );
    }

    #[test]
    fn the_boot_clock_id_is_the_kernels_boot_id_read_once() {
        let id = boot_clock_id().expect("Linux has a boot id");
        let kernel = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert!(id.starts_with(kernel.trim()), "{id}");
        assert_eq!(boot_clock_id().map(str::as_ptr), Some(id.as_ptr()));
        assert_eq!(boottime_offset("monotonic 0 0\nboottime 0 0\n"), None);
        assert_eq!(
            boottime_offset("monotonic 0 0\nboottime -5 100\n").as_deref(),
            Some("-5.100")
        );
    }

    #[test]
    fn boot_clock_moves_forward() {
        let deadline = BootInstant::after(Duration::from_secs(60));
        assert!(deadline > BootInstant::now());
        assert!(deadline.remaining() <= Duration::from_secs(60));
        assert!(deadline.remaining() > Duration::from_secs(59));
    }
}
