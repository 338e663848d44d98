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
//! copies within milliseconds (and sends the reload) — unless the gate is its container's PID 1
//! (then the kernel kills the guard with it, and the copy goes at the
//! container's restart: run it under an init, or share the pod's process
//! namespace). A removal that fails (say `EBUSY`, or a directory put at
//! DST) is not taken for done: it is said, tried again every second, and
//! nothing is acknowledged meanwhile.
//!
//! With `--reload-url` an HTTP POST follows every change (Prometheus
//! `/-/reload`, Fluent Bit, Vector), sent after it: changes are numbered, a
//! POST covers every change made before it was sent, and changes made
//! while a POST is in flight are covered by the next one. The POSTs go out
//! from a task of their own, so a collector slow to answer never delays a
//! removal. Only a **2xx** answer within the timeout (5 s, answer included)
//! counts: a non-2xx answer, a refused connection or a reload that takes
//! longer is a failure, said once per episode (with "will retry in …"),
//! and retried with [`Backoff`] (200 ms doubling, at most 3 s apart) until
//! one is answered 2xx, the copies staying removed meanwhile.
//!
//! At start-up, after removing stale copies and before subscribing, it
//! always sends one reload, whether or not a copy was still there: a
//! killed run, or its death guard, may have left the collector with a copy
//! it loaded and was never told is gone. Subscribing waits for that reload
//! to be answered 2xx — the gate should not open over a collector whose
//! state it does not know — but for 10 s at most: a collector still
//! starting may refuse connections for longer, and a gate that never
//! subscribed could never open. The reload is then retried in the
//! background like any other, and no term is acknowledged before a 2xx
//! answer covers it. If the gate is killed, its death guard sends the
//! reload itself right after its unlinks (a few tries, until one is
//! answered 2xx), so the collector drops the copy within milliseconds
//! instead of at the gate's restart; the start-up reload is still sent, as
//! the guard may have died with the gate or failed to reach the collector.
//!
//! `file-gate` is a registered gate ([`Feed::registered`]). With a reload
//! URL it acknowledges a term (see [`closing`]) only once every copy of it
//! is removed, a reload sent after that removal was answered 2xx, and the
//! sidecar said the term stopped — so the sidecar's graceful release need
//! not wait out its gate lag. Until then it says nothing, and the sidecar
//! waits its gate lag, as for any gate that cannot say. On SIGTERM/SIGINT
//! the same holds: it removes the copies, waits up to 10 s for a 2xx reload
//! after the removal, acknowledges if one came, and exits either way.
//! Without a reload URL it never acknowledges: the collector finds a
//! removal at its own reload period, which only the whole gate lag covers.
//!
//! Test hook (debug builds only): `LEADER_GATE_TEST_RELOAD_TIMEOUT_MS`
//! replaces the reload timeout, so tests can show that a late answer does
//! not count.
//!
//! [`feed`]: crate::client::feed

mod closing;
mod prover;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hyper::Method;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::client::collector_status::StoppedWhen;
use crate::client::death_guard::{Guard, OnDeath, Post};
use crate::client::feed::Feed;
use crate::client::place::Place;
use crate::client::url::{ClientArgs, GateUrl};
use crate::exit;
use closing::Closing;
use prover::{Marker, Prover};
use writer::{Changed, Disk, RealDisk, Removal, Writer};

#[derive(Debug, Args)]
pub struct FileGateArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// POST here after every change (e.g. http://127.0.0.1:9090/-/reload).
    #[arg(long, env = "LEADER_GATE_RELOAD_URL", value_parser = GateUrl::parse_exact)]
    pub reload_url: Option<GateUrl>,

    /// The collector's own status, read with GET after a removal until it
    /// says the gated work stopped (--stopped-when): the proof that
    /// acknowledges a term (e.g. http://127.0.0.1:5066/stats).
    #[arg(long, env = "LEADER_GATE_STATUS_URL", value_parser = GateUrl::parse_exact, requires = "stopped_when")]
    pub status_url: Option<GateUrl>,

    /// When --status-url says the work stopped: SELECTOR OP VALUE, e.g.
    /// 'libbeat.config.module.running <= before' or
    /// 'prometheus_target_scrape_pool_targets{scrape_job="cluster"} == 0'.
    #[arg(long, env = "LEADER_GATE_STOPPED_WHEN", value_parser = StoppedWhen::parse, requires = "status_url")]
    pub stopped_when: Option<StoppedWhen>,

    /// File mode of the copies, in octal.
    #[arg(long, default_value = "0644", value_parser = parse_mode)]
    pub mode: u32,

    /// SRC:DST pairs: DST holds a copy of SRC only while this pod leads.
    #[arg(required = true, value_name = "SRC:DST", value_parser = Mapping::parse)]
    pub mappings: Vec<Mapping>,
}

/// Parses an octal file mode such as `0644` or `640`.
pub fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("{text:?} is not an octal file mode like 0644"))
}

/// How long a reload POST may take, answer included: one that takes longer
/// failed, whatever it answers later.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Retrying a reload that failed: quick at first, never more than a few
/// seconds apart (the collector is in the same pod).
const RELOAD_RETRY: Backoff = Backoff {
    first: Duration::from_millis(200),
    max: Duration::from_secs(3),
    jitter: 0.2,
};
/// How long the start-up reload may hold back the subscription (see the
/// module docs).
const STARTUP_RELOAD_WAIT: Duration = Duration::from_secs(10);
/// How long shutting down waits for a 2xx reload after the removal before
/// it exits without acknowledging.
const SHUTDOWN_RELOAD_WAIT: Duration = Duration::from_secs(10);
/// Tries in a row in one term (one per renewal) that could not put a copy
/// in place before `file-gate` with `--reload-url` gives the term up: a
/// lasting cause (SRC missing, DST on a read-only or full volume, no
/// permission), not a passing one.
const GIVE_UP_AFTER: u32 = 3;
/// Retrying a removal that failed.
const REMOVAL_RETRY: Duration = Duration::from_secs(1);
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
        temporary_path(&self.dst)
    }
}

/// The temporary file a copy of `dst` is written to before the rename,
/// beside it: `.NAME.leader-gate.tmp` (a collector loading `*.yml` never
/// sees a half-written copy; `inject --check` holds globs to that).
pub fn temporary_path(dst: &Path) -> PathBuf {
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    parent(dst).join(format!(".{name}.leader-gate.tmp"))
}

/// The file beside `dst` that says a `file-gate` ran in this pod before
/// (see `prover`): `.NAME.leader-gate.started`, which a collector loading
/// `*.yml` or `*.json` never reads; `inject --check` holds globs to it.
pub fn marker_path(dst: &Path) -> PathBuf {
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    parent(dst).join(format!(".{name}.leader-gate.started"))
}

/// What `file-gate` was asked to do.
#[derive(Clone, Debug)]
pub struct FileGateOptions {
    pub url: GateUrl,
    pub reload: Option<GateUrl>,
    /// `--status-url` and `--stopped-when`.
    pub status: Option<(GateUrl, StoppedWhen)>,
    pub mode: u32,
    pub mappings: Vec<Mapping>,
}

/// Runs until SIGTERM/SIGINT (exit code 0), or until it gives up a term
/// whose copies it cannot put in place ([`GIVE_UP_AFTER`]: exit code
/// [`exit::CANTCREAT`]); removes every DST before it returns.
pub async fn run(options: FileGateOptions) -> u8 {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let reloader = Reloader::start(options.reload.clone());
    let prover = options
        .status
        .clone()
        .map(|(url, stopped_when)| Prover::start(url, stopped_when));
    // Before the stale copies go: whether an earlier file-gate ran in this
    // pod (only `before` needs it).
    let first_in_pod = prover
        .as_ref()
        .is_some_and(|p| p.condition().needs_before())
        && options
            .mappings
            .first()
            .is_some_and(|m| Marker::first_in_pod(&m.dst));
    let gate = Gate::new(options, reloader.handle());
    let mut closing = Closing::default();
    // The open term's `before` (see `prover`).
    let mut before: Option<f64> = None;
    // Before anything else: a copy left by a run that was killed is stale
    // until proven otherwise. Whether or not one was still here (its death
    // guard may have removed it), the collector may hold what that run had
    // it load: it is told in every case, and heard to answer 2xx before
    // this run subscribes (for a bounded time: see the module docs).
    // (A removal that fails here is tried again in the loop below.)
    gate.remove_all("stale copies from an earlier run");
    let guard = guard(
        &gate.options.mappings,
        guard_post(gate.options.reload.as_ref()).await,
    );
    let mut exiting = false;
    if reloader.enabled() {
        reloader.changed();
        let startup = reloader.current();
        tokio::select! {
            told = tokio::time::timeout(STARTUP_RELOAD_WAIT, reloader.confirmed(startup)) => {
                if told.is_err() {
                    log(&format!(
                        "the start-up reload was not answered 2xx within {STARTUP_RELOAD_WAIT:?}: \
                         subscribing all the same, still retrying it (nothing is acknowledged until a reload answers 2xx)"
                    ));
                }
            }
            _ = term.recv() => exiting = true,
            _ = int.recv() => exiting = true,
        }
    }
    // Only with --status-url (the collector says the work stopped) or
    // --reload-url (it was told of the removal) can it acknowledge;
    // without either the collector finds out at its own reload period,
    // which only the gate lag covers: it registers as a gate that never
    // acknowledges, so no other gate's word shortens that.
    let acknowledges = gate.options.reload.is_some() || prover.is_some();
    let mut feed = Feed::registered(gate.options.url.clone(), "file-gate", acknowledges);
    // The proof: the status where one is read, else the reload's 2xx.
    let mut confirmed = prover
        .as_ref()
        .map_or_else(|| reloader.confirmations(), Prover::proofs);
    let mut code = 0;
    while !exiting {
        // Writes go to the writer threads; a removal happens here and now.
        let removal_failed = if let Some(leading) = feed.leading() {
            if closing.open() != Some(leading.term.as_str()) {
                gate.new_term();
                let term = leading.term.clone();
                closing.leading(&term);
                if let Some(prover) = &prover {
                    // Read before the first copy is placed; leadership is
                    // judged again after it.
                    // Clean: the term began while this gate listened, or
                    // no earlier gate ran in this pod.
                    let clean = feed.heard_not_leading() || first_in_pod;
                    before = prover.before(&term, clean).await;
                    continue;
                }
            }
            closing.leading(&leading.term);
            if let Some(prover) = &prover {
                prover.withdraw();
            }
            if acknowledges && gate.failed_writes() >= GIVE_UP_AFTER {
                // Nothing of the term can run here, and the sidecar would
                // count it as running for as long as this gate stayed:
                // it is given up as on exit (removed, acknowledged once a
                // reload proves it), and the kubelet's restarts show it.
                // (Without a reload URL the sidecar could not hear it, so
                // the gate keeps trying: a late SRC still lands.)
                log(&format!(
                    "cannot put the copies of term {} in place ({GIVE_UP_AFTER} tries in a row failed, \
                     said above): giving the term up, removing every copy and exiting",
                    leading.term
                ));
                code = exit::CANTCREAT;
                break;
            }
            gate.write_all(feed.place());
            false
        } else {
            let removal = gate.remove_all("leadership ended or cannot be confirmed");
            let failed = closing.settle(removal, &reloader, prover.as_ref(), before);
            if let Some(term) =
                closing.acknowledgement(*confirmed.borrow(), feed.stopped_term(), false)
            {
                // In a task of its own: a sidecar slow to answer must not
                // keep this loop from the next term.
                let ack = feed.acknowledgement(term.to_owned());
                closing.acknowledged();
                let proof = proof_words(prover.as_ref());
                tokio::spawn(async move { log_acknowledged(ack.await, &proof) });
            }
            failed
        };
        tokio::select! {
            signal = feed.next() => {
                if let Some(line) = signal.log_line() {
                    log(&line);
                }
            }
            // A reload answered 2xx, or the status said stopped: perhaps
            // the proof a term waited for.
            _ = confirmed.changed() => {}
            () = tokio::time::sleep(REMOVAL_RETRY), if removal_failed => {}
            _ = term.recv() => exiting = true,
            _ = int.recv() => exiting = true,
        }
    }
    let removal = gate.remove_all("shutting down");
    let removal_failed = closing.settle(removal, &reloader, prover.as_ref(), before);
    // Removed here: the guard has nothing left to do — unless a removal
    // failed: then it tries once more when this process exits.
    if let Some(guard) = guard
        && !removal_failed
    {
        guard.dismiss();
    }
    gate.finish().await;
    // Nothing is copied, nor will be again by this process: the open term
    // is acknowledged once a reload after the removal answers 2xx.
    if let Some(term) = closing.open().map(str::to_owned)
        && acknowledges
    {
        let proven = confirmed.wait_for(|&n| closing.acknowledgement(n, None, true).is_some());
        if removal_failed {
            log(&format!(
                "exiting without acknowledging term {term}: a copy could not be removed"
            ));
        } else if tokio::time::timeout(SHUTDOWN_RELOAD_WAIT, proven)
            .await
            .is_ok_and(|proven| proven.is_ok())
        {
            log_acknowledged(
                feed.acknowledgement(term).await,
                &proof_words(prover.as_ref()),
            );
        } else {
            log(&format!(
                "exiting without acknowledging term {term}: not proven within {SHUTDOWN_RELOAD_WAIT:?} that {} (the sidecar waits its gate lag)",
                proof_words(prover.as_ref())
            ));
        }
    }
    reloader.finish();
    if let Some(prover) = prover {
        prover.finish();
    }
    code
}

/// What an acknowledgement of a term's end did (best-effort: without it the
/// sidecar waits its gate lag).
fn log_acknowledged(result: Result<String, String>, proof: &str) {
    match result {
        Ok(term) => log(&format!(
            "told the sidecar that no copy of term {term} is left (removed, and {proof})"
        )),
        Err(why) => log(&why),
    }
}

/// What proves a removal, in a log line's words.
fn proof_words(prover: Option<&Prover>) -> String {
    match prover {
        Some(prover) => format!("the status said `{}` after it", prover.condition()),
        None => "a reload after it answered 2xx".to_owned(),
    }
}

// === impl Closing (effects) ===

impl Closing {
    /// Records a removal of every DST: tells the collector (a change) if it
    /// must hear of it, and asks the `prover` (if any) to prove it with the
    /// term's `before`; whether one failed.
    fn settle(
        &mut self,
        removal: Removal,
        reloader: &Reloader,
        prover: Option<&Prover>,
        before: Option<f64>,
    ) -> bool {
        if removal == Removal::Failed {
            self.removal_failed();
            return true;
        }
        if self.needs_reload(removal == Removal::Removed) {
            reloader.changed();
        }
        self.removed(reloader.current());
        if let (Some(prover), Some(change)) = (prover, self.removed_at()) {
            prover.ask(change, before);
        }
        false
    }
}

/// Sends reload POSTs in a task of its own, so that a collector slow to
/// answer (Prometheus answers once the whole configuration is reloaded)
/// never holds up a removal. It reloads whenever the change number is ahead
/// of the highest one a 2xx answer covers, and retries a failed reload with
/// backoff until one is answered 2xx (changes made meanwhile are covered by
/// the next try).
struct Reloader {
    progress: Progress,
    /// `None` without `--reload-url`: nothing is ever confirmed.
    worker: Option<JoinHandle<()>>,
}

#[derive(Clone)]
struct Progress {
    /// The change number (bumped by every change).
    changes: Arc<watch::Sender<u64>>,
    /// The highest change number a 2xx reload covers.
    confirmed: Arc<watch::Sender<u64>>,
}

impl Reloader {
    fn start(url: Option<GateUrl>) -> Self {
        let progress = Progress {
            changes: Arc::new(watch::Sender::new(0)),
            confirmed: Arc::new(watch::Sender::new(0)),
        };
        let worker = url.map(|url| tokio::spawn(reload_until_confirmed(url, progress.clone())));
        Self { progress, worker }
    }

    fn enabled(&self) -> bool {
        self.worker.is_some()
    }

    /// Something changed: the collector is told, after the change.
    fn changed(&self) {
        self.handle().changed();
    }

    /// The current change number.
    fn current(&self) -> u64 {
        self.handle().current()
    }

    /// For the writer threads, which say when they changed something.
    fn handle(&self) -> Changed {
        Changed(Some(self.progress.changes.clone()))
    }

    /// Told of every new confirmation (never closed while `self` lives).
    fn confirmations(&self) -> watch::Receiver<u64> {
        self.progress.confirmed.subscribe()
    }

    /// Resolves once a 2xx reload covers change number `change`.
    async fn confirmed(&self, change: u64) {
        let mut confirmed = self.confirmations();
        let _ = confirmed.wait_for(|&n| n >= change).await;
    }

    /// Stops retrying: the process exits.
    fn finish(mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

/// The reloader's task: reload while the change number is ahead of what a
/// 2xx answer covers; after a failure, again after a backoff.
async fn reload_until_confirmed(url: GateUrl, progress: Progress) {
    let timeout = reload_timeout();
    let mut changes = progress.changes.subscribe();
    let mut failures = 0u32;
    let mut said: Option<String> = None;
    loop {
        let target = *changes.borrow_and_update();
        if target <= *progress.confirmed.borrow() {
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        match reload(&url, timeout).await {
            Ok(()) => {
                if failures > 0 {
                    log(&format!(
                        "reload {} answered 2xx after {failures} failed attempt(s)",
                        url.path("")
                    ));
                }
                failures = 0;
                said = None;
                progress.confirmed.send_modify(|n| *n = (*n).max(target));
            }
            Err(why) => {
                failures = failures.saturating_add(1);
                let delay = RELOAD_RETRY.delay(failures, fastrand::f64());
                // Said in full once per episode (and when the reason
                // changes); every attempt counts in the line that ends it.
                if said.as_ref() != Some(&why) {
                    log(&format!(
                        "{why}; will retry in {delay:.1?} (until a reload answers 2xx, the end of a term is not acknowledged)"
                    ));
                    said = Some(why);
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One reload POST: `Ok` only for a 2xx answer within `timeout`.
async fn reload(url: &GateUrl, timeout: Duration) -> Result<(), String> {
    match url.fetch(Method::POST, "", timeout).await {
        Ok((status, _)) if (200..300).contains(&status) => Ok(()),
        Ok((status, body)) => Err(format!(
            "reload {} answered {status}: {}",
            url.path(""),
            String::from_utf8_lossy(&body).trim()
        )),
        Err(error) => Err(format!("reload {} failed: {error}", url.path(""))),
    }
}

/// [`RELOAD_TIMEOUT`], or in debug builds `LEADER_GATE_TEST_RELOAD_TIMEOUT_MS`
/// (a test hook, absent from release builds).
fn reload_timeout() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("LEADER_GATE_TEST_RELOAD_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        return Duration::from_millis(ms);
    }
    RELOAD_TIMEOUT
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

    /// Attempts in a row, in this term, that could not put a copy in
    /// place, at the DST that failed most.
    fn failed_writes(&self) -> u32 {
        self.writers
            .iter()
            .map(Writer::failed_writes)
            .max()
            .unwrap_or(0)
    }

    /// A new term: its tries start from none failed.
    fn new_term(&self) {
        self.writers.iter().for_each(Writer::forget_failures);
    }

    /// Asks every writer for a current copy of its SRC at its DST, with
    /// the Lease's `place` substituted; returns at once (each writer tells
    /// the reloader of what it changed).
    fn write_all(&self, place: Option<&Place>) {
        for writer in &self.writers {
            writer.ensure(place);
        }
    }

    /// Removes every DST now, without waiting for a write in progress,
    /// which then never lands: `Failed` if any removal failed, else
    /// `Removed` if any DST existed, else `Absent`.
    fn remove_all(&self, why: &str) -> Removal {
        let mut outcome = Removal::Absent;
        for writer in &self.writers {
            match writer.remove(why) {
                Removal::Failed => outcome = Removal::Failed,
                Removal::Removed if outcome == Removal::Absent => outcome = Removal::Removed,
                _ => {}
            }
        }
        outcome
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

/// The reload POST the death guard sends after its unlinks, ready to go:
/// the URL's host resolved now (the guard cannot resolve it).
async fn guard_post(reload: Option<&GateUrl>) -> Option<Post> {
    let url = reload?;
    let resolved = tokio::net::lookup_host(url.host_port()).await;
    let Some(addr) = resolved.ok().and_then(|mut addrs| addrs.next()) else {
        log(&format!(
            "cannot resolve {}: if this process is killed, its guard removes the copies but cannot reload the collector",
            url.authority()
        ));
        return None;
    };
    let request = format!(
        "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        url.path(""),
        url.authority()
    );
    Some(Post {
        addr,
        request: request.into_bytes(),
    })
}

/// A [`death_guard`](crate::client::death_guard) that unlinks every DST
/// (and its temporary file) if this process is killed, then sends `post`
/// (the reload): a SIGKILLed or OOM-killed gate must not leave a copy
/// behind while a peer may lead, nor its collector unaware of it.
fn guard(mappings: &[Mapping], post: Option<Post>) -> Option<Guard> {
    let paths: Vec<PathBuf> = mappings
        .iter()
        .flat_map(|m| [m.dst.clone(), m.temporary()])
        .collect();
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    match Guard::spawn(OnDeath::Unlink(&paths, post)) {
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
    // Through tracing: `leader-gate file-gate: message` as text, or the pod's
    // JSON lines (main.rs sets the format up).
    tracing::info!("{message}");
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

    /// Counts the changes the writers report.
    struct Changes {
        changed: Changed,
        seen: u64,
    }

    fn changes() -> (Changed, Changes) {
        let changed = Changed(Some(Arc::new(watch::Sender::new(0))));
        let seen = Changes {
            changed: changed.clone(),
            seen: 0,
        };
        (changed, seen)
    }

    /// The changes since the last count.
    fn count(rx: &mut Changes) -> usize {
        let now = rx.changed.current();
        let new = now - rx.seen;
        rx.seen = now;
        new as usize
    }

    fn gate(d: &Path, disk: Option<Arc<dyn Disk>>) -> (Gate, Mapping, Changes) {
        let src = d.join("src.yml");
        std::fs::write(&src, "a: 1\n").unwrap();
        let mapping =
            Mapping::parse(&format!("{}:{}/dst.yml", src.display(), d.display())).unwrap();
        let options = FileGateOptions {
            url: GateUrl::parse("http://127.0.0.1:9").unwrap(),
            reload: None,
            status: None,
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
    fn settle(gate: &Gate, rx: &mut Changes) -> usize {
        settle_for(gate, rx, None)
    }

    /// The same, for the Lease at `place`.
    fn settle_for(gate: &Gate, rx: &mut Changes, place: Option<&Place>) -> usize {
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
        assert_eq!(gate.remove_all("test"), Removal::Removed);
        assert!(!mapping.dst.exists());
        assert_eq!(
            gate.remove_all("test"),
            Removal::Absent,
            "nothing left to remove"
        );
        // Leading again: written again, as new.
        assert_eq!(settle(&gate, &mut rx), 1);
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
    }

    #[test]
    fn a_removal_that_fails_is_reported_as_failed_not_as_nothing_to_remove() {
        let d = dir("unremovable");
        let (gate, mapping, mut rx) = gate(&d, None);
        // Something at DST that unlink(2) cannot remove, even as root.
        std::fs::create_dir(&mapping.dst).unwrap();
        std::fs::write(mapping.dst.join("inside"), "x").unwrap();
        assert_eq!(gate.remove_all("test"), Removal::Failed);
        assert_eq!(gate.remove_all("test"), Removal::Failed, "still there");
        std::fs::remove_dir_all(&mapping.dst).unwrap();
        assert_eq!(gate.remove_all("test"), Removal::Absent);
        assert_eq!(count(&mut rx), 0);
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
        assert_eq!(
            removed,
            Ok(Removal::Removed),
            "the removal waited for the stuck fsync"
        );
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
