//! One writer thread per DST: the blocking part of a copy (read SRC, write
//! the temporary file, fsync, rename, fsync of the directory) runs here, off
//! the event loop, so a slow disk never holds up a removal.
//!
//! A generation counter under a mutex (the *fence*) orders writes and
//! removals. A removal takes the fence only to bump the generation and
//! unlink, and so never waits for an fsync. A write remembers the generation
//! it was asked for; it fsyncs outside the fence, then takes the fence and
//! renames only if the generation is still the same, holding it through the
//! rename. So a write that began before a removal never lands after it: it
//! is dropped (and its temporary file with it).
//!
//! A removal reports what it found ([`Removal`]): removed, nothing there,
//! or *failed* — a copy that could not be unlinked may still be loaded, so
//! it is never reported as "nothing to remove". Every change (a rename, a
//! removal) bumps the change number the reloader follows ([`Changed`]).
//!
//! Test hook (debug builds only, absent from release builds): with
//! `LEADER_GATE_TEST_STALL_FSYNC=PATH` in the environment, every fsync of a
//! temporary file waits, after the real fsync, for as long as PATH exists —
//! a disk stuck on demand, which `tests/it/file_gate.rs` uses to show that a
//! removal does not queue behind a write.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::{Mapping, log, parent, sync_dir};
use crate::client::place::Place;

/// Says "something changed" to the reloader: bumps the change number (see
/// [`closing`](super::closing)). The writer says it while it still holds the
/// fence, right after its rename, so a reload that reads the new number was
/// sent after the change.
#[derive(Clone, Default)]
pub(super) struct Changed(pub(super) Option<Arc<tokio::sync::watch::Sender<u64>>>);

impl Changed {
    pub(super) fn changed(&self) {
        if let Some(changes) = &self.0 {
            changes.send_modify(|n| *n += 1);
        }
    }

    /// The current change number (0 without a reloader).
    pub(super) fn current(&self) -> u64 {
        self.0.as_ref().map_or(0, |changes| *changes.borrow())
    }
}

/// What [`Writer::remove`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// DST was there and is gone.
    Removed,
    /// Nothing was there.
    Absent,
    /// DST could not be removed: it may still be there.
    Failed,
}

/// The fsync of a temporary file: the step a slow disk makes slow.
pub(super) trait Disk: Send + Sync + 'static {
    fn sync_file(&self, file: &File) -> std::io::Result<()>;
}

/// The real disk (and, in debug builds, the test hook of the module docs).
pub(super) struct RealDisk {
    #[cfg(debug_assertions)]
    stall: Option<std::path::PathBuf>,
}

impl RealDisk {
    pub(super) fn new() -> Self {
        Self {
            #[cfg(debug_assertions)]
            stall: std::env::var_os("LEADER_GATE_TEST_STALL_FSYNC").map(Into::into),
        }
    }
}

impl Disk for RealDisk {
    fn sync_file(&self, file: &File) -> std::io::Result<()> {
        file.sync_all()?;
        #[cfg(debug_assertions)]
        if let Some(stall) = &self.stall
            && stall.exists()
        {
            log(&format!(
                "test hook: fsync stalled while {} exists",
                stall.display()
            ));
            while stall.exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            log("test hook: fsync released");
        }
        Ok(())
    }
}

/// The writer of one DST.
pub(super) struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    mapping: Mapping,
    /// The generation: bumped by every removal.
    fence: Mutex<u64>,
    jobs: Mutex<Jobs>,
    wake: Condvar,
    /// The last failed removal said, so a lasting one is said once.
    failing_removal: Mutex<Option<String>>,
    /// Attempts in a row that could not put a copy in place (SRC
    /// unreadable, DST not writable): 0 once a copy is there.
    failed_writes: AtomicU32,
}

#[derive(Default)]
struct Jobs {
    /// Put a current copy in place, for this generation only, with the
    /// Lease's shard substituted.
    write: Option<(u64, Option<Place>)>,
    /// fsync DST's directory (after a removal).
    sync_dir: bool,
    closed: bool,
    /// A job is being done.
    busy: bool,
}

/// What the writer thread remembers between jobs.
struct Memory {
    /// The content it renamed into place, and in which generation.
    written: Option<(u64, Vec<u8>)>,
    /// The last error said, so a lasting one is said once.
    complaint: Option<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// === impl Writer ===

impl Writer {
    pub(super) fn start(
        mapping: Mapping,
        mode: u32,
        changed: Changed,
        disk: Arc<dyn Disk>,
    ) -> Self {
        let shared = Arc::new(Shared {
            mapping,
            fence: Mutex::new(0),
            jobs: Mutex::default(),
            wake: Condvar::new(),
            failing_removal: Mutex::default(),
            failed_writes: AtomicU32::new(0),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("file-gate-writer".into())
                .spawn(move || shared.work(mode, &changed, &*disk))
                .expect("spawn a file-gate writer thread")
        };
        Self {
            shared,
            thread: Some(thread),
        }
    }

    /// Asks for a current copy at DST (for as long as no removal comes
    /// first); returns at once. A request still waiting is replaced.
    pub(super) fn ensure(&self, place: Option<&Place>) {
        let generation = *lock(&self.shared.fence);
        let mut jobs = lock(&self.shared.jobs);
        jobs.write = Some((generation, place.cloned()));
        self.shared.wake.notify_all();
    }

    /// Attempts in a row that could not put a copy at DST (0 once one is
    /// there).
    pub(super) fn failed_writes(&self) -> u32 {
        self.shared.failed_writes.load(Ordering::Relaxed)
    }

    /// Starts counting failed attempts anew (a new term).
    pub(super) fn forget_failures(&self) {
        self.shared.failed_writes.store(0, Ordering::Relaxed);
    }

    /// Removes DST now, whatever the writer is doing; what it found. No
    /// write asked for before lands after. A removal that failed is said
    /// once until it succeeds (the caller retries it).
    pub(super) fn remove(&self, why: &str) -> Removal {
        let dst = &self.shared.mapping.dst;
        let removed = {
            let mut generation = lock(&self.shared.fence);
            *generation += 1;
            // Not the temporary file: a write in progress owns it, and
            // drops it once it finds itself stale.
            std::fs::remove_file(dst)
        };
        let mut failing = lock(&self.shared.failing_removal);
        match removed {
            Ok(()) => {
                log(&format!("{why}: removed {}", dst.display()));
                *failing = None;
                let mut jobs = lock(&self.shared.jobs);
                jobs.sync_dir = true;
                self.shared.wake.notify_all();
                Removal::Removed
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if failing.take().is_some() {
                    log(&format!("{} is gone", dst.display()));
                }
                Removal::Absent
            }
            Err(error) => {
                let complaint = format!(
                    "cannot remove {}: {error}; trying again (no acknowledgement until it is gone)",
                    dst.display()
                );
                if failing.as_ref() != Some(&complaint) {
                    log(&complaint);
                    *failing = Some(complaint);
                }
                Removal::Failed
            }
        }
    }

    /// Lets the thread finish what it was asked, then waits for it.
    pub(super) fn finish(mut self) {
        lock(&self.shared.jobs).closed = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Waits until nothing is asked of the thread or in progress.
    #[cfg(test)]
    pub(super) fn wait_idle(&self) {
        let mut jobs = lock(&self.shared.jobs);
        while jobs.busy || jobs.write.is_some() || jobs.sync_dir {
            jobs = self
                .shared
                .wake
                .wait(jobs)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        lock(&self.shared.jobs).closed = true;
        self.shared.wake.notify_all();
    }
}

// === impl Shared ===

impl Shared {
    /// The writer thread: one job at a time, until closed and done.
    fn work(&self, mode: u32, changed: &Changed, disk: &dyn Disk) {
        let mut memory = Memory {
            written: None,
            complaint: None,
        };
        loop {
            let (write, sync) = {
                let mut jobs = lock(&self.jobs);
                jobs.busy = false;
                // Someone may wait for idleness (tests).
                self.wake.notify_all();
                while jobs.write.is_none() && !jobs.sync_dir && !jobs.closed {
                    jobs = self.wake.wait(jobs).unwrap_or_else(PoisonError::into_inner);
                }
                if jobs.write.is_none() && !jobs.sync_dir {
                    return;
                }
                jobs.busy = true;
                (jobs.write.take(), std::mem::take(&mut jobs.sync_dir))
            };
            if sync {
                let _ = sync_dir(parent(&self.mapping.dst));
            }
            if let Some((generation, place)) = write {
                self.write(generation, place.as_ref(), mode, changed, disk, &mut memory);
            }
        }
    }

    /// Puts a current copy of SRC (with `place` substituted) at DST unless
    /// it is there already, or a
    /// removal came after `generation` was asked for.
    fn write(
        &self,
        generation: u64,
        place: Option<&Place>,
        mode: u32,
        changed: &Changed,
        disk: &dyn Disk,
        memory: &mut Memory,
    ) {
        let mapping = &self.mapping;
        if *lock(&self.fence) != generation {
            return; // removed since: nothing to do
        }
        let content = match std::fs::read(&mapping.src) {
            Ok(content) => match place {
                Some(place) => place.substitute(&content),
                None => content,
            },
            Err(e) => {
                self.failed_writes.fetch_add(1, Ordering::Relaxed);
                return memory.complain(format!("cannot read {}: {e}", mapping.src.display()));
            }
        };
        let ours = memory
            .written
            .as_ref()
            .filter(|(g, _)| *g == generation)
            .map(|(_, c)| c);
        // What is on disk, not only what was written: someone may have
        // removed or changed the copy since.
        if ours == Some(&content) && std::fs::read(&mapping.dst).is_ok_and(|held| held == content) {
            memory.complaint = None;
            self.failed_writes.store(0, Ordering::Relaxed);
            return;
        }
        let what = if ours == Some(&content) {
            "restored (removed or changed by someone else)"
        } else {
            "wrote"
        };
        let temporary = mapping.temporary();
        let landed = write_temporary(mapping, &content, mode, disk).and_then(|()| {
            let current = lock(&self.fence);
            if *current != generation {
                return Ok(false);
            }
            std::fs::rename(&temporary, &mapping.dst)?;
            log(&format!("leading: {what} {}", mapping.dst.display()));
            changed.changed();
            Ok(true)
        });
        match landed {
            Ok(true) => {
                let _ = sync_dir(parent(&mapping.dst));
                memory.written = Some((generation, content));
                memory.complaint = None;
                self.failed_writes.store(0, Ordering::Relaxed);
            }
            Ok(false) => {
                let _ = std::fs::remove_file(&temporary);
                log(&format!(
                    "dropped a copy for {} written while leading: leadership ended before its rename",
                    mapping.dst.display()
                ));
            }
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                self.failed_writes.fetch_add(1, Ordering::Relaxed);
                memory.complain(format!("cannot write {}: {e}", mapping.dst.display()));
            }
        }
    }
}

impl Memory {
    fn complain(&mut self, complaint: String) {
        if self.complaint.as_ref() != Some(&complaint) {
            log(&complaint);
            self.complaint = Some(complaint);
        }
    }
}

/// The temporary file in DST's directory, whole and fsynced: a rename then
/// shows a reader the old file or the whole new one, never a part.
fn write_temporary(
    mapping: &Mapping,
    content: &[u8],
    mode: u32,
    disk: &dyn Disk,
) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(mapping.temporary())?;
    file.write_all(content)?;
    // The umask may have narrowed `mode`.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    disk.sync_file(&file)
}
