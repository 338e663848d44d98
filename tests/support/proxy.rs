//! A TCP proxy a test can break without touching either end:
//!
//! - [`Proxy::cut`]: every open connection is dropped at once, and new ones
//!   are refused while it is down (until [`Proxy::up`]) — a disconnect;
//! - [`Proxy::stall`]: connections stay open (and new ones are accepted) but
//!   nothing is forwarded until [`Proxy::resume`] — a hung network path,
//!   which neither end can tell from silence;
//! - [`Proxy::retarget`]: later connections go to another upstream (a
//!   restarted process on a new port), as a Service would route them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    stalled: watch::Sender<bool>,
    upstream: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    /// Connections accepted and forwarded so far (refused ones not counted).
    accepted: Arc<AtomicUsize>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let (stalled, _) = watch::channel(false);
        let upstream = Arc::new(Mutex::new(upstream));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (is_down, open, target) = (down.clone(), connections.clone(), upstream.clone());
        let stall = stalled.subscribe();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if is_down.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                count.fetch_add(1, Ordering::SeqCst);
                let upstream = *target.lock().unwrap();
                let stall = stall.clone();
                let task = tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(upstream).await {
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = outbound.into_split();
                        tokio::join!(
                            pump(in_read, out_write, stall.clone()),
                            pump(out_read, in_write, stall),
                        );
                    }
                });
                open.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            addr,
            down,
            stalled,
            upstream,
            connections,
            accepted,
        }
    }

    /// How many connections were accepted (and forwarded) so far: a client
    /// that reconnects after [`Self::cut`] adds one.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// `http://<addr>`, for a client's `--url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every open connection and refuses new ones until [`Self::up`].
    pub fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    pub fn up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }

    /// Keeps every connection open but forwards nothing, either way, until
    /// [`Self::resume`]; new connections are accepted and held the same way.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again, what was held back first.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// New connections go to `upstream` from now on.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }
}

/// Copies one direction, holding each chunk while the proxy is stalled.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut stalled: watch::Receiver<bool>) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stalled.wait_for(|stalled| !stalled).await.is_err() {
            break;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
