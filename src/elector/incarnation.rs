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
//!
//! The file is replaced by a rename (a reader sees the old record or the new
//! one, never a torn one), without fsync: it needs to outlive a process, not
//! a node. A record that cannot be read is reported and ignored.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{BootInstant, boot_clock_id};

const LOCK: &str = "lock";
const FORMAT: u32 = 1;

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

/// The file's content: the record and the boot clock it was made on.
#[derive(Serialize, Deserialize)]
struct File1 {
    format: u32,
    boot_clock: String,
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
    _lock: File,
}

impl StateDir {
    /// Locks `dir` (creating it and its lock file if needed) for the record
    /// of Lease `namespace/lease`.
    pub fn open(dir: &Path, namespace: &str, lease: &str) -> Result<Self, StateDirError> {
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
        let found: File1 = match serde_json::from_str(&text) {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(file = %self.file.display(), %error, "the state file is unreadable; not resuming");
                return None;
            }
        };
        let why_not = if found.format != FORMAT {
            Some("it has another format")
        } else if Some(found.boot_clock.as_str()) != boot_clock_id() {
            Some(
                "it was written on another boot clock (the node rebooted, or another time namespace)",
            )
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
        let content = File1 {
            format: FORMAT,
            boot_clock: boot_clock.to_owned(),
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

    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("leader-gate-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_recorded_write_is_read_back_by_the_next_process_of_the_same_identity() {
        let dir = dir("roundtrip");
        let state = StateDir::open(&dir, "monitoring", "metrics").unwrap();
        assert_eq!(state.previous("pod-0", "monitoring", "metrics"), None);
        state.record(&write()).unwrap();
        drop(state); // the process ends: the lock goes with it
        let state = StateDir::open(&dir, "monitoring", "metrics").unwrap();
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
        let held = StateDir::open(&dir, "monitoring", "metrics").unwrap();
        let error = StateDir::open(&dir, "monitoring", "metrics").unwrap_err();
        assert!(matches!(error, StateDirError::InUse(_)), "{error}");
        drop(held);
        StateDir::open(&dir, "monitoring", "metrics").expect("free again");
    }

    #[test]
    fn a_torn_or_foreign_record_is_ignored() {
        let dir = dir("torn");
        let state = StateDir::open(&dir, "monitoring", "metrics").unwrap();
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
}
