//! `leader-gate file-gate SRC:DST…`: files that exist only while this pod
//! leads, for collectors that live-reload a directory (Metricbeat
//! `config.modules` with `reload.enabled`, Prometheus `file_sd_configs`).
//!
//! While the validity rule of [`feed`] says leading, a copy of each SRC is at
//! its DST, written atomically (a temporary file in DST's directory, fsync,
//! rename, fsync of the directory), and rewritten when SRC changes or the
//! copy was removed or changed by someone else (checked at every renewal).
//! Each DST is removed the moment leadership ends or can no longer be
//! confirmed — also when the sidecar dies without a word, since validity
//! then runs out — and at start-up, before anything else (a stale copy from
//! a killed run), and on SIGTERM/SIGINT. With `--reload-url` one HTTP POST
//! follows every change, in order (Prometheus `/-/reload`, Fluent Bit,
//! Vector); it is sent from a task of its own, so a collector slow to answer
//! never delays a removal.
//!
//! [`feed`]: crate::client::feed

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::Method;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::client::feed::Feed;
use crate::client::url::GateUrl;

/// How long a reload POST may take.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

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
    let mut gate = Gate::new(options);
    // Before anything else: a copy left by a run that was killed is stale
    // until proven otherwise. The collector hears of it (and answers)
    // before this run even subscribes.
    if gate.remove_all("stale copies from an earlier run")
        && let Some(url) = &gate.options.reload
    {
        reload(url).await;
    }
    let reloader = Reloader::start(gate.options.reload.clone());
    let mut feed = Feed::new(gate.options.url.clone());
    loop {
        let leading = feed.leading().is_some();
        let changed = if leading {
            gate.write_all()
        } else {
            gate.remove_all("leadership ended or cannot be confirmed")
        };
        if changed {
            reloader.changed();
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
    reloader.finish().await;
}

/// Sends one reload POST per change, in order, in a task of its own: a
/// collector that answers its reload slowly (Prometheus answers once the
/// whole configuration is reloaded) must never hold up a removal.
struct Reloader {
    queue: Option<mpsc::UnboundedSender<()>>,
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
        let (queue, mut changes) = mpsc::unbounded_channel::<()>();
        let worker = tokio::spawn(async move {
            while changes.recv().await.is_some() {
                reload(&url).await;
            }
        });
        Self {
            queue: Some(queue),
            worker: Some(worker),
        }
    }

    /// Something changed: the collector is told once, after what came before.
    fn changed(&self) {
        if let Some(queue) = &self.queue {
            let _ = queue.send(());
        }
    }

    /// Sends what is queued, for a bounded time.
    async fn finish(mut self) {
        self.queue = None;
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
    slots: Vec<Slot>,
}

/// What one DST holds, as far as this process knows.
#[derive(Clone, Default)]
struct Slot {
    /// The content written there (None: nothing of ours).
    written: Option<Vec<u8>>,
    /// The last error said about it, so a lasting one is said once.
    complaint: Option<String>,
}

// === impl Gate ===

impl Gate {
    fn new(options: FileGateOptions) -> Self {
        let slots = vec![Slot::default(); options.mappings.len()];
        Self { options, slots }
    }

    /// Puts a current copy of every SRC at its DST; whether anything changed.
    fn write_all(&mut self) -> bool {
        let mut changed = false;
        for (mapping, slot) in self.options.mappings.iter().zip(&mut self.slots) {
            let result = std::fs::read(&mapping.src)
                .map_err(|e| format!("cannot read {}: {e}", mapping.src.display()))
                .and_then(|content| {
                    // What is on disk, not only what was written: someone
                    // may have removed or changed the copy since.
                    if slot.written.as_ref() == Some(&content)
                        && std::fs::read(&mapping.dst).is_ok_and(|held| held == content)
                    {
                        return Ok(None);
                    }
                    write_atomically(mapping, &content, self.options.mode)
                        .map(|()| Some(content))
                        .map_err(|e| format!("cannot write {}: {e}", mapping.dst.display()))
                });
            match result {
                Ok(None) => slot.complaint = None,
                Ok(Some(content)) => {
                    let what = if slot.written.as_ref() == Some(&content) {
                        "restored (removed or changed by someone else)"
                    } else {
                        "wrote"
                    };
                    log(&format!("leading: {what} {}", mapping.dst.display()));
                    slot.written = Some(content);
                    slot.complaint = None;
                    changed = true;
                }
                Err(complaint) => {
                    if slot.complaint.as_ref() != Some(&complaint) {
                        log(&complaint);
                        slot.complaint = Some(complaint);
                    }
                }
            }
        }
        changed
    }

    /// Removes every DST (and any temporary file); whether one existed.
    fn remove_all(&mut self, why: &str) -> bool {
        let mut changed = false;
        for (mapping, slot) in self.options.mappings.iter().zip(&mut self.slots) {
            let _ = std::fs::remove_file(mapping.temporary());
            match std::fs::remove_file(&mapping.dst) {
                Ok(()) => {
                    log(&format!("{why}: removed {}", mapping.dst.display()));
                    let _ = sync_dir(parent(&mapping.dst));
                    changed = true;
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => log(&format!("cannot remove {}: {error}", mapping.dst.display())),
            }
            slot.written = None;
        }
        changed
    }
}

/// Temporary file in DST's directory, fsync, rename, fsync the directory:
/// a reader sees the old file or the whole new one, never a part.
fn write_atomically(mapping: &Mapping, content: &[u8], mode: u32) -> std::io::Result<()> {
    let temporary = mapping.temporary();
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(content)?;
        // The umask may have narrowed `mode`.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        std::fs::rename(&temporary, &mapping.dst)?;
        sync_dir(parent(&mapping.dst))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
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

fn log(message: &str) {
    eprintln!("leader-gate file-gate: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn copies_appear_whole_with_the_mode_and_removal_reports_what_it_did() {
        let d = dir("copy");
        let src = d.join("src.yml");
        std::fs::write(&src, "a: 1\n").unwrap();
        let mapping =
            Mapping::parse(&format!("{}:{}/dst.yml", src.display(), d.display())).unwrap();
        let mut gate = Gate::new(FileGateOptions {
            url: GateUrl::parse("http://127.0.0.1:9").unwrap(),
            reload: None,
            mode: 0o640,
            mappings: vec![mapping.clone()],
        });
        assert!(gate.write_all());
        assert!(!gate.write_all(), "unchanged SRC: nothing to do");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 1\n");
        let mode = std::fs::metadata(&mapping.dst)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        std::fs::write(&src, "a: 2\n").unwrap();
        assert!(gate.write_all(), "a changed SRC is copied again");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        assert!(!mapping.temporary().exists());
        // Someone else removes or edits the copy: it is put back.
        std::fs::remove_file(&mapping.dst).unwrap();
        assert!(gate.write_all(), "a removed copy is restored");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        std::fs::write(&mapping.dst, "edited\n").unwrap();
        assert!(gate.write_all(), "an edited copy is restored");
        assert_eq!(std::fs::read_to_string(&mapping.dst).unwrap(), "a: 2\n");
        assert!(!gate.write_all());
        assert!(gate.remove_all("test"));
        assert!(!mapping.dst.exists());
        assert!(!gate.remove_all("test"), "nothing left to remove");
    }
}
