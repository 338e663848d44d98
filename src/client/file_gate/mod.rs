//! `leader-gate file-gate SRC:DST…`: files that exist only while this pod
//! leads, for collectors that live-reload a directory (Metricbeat
//! `config.modules` with `reload.enabled`, Prometheus `file_sd_configs`).
//!
//! While the validity rule of [`feed`] says leading, a copy of each SRC is at
//! its DST, written atomically (a temporary file in DST's directory, fsync,
//! rename, fsync of the directory) with the Lease's shard substituted (see
//! [`place`](crate::client::place)), and rewritten when SRC changes or the
//! copy was removed or changed by someone else (checked at every renewal).
//! That blocking I/O runs in a [`writer`] thread per DST, never on the event
//! loop: a removal never queues behind a write or waits for an fsync, and a
//! write that began before a removal never lands after it (a generation
//! fence). Each DST is removed the moment leadership ends or can no longer be
//! confirmed — also when the sidecar dies without a word, since validity
//! then runs out — and at start-up, before anything else (a stale copy from
//! a killed run), and on SIGTERM/SIGINT. If the gate itself is killed
//! (SIGKILL, OOM), a [`death_guard`](crate::client::death_guard) removes the
//! copies within milliseconds — unless the gate is its container's PID 1
//! (then the kernel kills the guard with it, and the copy goes at the
//! container's restart: run it under an init, or share the pod's process
//! namespace). With `--reload-url` one HTTP POST
//! follows every change, in order (Prometheus `/-/reload`, Fluent Bit,
//! Vector); it is sent from a task of its own, so a collector slow to answer
//! never delays a removal.
//!
//! `file-gate` is a registered gate ([`Feed::registered`]). With a reload
//! URL, once every copy of a term is removed, the reload after it answered,
//! and the sidecar said the term stopped — or on SIGTERM, once the same is
//! done — it acknowledges the term, so the sidecar's graceful release need
//! not wait out its gate lag. Without one it never acknowledges: the
//! collector finds a removal at its own reload period, which only the whole
//! gate lag covers.
//!
//! [`feed`]: crate::client::feed

mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::client::death_guard::{Guard, OnDeath};
use crate::client::feed::Feed;
use crate::client::place::Place;
use crate::client::url::GateUrl;
use writer::{Changed, Disk, RealDisk, Reload, Writer};

/// How long a reload POST may take.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutting down waits for the writers (a write stuck on the disk
/// is dropped anyway: its DST was removed first).
const WRITER_FINISH_TIMEOUT: Duration = Duration::from_secs(2);

/// One SRC:DST pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub src: PathBuf,
    pub dst: PathBuf,
}

/// A SRC:DST argument that cannot work.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid SRC:DST {arg:?}: {rule}")]
pub struct MappingError {
    pub arg: String,
    pub rule: String,
}

impl Mapping {
    /// Parses `SRC:DST`; DST's directory must exist (it is the shared volume).
    pub fn parse(arg: &str) -> Result<Self, MappingError> {
        let invalid = |rule: &str| MappingError {
            arg: arg.to_owned(),
            rule: rule.to_owned(),
        };
        let (src, dst) = arg
            .split_once(':')
            .ok_or_else(|| invalid("expected SRC:DST"))?;
        if src.is_empty() || dst.is_empty() || dst.ends_with('/') {
            return Err(invalid("SRC and DST must both be file paths"));
        }
        let dst = PathBuf::from(dst);
        if dst.is_dir() {
            // It could be neither replaced by a rename nor removed.
            return Err(invalid("DST is a directory; name the file to create in it"));
        }
        let dir = parent(&dst);
        if !dir.is_dir() {
            return Err(invalid(&format!(
                "DST's directory {} does not exist",
                dir.display()
            )));
        }
        Ok(Self {
            src: src.into(),
            dst,
        })
    }

    /// The temporary file a copy is written to before the rename.
    fn temporary(&self) -> PathBuf {
        let name = self.dst.file_name().unwrap_or_default().to_string_lossy();
        parent(&self.dst).join(format!(".{name}.leader-gate.tmp"))
    }
}

/// What `file-gate` was asked to do.
#[derive(Clone, Debug)]
pub struct FileGateOptions {
    pub url: GateUrl,
    pub reload: Option<GateUrl>,
    pub mode: u32,
    pub mappings: Vec<Mapping>,
}

/// Runs until SIGTERM/SIGINT; removes every DST before it returns.
pub async fn run(options: FileGateOptions) {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let reloader = Reloader::start(options.reload.clone());
    let gate = Gate::new(options, reloader.handle());
    // Before anything else: a copy left by a run that was killed is stale
    // until proven otherwise. The collector hears of it (and answers)
    // before this run even subscribes.
    if gate.remove_all("stale copies from an earlier run")
        && let Some(url) = &gate.options.reload
    {
        reload(url).await;
    }
    let guard = guard(&gate.options.mappings);
    // Only with --reload-url can it tell when the collector was told of a
    // removal; without it the collector finds out at its own reload period,
    // which only the gate lag covers: it registers as a gate that never
    // acknowledges, so no other gate's word shortens that.
    let acknowledges = gate.options.reload.is_some();
    let mut feed = Feed::registered(gate.options.url.clone(), "file-gate", acknowledges);
    // The term the copies were last written for, until its end is
    // acknowledged: once they are removed, the collector told (its reload
    // answered), and the sidecar said the term stopped.
    let mut open_term: Option<String> = None;
    loop {
        // Writes go to the writer threads; a removal happens here and now.
        if let Some(leading) = feed.leading() {
            open_term = Some(leading.term.clone());
            gate.write_all(feed.place());
        } else {
            if gate.remove_all("leadership ended or cannot be confirmed") {
                reloader.changed();
            }
            if let Some(term) = open_term.take_if(|term| feed.stopped_term() == Some(term)) {
                // In a task of its own: a collector slow to answer its
                // reload must not keep this loop from the next term.
                let (flushed, ack) = (reloader.flushed(), feed.acknowledgement(term));
                tokio::spawn(async move {
                    flushed.await;
                    log_acknowledged(ack.await);
                });
            }
        }
        tokio::select! {
            signal = feed.next() => {
                if let Some(line) = signal.log_line() {
                    log(&line);
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    if gate.remove_all("shutting down") {
        reloader.changed();
    }
    // Removed here: the guard has nothing left to do.
    if let Some(guard) = guard {
        guard.dismiss();
    }
    gate.finish().await;
    reloader.flushed().await;
    // Nothing is copied, nor will be again by this process.
    if let Some(term) = open_term {
        log_acknowledged(feed.acknowledgement(term).await);
    }
    reloader.finish().await;
}

/// What an acknowledgement of a term's end did (best-effort: without it the
/// sidecar waits its gate lag).
fn log_acknowledged(result: Result<String, String>) {
    match result {
        Ok(term) => log(&format!(
            "told the sidecar that no copy of term {term} is left"
        )),
        Err(why) => log(&why),
    }
}

/// Sends one reload POST per change, in order, in a task of its own: a
/// collector that answers its reload slowly (Prometheus answers once the
/// whole configuration is reloaded) must never hold up a removal.
struct Reloader {
    queue: Option<mpsc::UnboundedSender<Reload>>,
    worker: Option<JoinHandle<()>>,
}

impl Reloader {
    fn start(url: Option<GateUrl>) -> Self {
        let Some(url) = url else {
            return Self {
                queue: None,
                worker: None,
            };
        };
        let (queue, mut changes) = mpsc::unbounded_channel::<Reload>();
        let worker = tokio::spawn(async move {
            while let Some(next) = changes.recv().await {
                match next {
                    Reload::Changed => reload(&url).await,
                    Reload::Flush(done) => {
                        let _ = done.send(());
                    }
                    Reload::Finish => break,
                }
            }
        });
        Self {
            queue: Some(queue),
            worker: Some(worker),
        }
    }

    /// Something changed: the collector is told once, after what came before.
    fn changed(&self) {
        self.handle().changed();
    }

    /// For the writer threads, which say when they changed something.
    fn handle(&self) -> Changed {
        Changed(self.queue.clone())
    }

    /// Resolves once every reload queued so far was answered (or failed:
    /// each is bounded), at once without `--reload-url`.
    fn flushed(&self) -> impl Future<Output = ()> + Send + 'static {
        let answered = self.queue.as_ref().and_then(|queue| {
            let (done, answered) = tokio::sync::oneshot::channel();
            queue.send(Reload::Flush(done)).is_ok().then_some(answered)
        });
        async move {
            if let Some(answered) = answered {
                let _ = answered.await;
            }
        }
    }

    /// Sends what is queued, for a bounded time.
    async fn finish(mut self) {
        if let Some(queue) = self.queue.take() {
            let _ = queue.send(Reload::Finish);
        }
        if let Some(worker) = self.worker.take()
            && tokio::time::timeout(2 * RELOAD_TIMEOUT, worker)
                .await
                .is_err()
        {
            log("gave up on the reloads still queued");
        }
    }
}

async fn reload(url: &GateUrl) {
    match url.fetch(Method::POST, "", RELOAD_TIMEOUT).await {
        Ok((status, _)) if (200..300).contains(&status) => {}
        Ok((status, body)) => log(&format!(
            "reload {} answered {status}: {}",
            url.path(""),
            String::from_utf8_lossy(&body).trim()
        )),
        Err(error) => log(&format!("reload {} failed: {error}", url.path(""))),
    }
}

struct Gate {
    options: FileGateOptions,
    writers: Vec<Writer>,
}

// === impl Gate ===

impl Gate {
    /// Starts one writer thread per DST; `changed` hears of every write.
    fn new(options: FileGateOptions, changed: Changed) -> Self {
        Self::with_disk(options, changed, Arc::new(RealDisk::new()))
    }

    fn with_disk(options: FileGateOptions, changed: Changed, disk: Arc<dyn Disk>) -> Self {
        let writers = options
            .mappings
            .iter()
            .map(|m| Writer::start(m.clone(), options.mode, changed.clone(), disk.clone()))
            .collect();
        Self { options, writers }
    }

    /// Asks every writer for a current copy of its SRC at its DST, with
    /// the Lease's `place` substituted; returns at once (each writer tells
    /// the reloader of what it changed).
    fn write_all(&self, place: Option<&Place>) {
        for writer in &self.writers {
            writer.ensure(place);
        }
    }

    /// Removes every DST now, without waiting for
    /// a write in progress, which then never lands; whether one existed.
    fn remove_all(&self, why: &str) -> bool {
        let mut changed = false;
        for writer in &self.writers {
            changed |= writer.remove(why);
        }
        changed
    }

    /// Lets the writers finish (a write they drop, a directory fsync),
    /// for a bounded time. Joined from a thread of its own, not the
    /// runtime's blocking pool: the runtime waits for that pool when it is
    /// dropped, and a disk that stays stuck must not keep the process up.
    async fn finish(self) {
        let writers = self.writers;
        let (done, finished) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            writers.into_iter().for_each(Writer::finish);
            let _ = done.send(());
        });
        if tokio::time::timeout(WRITER_FINISH_TIMEOUT, finished)
            .await
            .is_err()
        {
            log("gave up waiting for a write stuck on the disk");
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// A [`death_guard`](crate::client::death_guard) that unlinks every DST
/// (and its temporary file) if this process is killed: a SIGKILLed or
/// OOM-killed gate must not leave a copy behind while a peer may lead.
fn guard(mappings: &[Mapping]) -> Option<Guard> {
    let paths: Vec<PathBuf> = mappings
        .iter()
        .flat_map(|m| [m.dst.clone(), m.temporary()])
        .collect();
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    match Guard::spawn(OnDeath::Unlink(&paths)) {
        Ok(guard) => Some(guard),
        Err(error) => {
            log(&format!(
                "cannot start the guard that removes the copies if this process is killed: {error}"
            ));
            None
        }
    }
}

fn log(message: &str) {
    eprintln!("leader-gate file-gate: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "leader-gate-file-gate-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn mappings_need_two_paths_and_an_existing_directory() {
        let d = dir("parse");
        let ok = format!("/etc/src.yml:{}/dst.yml", d.display());
        assert_eq!(Mapping::parse(&ok).unwrap().dst, d.join("dst.yml"), "{ok}");
        for bad in [
            "nocolon",
            ":x",
            "x:",
            "a:/nonexistent-dir-xyz/f",
            &format!("a:{}/", d.display()),
            &format!("a:{}", d.display()),
        ] {
            assert!(Mapping::parse(bad).is_err(), "{bad}");
        }
    }

    fn changes() -> (Changed, mpsc::UnboundedReceiver<Reload>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Changed(Some(tx)), rx)
    }

    fn count(rx: &mut mpsc::UnboundedReceiver<Reload>) -> usize {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|r| matches!(r, Reload::Changed))
            .count()
    }

    fn gate(
        d: &Path,
        disk: Option<Arc<dyn Disk>>,
    ) -> (Gate, Mapping, mpsc::UnboundedReceiver<Reload>) {
        let src = d.join("src.yml");
        std::fs::write(&src, "a: 1\n").unwrap();
        let mapping =
            Mapping::parse(&format!("{}:{}/dst.yml", src.display(), d.display())).unwrap();
        let options = FileGateOptions {
            url: GateUrl::parse("http://127.0.0.1:9").unwrap(),
            reload: None,
            mode: 0o640,
            mappings: vec![mapping.clone()],
        };
        let (changed, rx) = changes();
        let gate = match disk {
            Some(disk) => Gate::with_disk(options, changed, disk),
            None => Gate::new(options, changed),
        };
        (gate, mapping, rx)
    }

    /// Writes, then waits until the writer is done; how many changes it made.
    fn settle(gate: &Gate, rx: &mut mpsc::UnboundedReceiver<Reload>) -> usize {
        settle_for(gate, rx, None)
    }

    /// The same, for the Lease at `place`.
    fn settle_for(
        gate: &Gate,
        rx: &mut mpsc::UnboundedReceiver<Reload>,
        place: Option<&Place>,
    ) -> usize {
        gate.write_all(place);
        gate.writers.iter().for_each(Writer::wait_idle);
        count(rx)
    }

    #[test]
    fn a_copy_takes_the_shard_of_the_lease_and_is_rewritten_when_it_changes() {
        let d = dir("shard");
        let (gate, mapping, mut rx) = gate(&d, None);
        std::fs::write(
            &mapping.src,
            "hosts: [\"ksm-${LEADER_GATE_SHARD}:8080\"] # of ${LEADER_GATE_SHARDS}, ${NODE}\n",
        )
        .unwrap();
        let place = |shard| Place {
            lease: format!("ksm-{shard}"),
            shard,
            shards: 3,
        };
        assert_eq!(settle_for(&gate, &mut rx, Some(&place(1))), 1);
        assert_eq!(
            std::fs::read_to_string(&mapping.dst).unwrap(),
            "hosts: [\"ksm-1:8080\"] # of 3, ${NODE}\n"
        );
        assert_eq!(settle_for(&gate, &mut rx, Some(&place(1))), 0, "unchanged");
        assert_eq!(settle_for(&gate, &mut rx, Some(&place(2))), 1);
        assert_eq!(
            std::fs::read_to_string(&mapping.dst).unwrap(),
            "hosts: [\"ksm-2:8080\"] # of 3, ${NODE}\n",
            "another shard, another copy"
        );
    }

    #[test]
    fn copies_appear_whole_with_the_mode_and_removal_reports_what_it_did() {
        let d = dir("copy");
        let (gate, mapping, mut rx) = gate(&d, None);
        let src = &mapping.src;
        assert_eq!(settle(&gate, &mut rx), 1);
        assert_eq!(settle(&gate, &mut rx), 0, "unchanged SRC: nothing to do");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 1\n");
        let mode = std::fs::metadata(&mapping.dst)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        std::fs::write(src, "a: 2\n").unwrap();
        assert_eq!(settle(&gate, &mut rx), 1, "a changed SRC is copied again");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        assert!(!mapping.temporary().exists());
        // Someone else removes or edits the copy: it is put back.
        std::fs::remove_file(&mapping.dst).unwrap();
        assert_eq!(settle(&gate, &mut rx), 1, "a removed copy is restored");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        std::fs::write(&mapping.dst, "edited\n").unwrap();
        assert_eq!(settle(&gate, &mut rx), 1, "an edited copy is restored");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        assert_eq!(settle(&gate, &mut rx), 0);
        assert!(gate.remove_all("test"));
        assert!(!mapping.dst.exists());
        assert!(!gate.remove_all("test"), "nothing left to remove");
        // Leading again: written again, as new.
        assert_eq!(settle(&gate, &mut rx), 1);
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
    }

    /// A disk whose fsync blocks while `stuck`, saying when one is blocked.
    #[derive(Default)]
    struct StuckDisk {
        stuck: std::sync::Mutex<bool>,
        turn: std::sync::Condvar,
        blocked: std::sync::atomic::AtomicBool,
    }

    impl StuckDisk {
        fn set(&self, stuck: bool) {
            *self.stuck.lock().unwrap() = stuck;
            self.turn.notify_all();
        }

        /// Waits until an fsync is blocked on this disk.
        fn wait_blocked(&self) {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !self.blocked.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(std::time::Instant::now() < deadline, "no fsync came");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    impl Disk for StuckDisk {
        fn sync_file(&self, file: &File) -> std::io::Result<()> {
            file.sync_all()?;
            let mut stuck = self.stuck.lock().unwrap();
            while *stuck {
                self.blocked
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                stuck = self.turn.wait(stuck).unwrap();
            }
            self.blocked
                .store(false, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn a_removal_does_not_wait_for_an_fsync_and_the_write_never_lands_after_it() {
        let d = dir("stuck");
        let disk = Arc::new(StuckDisk::default());
        let (gate, mapping, mut rx) = gate(&d, Some(disk.clone()));
        assert_eq!(settle(&gate, &mut rx), 1);
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 1\n");

        // SRC changes; the next write is stuck in its fsync.
        std::fs::write(&mapping.src, "a: 2\n").unwrap();
        disk.set(true);
        gate.write_all(None);
        disk.wait_blocked();

        // The removal happens meanwhile (on another thread, so that a
        // removal that waited would fail this test instead of hanging it).
        let (done, removed) = std::sync::mpsc::channel();
        let remover = std::thread::spawn(move || {
            let removed = gate.remove_all("test");
            done.send(removed).unwrap();
            gate
        });
        let removed = removed.recv_timeout(Duration::from_secs(5));
        assert_eq!(removed, Ok(true), "the removal waited for the stuck fsync");
        assert!(!mapping.dst.exists());
        assert!(
            disk.blocked.load(std::sync::atomic::Ordering::SeqCst),
            "removed while the fsync was still stuck"
        );
        let gate = remover.join().unwrap();

        // The disk comes back: the write that began before the removal is
        // dropped, never renamed over the removal.
        disk.set(false);
        gate.writers.iter().for_each(Writer::wait_idle);
        assert!(
            !mapping.dst.exists(),
            "a stale write landed after the removal"
        );
        assert!(
            !mapping.temporary().exists(),
            "its temporary file is gone too"
        );
        assert_eq!(count(&mut rx), 0, "nothing changed but the removal");

        // Leading again: the current SRC is written.
        assert_eq!(settle(&gate, &mut rx), 1);
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
    }
}
