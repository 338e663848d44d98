//! `--status-url` with `--stopped-when`: after a removal, the collector's
//! own status is read until it says the gated work stopped, and only then
//! is the removal *proven* — the proof [`super::closing`] acknowledges a
//! term on, in place of a 2xx reload.
//!
//! Asked to prove change number N (a removal of every copy), a task reads
//! the status every [`POLL`], each read started after the ask, until one
//! answer satisfies the condition; N is then proven. A newer ask replaces
//! an older one; an answer read for an older ask proves only that one. An
//! unreadable answer (see [`collector_status`]) proves nothing and is said
//! once per episode; the task keeps reading, less often after
//! [`PATIENCE`], since without a proof the sidecar simply waits its gate
//! lag.
//!
//! `before` (a count the gated work shares with work that is not gated) is
//! read when a term starts, before its first copy is placed — and only when
//! nothing of an earlier term can still be loaded: this process saw the
//! sidecar not leading before the term began (an earlier term then ended
//! at least a gate lag or a lease margin before a new one, so the
//! collector had dropped it), or the pod is new (no earlier `file-gate`
//! ran here: [`Marker`]). Otherwise the term cannot be proven and its
//! release waits the gate lag.
//!
//! [`collector_status`]: crate::client::collector_status

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::collector_status::{self, Reading, StoppedWhen};
use crate::client::url::GateUrl;

/// How often the status is read while a removal waits for its proof.
pub(super) const POLL: Duration = Duration::from_millis(250);
/// After this long without a proof, the status is read less often.
const PATIENCE: Duration = Duration::from_secs(60);
/// How often it is read after that.
const SLOW_POLL: Duration = Duration::from_secs(5);

/// A removal to prove: its change number, and the term's `before`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ask {
    change: u64,
    before: Option<f64>,
}

/// The task that proves removals from the collector's status.
pub(super) struct Prover {
    url: GateUrl,
    stopped_when: StoppedWhen,
    asks: watch::Sender<Option<Ask>>,
    /// The highest change number proven.
    proven: Arc<watch::Sender<u64>>,
    worker: JoinHandle<()>,
}

// === impl Prover ===

impl Prover {
    pub(super) fn start(url: GateUrl, stopped_when: StoppedWhen) -> Self {
        let asks = watch::Sender::new(None);
        let proven = Arc::new(watch::Sender::new(0));
        let worker = tokio::spawn(prove(
            url.clone(),
            stopped_when.clone(),
            asks.subscribe(),
            proven.clone(),
        ));
        Self {
            url,
            stopped_when,
            asks,
            proven,
            worker,
        }
    }

    /// The condition, as the user wrote it.
    pub(super) fn condition(&self) -> &StoppedWhen {
        &self.stopped_when
    }

    /// `before` for a term about to place its first copy: read now, when
    /// the condition needs it and nothing of an earlier term can still be
    /// loaded (`clean`); `None` otherwise, or when the status says nothing.
    pub(super) async fn before(&self, term: &str, clean: bool) -> Option<f64> {
        if !self.stopped_when.needs_before() {
            return None;
        }
        if !clean {
            super::log(&format!(
                "term {term} cannot be proven stopped from {}: it began before this file-gate \
                 started, in a pod where an earlier one ran (its release waits the gate lag)",
                self.url.path("")
            ));
            return None;
        }
        match collector_status::read(&self.url, &self.stopped_when).await {
            Reading::Value(value) => Some(value),
            Reading::Unreadable(why) => {
                super::log(&format!(
                    "term {term} cannot be proven stopped: `before` could not be read ({why}); \
                     its release waits the gate lag"
                ));
                None
            }
        }
    }

    /// Asks for a proof that change number `change` (a removal of every
    /// copy of a term whose `before` is given) stopped the work.
    pub(super) fn ask(&self, change: u64, before: Option<f64>) {
        let ask = Some(Ask { change, before });
        self.asks.send_if_modified(|current| {
            let new = *current != ask;
            *current = ask;
            new
        });
    }

    /// Leading again: an unproven removal no longer matters (a proof of it
    /// could acknowledge nothing newer), so the status is not read meanwhile.
    pub(super) fn withdraw(&self) {
        self.asks
            .send_if_modified(|current| current.take().is_some());
    }

    /// Told of every new proof (never closed while `self` lives).
    pub(super) fn proofs(&self) -> watch::Receiver<u64> {
        self.proven.subscribe()
    }

    /// Stops reading: the process exits.
    pub(super) fn finish(self) {
        self.worker.abort();
    }
}

/// The prover's task.
async fn prove(
    url: GateUrl,
    stopped_when: StoppedWhen,
    mut asks: watch::Receiver<Option<Ask>>,
    proven: Arc<watch::Sender<u64>>,
) {
    // What was last said, so that an episode is said once.
    let mut said: Option<String> = None;
    let mut asked_at = tokio::time::Instant::now();
    let mut current: Option<Ask> = None;
    loop {
        let ask = *asks.borrow_and_update();
        if ask != current {
            current = ask;
            asked_at = tokio::time::Instant::now();
        }
        let Some(ask) = ask.filter(|a| a.change > *proven.borrow()) else {
            if asks.changed().await.is_err() {
                return;
            }
            continue;
        };
        let (verdict, unreadable) = match collector_status::read(&url, &stopped_when).await {
            Reading::Value(value) => match stopped_when.holds(value, ask.before) {
                Some(true) => {
                    proven.send_modify(|n| *n = (*n).max(ask.change));
                    said = None;
                    continue;
                }
                Some(false) => (
                    format!("the status still says {value} ({stopped_when} not yet)"),
                    false,
                ),
                // Nothing can prove it (said when `before` was read): wait
                // for the next ask.
                None => {
                    if asks.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
            },
            Reading::Unreadable(why) => (format!("the status says nothing: {why}"), true),
        };
        let waited = asked_at.elapsed();
        // An unreadable status is said at once, a slow one after a while;
        // each once per episode.
        if (unreadable || waited >= PATIENCE) && said.as_deref() != Some(verdict.as_str()) {
            super::log(&format!(
                "{verdict} {waited:.0?} after a removal: not acknowledging yet (the sidecar waits its gate lag)"
            ));
            said = Some(verdict);
        }
        let pause = if waited >= PATIENCE { SLOW_POLL } else { POLL };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            changed = asks.changed() => if changed.is_err() { return },
        }
    }
}

/// Tells a new pod from a restart of `file-gate` in the same pod: a file
/// beside the first DST, [`super::marker_path`] (in the volume shared with
/// the collector, which lives as long as the pod when it is an emptyDir).
pub(super) struct Marker;

impl Marker {
    /// Whether no earlier `file-gate` left its marker beside `dst`; leaves
    /// this one's. A marker that cannot be written counts as found: a
    /// restart could not tell either.
    pub(super) fn first_in_pod(dst: &Path) -> bool {
        let path = super::marker_path(dst);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => true,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(error) => {
                super::log(&format!(
                    "cannot write {}: {error} (a `before` of the first term is not trusted)",
                    path.display()
                ));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A status that never says stopped, counting its reads.
    async fn never_stopped() -> (GateUrl, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = GateUrl::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let body = "{\"running\": 4}";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (url, reads)
    }

    #[tokio::test]
    async fn leading_again_withdraws_an_unproven_removal_and_the_reads_stop() {
        let (url, reads) = never_stopped().await;
        let prover = Prover::start(url, StoppedWhen::parse("running == 0").unwrap());
        prover.ask(3, None);
        tokio::time::sleep(POLL * 3).await;
        let asked = reads.load(Ordering::SeqCst);
        assert!(asked >= 2, "read while the removal waits: {asked}");
        prover.withdraw();
        tokio::time::sleep(POLL).await;
        let settled = reads.load(Ordering::SeqCst);
        tokio::time::sleep(POLL * 4).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            settled,
            "no reads while leading"
        );
        assert_eq!(*prover.proofs().borrow(), 0, "nothing proven");
        prover.finish();
    }
}
