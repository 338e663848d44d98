//! A collector's health endpoint, played by the test: real HTTP/1.1 on
//! `127.0.0.1:0`, answering every request with the status the test sets
//! (0: close the connection without an answer), and logging each answer with
//! the moment it was sent, on the test's monotonic clock.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

pub struct HealthEndpoint {
    /// `http://127.0.0.1:PORT/stats`, for `--collector-health-url`.
    pub url: String,
    status: Arc<AtomicU16>,
    answers: Arc<Mutex<Vec<(Instant, u16)>>>,
}

impl HealthEndpoint {
    pub async fn start(status: u16) -> HealthEndpoint {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/stats", listener.local_addr().unwrap());
        let status = Arc::new(AtomicU16::new(status));
        let answers: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
        let (current, log) = (status.clone(), answers.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (current, log) = (current.clone(), log.clone());
                tokio::spawn(async move {
                    // One request per connection: read its head, answer, close.
                    if super::read_head(&mut socket).await.is_none() {
                        return;
                    }
                    let status = current.load(Ordering::SeqCst);
                    log.lock().unwrap().push((Instant::now(), status));
                    if status == 0 {
                        return;
                    }
                    let body = if status < 300 { "{\"beat\":{}}" } else { "" };
                    let response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        HealthEndpoint {
            url,
            status,
            answers,
        }
    }

    /// From now on, answer `status`; returns when the switch happened.
    pub fn set(&self, status: u16) -> Instant {
        self.status.store(status, Ordering::SeqCst);
        Instant::now()
    }

    /// Every answer so far: when it was sent, and its status.
    pub fn answers(&self) -> Vec<(Instant, u16)> {
        self.answers.lock().unwrap().clone()
    }

    /// Answers with `status` sent within `[from, to]`.
    pub fn count(&self, status: u16, from: Instant, to: Instant) -> usize {
        self.answers()
            .iter()
            .filter(|(at, s)| *s == status && *at >= from && *at <= to)
            .count()
    }
}
