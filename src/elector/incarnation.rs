//! The pod-local proof that lets a restarted sidecar resume its own term
//! (`--state-dir`, an `emptyDir`): after every write of its own that the API
//! server stored, the sidecar records it there; a process started later in
//! the same pod reads it back and may take that write as its own.
//!
//! A name alone proves nothing (a twin with the same identity would lead
//! too); the record proves a write only together with:
//! - **the lock**: an exclusive `flock` on `DIR/lock`, held for the life of
//!   the process and dropped by the kernel when it dies. Taking it shows
//!   that the process that wrote the record is gone; failing to take it
//!   means another live process uses the directory (refused: exit 64).
//! - **the boot clock**: the record is ignored unless it was written on this
//!   very boot clock (the kernel's boot id and this time namespace's offset,
//!   [`crate::clock::boot_clock_id`]): its deadline is read on that clock.
//! - **the content**: identity, Lease namespace and name must be this
//!   process's; the Lease must still show the recorded write exactly (uid,
//!   `renewTime`, writer mark), which the election checks.
//! - **the timing**: the renew deadline and gate lag the record was written
//!   under must be this process's ([`Timing`]). The resumed write's
//!   validity, and the end of what the previous process's gates may still
//!   run, are counted from them: a restart into a new image or new flags
//!   with a shorter one would count either short.
//!
//! The file is replaced by a rename (a reader sees the old record or the new
//! one, never a torn one), without fsync: it needs to outlive a process, not
//! a node. A record that cannot be read is reported and ignored.
//!
//! Writing it is no business of the election's loop: a volume that hangs (a
//! stuck network disk, a FIFO in place of the temporary file) would stall
//! every renew, step-down and HTTP answer of the sidecar with it. The
//! records go to a thread of their own ([`RecordWriter`]) through a slot
//! where the newest value wins, so the loop never waits on the disk. A
//! record left stale by that costs only a resumption, never safety: the
//! Lease must still show the exact write recorded for it to count.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{BootInstant, boot_clock_id};

const LOCK: &str = "lock";
/// 2: with the [`Timing`] (1 had none: not resumed, once, after an upgrade).
const FORMAT: u32 = 2;

/// One write of ours that the API server stored, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub identity: String,
    pub namespace: String,
    pub lease: String,
    pub uid: String,
    /// The writer mark of the process that wrote it.
    pub writer: String,
    /// The `renewTime` it wrote, in microseconds.
    pub renew_micros: i64,
    /// The `leaseTransitions` it wrote: its term.
    pub transitions: i64,
    /// When it was sent, on the boot clock (milliseconds).
    pub sent_boot_ms: u64,
}

impl Recorded {
    /// When it was sent, on this boot clock.
    pub fn sent_boot(&self) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(self.sent_boot_ms))
    }
}

/// The timing a term is judged under, by the process that leads it: a
/// record counts only for a process with the same. Either one shorter than
/// the previous process's would be unsafe (the resumed write's validity, or
/// the unknown gates' end, counted short), and a longer renew deadline
/// would trust the write beyond what the previous process's margins cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub renew_deadline: Duration,
    pub gate_lag: Duration,
}

/// The file's content: the record, the boot clock it was made on and the
/// timing it was judged under (in nanoseconds: compared exactly; absent
/// from an older version's record, which the format then refuses).
#[derive(Serialize, Deserialize)]
struct File2 {
    format: u32,
    boot_clock: String,
    #[serde(default)]
    renew_deadline_ns: Option<u64>,
    #[serde(default)]
    gate_lag_ns: Option<u64>,
    #[serde(flatten)]
    write: Recorded,
}

/// Why `--state-dir` cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error(
        "{0} is in use by another running leader-gate process: give each sidecar its own state directory"
    )]
    InUse(PathBuf),
}

/// The directory, locked for this process.
#[derive(Debug)]
pub struct StateDir {
    file: PathBuf,
    timing: Timing,
    _lock: File,
}

impl StateDir {
    /// Locks `dir` (creating it and its lock file if needed) for the record
    /// of Lease `namespace/lease`, led under `timing`.
    pub fn open(
        dir: &Path,
        namespace: &str,
        lease: &str,
        timing: Timing,
    ) -> Result<Self, StateDirError> {
        let open_error = |source| StateDirError::Open {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(open_error)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))
            .map_err(open_error)?;
        // SAFETY: flock(2) on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EWOULDBLOCK) => StateDirError::InUse(dir.to_path_buf()),
                _ => open_error(error),
            });
        }
        if boot_clock_id().is_none() {
            tracing::warn!(dir = %dir.display(), "this system has no boot id: --state-dir cannot prove a previous process's write, so a restart will not resume its term");
        }
        Ok(Self {
            file: dir.join(format!("term-{namespace}.{lease}.json")),
            timing,
            _lock: lock,
        })
    }

    /// The write a previous process of `identity` recorded on this boot
    /// clock, if any; anything else found is reported and ignored.
    pub fn previous(&self, identity: &str, namespace: &str, lease: &str) -> Option<Recorded> {
        let text = match std::fs::read_to_string(&self.file) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(file = %self.file.display(), %error, "cannot read the state file; not resuming");
                return None;
            }
        };
        let found: File2 = match serde_json::from_str(&text) {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(file = %self.file.display(), %error, "the state file is unreadable; not resuming");
                return None;
            }
        };
        let why_not = if found.format != FORMAT {
            Some("it has another format (another version's)")
        } else if Some(found.boot_clock.as_str()) != boot_clock_id() {
            Some(
                "it was written on another boot clock (the node rebooted, or another time namespace)",
            )
        } else if (found.renew_deadline_ns, found.gate_lag_ns) != nanos(self.timing) {
            let (renew_deadline, gate_lag) = (self.timing.renew_deadline, self.timing.gate_lag);
            tracing::info!(
                file = %self.file.display(),
                recorded_renew_deadline_ns = found.renew_deadline_ns,
                recorded_gate_lag_ns = found.gate_lag_ns,
                ?renew_deadline,
                ?gate_lag,
                "not resuming from the state file: it was written under another --renew-deadline or --gate-lag"
            );
            return None;
        } else if found.write.identity != identity
            || found.write.namespace != namespace
            || found.write.lease != lease
        {
            Some("it is another identity's or another Lease's")
        } else {
            None
        };
        if let Some(why_not) = why_not {
            tracing::info!(file = %self.file.display(), "not resuming from the state file: {why_not}");
            return None;
        }
        Some(found.write)
    }

    /// Records `write`, replacing the previous record.
    pub fn record(&self, write: &Recorded) -> io::Result<()> {
        let Some(boot_clock) = boot_clock_id() else {
            return Ok(()); // no boot clock to prove anything on
        };
        let (renew_deadline_ns, gate_lag_ns) = nanos(self.timing);
        let content = File2 {
            format: FORMAT,
            boot_clock: boot_clock.to_owned(),
            renew_deadline_ns,
            gate_lag_ns,
            write: write.clone(),
        };
        let temporary = self.file.with_extension("json.tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(&serde_json::to_vec(&content).expect("a record serializes"))?;
        drop(file);
        std::fs::rename(&temporary, &self.file)
    }

    /// Forgets the record (the term was released: nothing to resume).
    pub fn clear(&self) -> io::Result<()> {
        match std::fs::remove_file(&self.file) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// `timing` as recorded: whole nanoseconds, as the flags were parsed.
fn nanos(timing: Timing) -> (Option<u64>, Option<u64>) {
    let ns = |d: Duration| Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    (ns(timing.renew_deadline), ns(timing.gate_lag))
}

/// Where the writer thread puts what it is given: a record, or its removal.
pub trait RecordSink: Send + 'static {
    fn record(&self, write: &Recorded) -> io::Result<()>;
    fn clear(&self) -> io::Result<()>;
    /// Named in the writer's log.
    fn describe(&self) -> String;
}

impl RecordSink for StateDir {
    fn record(&self, write: &Recorded) -> io::Result<()> {
        StateDir::record(self, write)
    }

    fn clear(&self) -> io::Result<()> {
        StateDir::clear(self)
    }

    fn describe(&self) -> String {
        self.file.display().to_string()
    }
}

/// What the writer thread is to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    Record(Box<Recorded>),
    Clear,
}

/// The slot between the election and the writer thread: only the newest
/// value is kept, so a writer that hangs holds one record at most.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    wake: Condvar,
}

#[derive(Default)]
struct SlotState {
    next: Option<Pending>,
    /// The writer was dropped: write what is pending, then end.
    closed: bool,
}

/// Writes the state record off the election's thread: [`RecordWriter::record`]
/// and [`RecordWriter::clear`] never wait on the disk; a thread of its own
/// (`state-dir-writer`) writes the newest value given, and the ones given
/// while it was busy are skipped (each replaces the one before).
/// Dropping it lets the thread write what is pending and end; nothing waits
/// for that (a hung volume must not hang the shutdown either).
pub struct RecordWriter {
    slot: Arc<Slot>,
}

// === impl RecordWriter ===

impl RecordWriter {
    /// Starts the writer thread for `sink`.
    pub fn spawn(sink: impl RecordSink) -> io::Result<Self> {
        let slot = Arc::new(Slot::default());
        let theirs = slot.clone();
        std::thread::Builder::new()
            .name("state-dir-writer".into())
            .spawn(move || write_until_closed(&theirs, &sink))?;
        Ok(Self { slot })
    }

    /// Records `write` (replacing whatever was not written yet).
    pub fn record(&self, write: &Recorded) {
        self.put(Pending::Record(Box::new(write.clone())));
    }

    /// Forgets the record (replacing whatever was not written yet).
    pub fn clear(&self) {
        self.put(Pending::Clear);
    }

    fn put(&self, next: Pending) {
        let mut state = self.slot.state.lock().expect("state writer lock");
        state.next = Some(next);
        drop(state);
        self.slot.wake.notify_one();
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        if let Ok(mut state) = self.slot.state.lock() {
            state.closed = true;
        }
        self.slot.wake.notify_one();
    }
}

/// The writer thread: takes the newest value, writes it, and again, until
/// the writer is dropped and nothing is pending. A failure is said once at
/// WARN (then at debug): it costs only the resumption after a restart.
fn write_until_closed(slot: &Slot, sink: &impl RecordSink) {
    let mut said = false;
    loop {
        let next = {
            let mut state = slot.state.lock().expect("state writer lock");
            loop {
                if let Some(next) = state.next.take() {
                    break next;
                }
                if state.closed {
                    return;
                }
                state = slot.wake.wait(state).expect("state writer lock");
            }
        };
        let result = match &next {
            Pending::Record(write) => sink.record(write),
            Pending::Clear => sink.clear(),
        };
        if let Err(error) = result {
            if !std::mem::replace(&mut said, true) {
                tracing::warn!(file = %sink.describe(), %error, "cannot write the state directory: a restart will not resume the term");
            } else {
                tracing::debug!(file = %sink.describe(), %error, "cannot write the state directory");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write() -> Recorded {
        Recorded {
            identity: "pod-0".into(),
            namespace: "monitoring".into(),
            lease: "metrics".into(),
            uid: "5f1c".into(),
            writer: "00000000000000aa".into(),
            renew_micros: 1_764_000_000_000_000,
            transitions: 3,
            sent_boot_ms: 12_345,
        }
    }

    const TIMING: Timing = Timing {
        renew_deadline: Duration::from_secs(10),
        gate_lag: Duration::from_secs(12),
    };

    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("leader-gate-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_recorded_write_is_read_back_by_the_next_process_of_the_same_identity() {
        let dir = dir("roundtrip");
        let state = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        assert_eq!(state.previous("pod-0", "monitoring", "metrics"), None);
        state.record(&write()).unwrap();
        drop(state); // the process ends: the lock goes with it
        let state = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        assert_eq!(
            state.previous("pod-0", "monitoring", "metrics"),
            Some(write())
        );
        assert_eq!(
            state.previous("pod-1", "monitoring", "metrics"),
            None,
            "another identity"
        );
        assert_eq!(
            state.previous("pod-0", "monitoring", "other"),
            None,
            "another Lease"
        );
        state.clear().unwrap();
        assert_eq!(state.previous("pod-0", "monitoring", "metrics"), None);
    }

    #[test]
    fn a_directory_in_use_by_a_live_process_is_refused() {
        let dir = dir("in-use");
        let held = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        let error = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap_err();
        assert!(matches!(error, StateDirError::InUse(_)), "{error}");
        drop(held);
        StateDir::open(&dir, "monitoring", "metrics", TIMING).expect("free again");
    }

    /// A disk that takes each operation only when the test says so: what
    /// it was asked to write, in order; dropped when the thread ends.
    struct SlowDisk {
        written: Arc<Mutex<Vec<Pending>>>,
        entered: std::sync::mpsc::Sender<()>,
        go: Mutex<std::sync::mpsc::Receiver<()>>,
        ended: std::sync::mpsc::Sender<()>,
    }

    impl SlowDisk {
        fn take(&self, pending: Pending) -> io::Result<()> {
            let _ = self.entered.send(());
            let _ = self.go.lock().unwrap().recv();
            self.written.lock().unwrap().push(pending);
            Ok(())
        }
    }

    impl RecordSink for SlowDisk {
        fn record(&self, write: &Recorded) -> io::Result<()> {
            self.take(Pending::Record(Box::new(write.clone())))
        }

        fn clear(&self) -> io::Result<()> {
            self.take(Pending::Clear)
        }

        fn describe(&self) -> String {
            "a slow disk".into()
        }
    }

    impl Drop for SlowDisk {
        fn drop(&mut self) {
            let _ = self.ended.send(());
        }
    }

    struct Harness {
        writer: Option<RecordWriter>,
        written: Arc<Mutex<Vec<Pending>>>,
        entered: std::sync::mpsc::Receiver<()>,
        go: std::sync::mpsc::Sender<()>,
        ended: std::sync::mpsc::Receiver<()>,
    }

    const WAIT: Duration = Duration::from_secs(5);

    fn slow_disk() -> Harness {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let (ended_tx, ended) = std::sync::mpsc::channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let disk = SlowDisk {
            written: written.clone(),
            entered: entered_tx,
            go: Mutex::new(go_rx),
            ended: ended_tx,
        };
        Harness {
            writer: Some(RecordWriter::spawn(disk).unwrap()),
            written,
            entered,
            go,
            ended,
        }
    }

    impl Harness {
        fn writer(&self) -> &RecordWriter {
            self.writer.as_ref().unwrap()
        }

        /// Lets every operation through, drops the writer and waits for
        /// its thread to end: what was written, in order.
        fn finish(mut self) -> Vec<Pending> {
            drop(self.writer.take());
            loop {
                let _ = self.go.send(());
                if self.ended.recv_timeout(Duration::from_millis(20)).is_ok() {
                    break;
                }
            }
            self.written.lock().unwrap().clone()
        }
    }

    fn term(transitions: i64) -> Recorded {
        Recorded {
            transitions,
            ..write()
        }
    }

    fn recorded(transitions: i64) -> Pending {
        Pending::Record(Box::new(term(transitions)))
    }

    #[test]
    fn a_hung_disk_never_holds_the_election_and_the_newest_record_wins() {
        let disk = slow_disk();
        disk.writer().record(&term(1));
        disk.entered.recv_timeout(WAIT).expect("the thread writes");
        // The disk hangs in that write; the election goes on, never waiting.
        let started = std::time::Instant::now();
        for transitions in 2..100 {
            disk.writer().record(&term(transitions));
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        disk.go.send(()).unwrap();
        disk.entered.recv_timeout(WAIT).expect("the next write");
        // Only the newest of those given while it hung was written.
        assert_eq!(disk.finish(), [recorded(1), recorded(99)]);
    }

    #[test]
    fn a_clear_given_after_a_record_is_what_remains() {
        let disk = slow_disk();
        disk.writer().record(&term(1));
        disk.entered.recv_timeout(WAIT).unwrap();
        disk.writer().record(&term(2));
        disk.writer().clear();
        assert_eq!(disk.finish(), [recorded(1), Pending::Clear]);
        // And a record given after a clear replaces it.
        let disk = slow_disk();
        disk.writer().clear();
        disk.entered.recv_timeout(WAIT).unwrap();
        disk.writer().clear();
        disk.writer().record(&term(3));
        assert_eq!(disk.finish(), [Pending::Clear, recorded(3)]);
    }

    #[test]
    fn what_is_pending_when_the_writer_is_dropped_is_still_written() {
        let disk = slow_disk();
        disk.writer().record(&term(1));
        disk.entered.recv_timeout(WAIT).unwrap();
        disk.writer().clear();
        assert_eq!(disk.finish(), [recorded(1), Pending::Clear]);
    }

    #[test]
    fn a_torn_or_foreign_record_is_ignored() {
        let dir = dir("torn");
        let state = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        state.record(&write()).unwrap();
        let text = std::fs::read_to_string(&state.file).unwrap();
        std::fs::write(&state.file, &text[..text.len() / 2]).unwrap();
        assert_eq!(
            state.previous("pod-0", "monitoring", "metrics"),
            None,
            "torn"
        );
        let other_boot = text.replace(boot_clock_id().unwrap(), "another-boot");
        std::fs::write(&state.file, other_boot).unwrap();
        assert_eq!(
            state.previous("pod-0", "monitoring", "metrics"),
            None,
            "another boot"
        );
    }

    #[test]
    fn a_record_written_under_other_timing_is_not_resumed() {
        let dir = dir("timing");
        let state = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        state.record(&write()).unwrap();
        drop(state);
        let others = [
            Timing {
                renew_deadline: Duration::from_secs(5),
                ..TIMING
            },
            Timing {
                gate_lag: Duration::from_secs(4),
                ..TIMING
            },
            Timing {
                renew_deadline: Duration::from_secs(12),
                ..TIMING
            },
            // Less than a millisecond shorter is shorter too.
            Timing {
                gate_lag: TIMING.gate_lag - Duration::from_micros(500),
                ..TIMING
            },
        ];
        for timing in others {
            let state = StateDir::open(&dir, "monitoring", "metrics", timing).unwrap();
            assert_eq!(
                state.previous("pod-0", "monitoring", "metrics"),
                None,
                "{timing:?}"
            );
        }
        let state = StateDir::open(&dir, "monitoring", "metrics", TIMING).unwrap();
        assert_eq!(
            state.previous("pod-0", "monitoring", "metrics"),
            Some(write()),
            "the same timing"
        );
        // A record of format 1, as the version before wrote it (no timing),
        // is refused for its format, not as unreadable.
        let text = std::fs::read_to_string(&state.file).unwrap();
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old["format"] = 1.into();
        let fields = old.as_object_mut().unwrap();
        assert!(
            fields.remove("renew_deadline_ns").is_some() && fields.remove("gate_lag_ns").is_some()
        );
        std::fs::write(&state.file, old.to_string()).unwrap();
        let found: File2 = serde_json::from_str(&std::fs::read_to_string(&state.file).unwrap())
            .expect("an older version's record reads");
        assert_eq!((found.format, found.gate_lag_ns), (1, None));
        assert_eq!(state.previous("pod-0", "monitoring", "metrics"), None);
    }
}
