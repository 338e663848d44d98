//! A TCP proxy a test can cut: every open connection is dropped at once, and
//! new ones are refused while it is down — a disconnect, without touching
//! either end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (is_down, open) = (down.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_down.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                open.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            addr,
            down,
            connections,
        }
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
}
