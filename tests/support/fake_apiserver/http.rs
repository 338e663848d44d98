//! A minimal HTTP/1.1 server side: request parsing and response writing on a raw socket,
//! so that faults can cut a response anywhere.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A parsed request.
#[derive(Debug)]
pub(super) struct Request {
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    pub path: String,
    /// Decoded query pairs, in order (empty pairs, as in kube-rs' `?&watch=true`, dropped).
    pub query: Vec<(String, String)>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the connection may serve another request after this one.
    pub keep_alive: bool,
}

impl Request {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Bytes the fake API servers of this process wrote to clients (response heads,
/// bodies and watch chunks), for the benchmarks' load figures.
pub(super) static BYTES_WRITTEN: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

fn count(n: usize) {
    BYTES_WRITTEN.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, budget: &mut usize) -> io::Result<String> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(*budget as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if n > *budget {
        return Err(bad("request head too large"));
    }
    *budget -= n;
    if n == 0 || !buf.ends_with(b"\n") {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = String::from_utf8(buf).map_err(|_| bad("request head is not UTF-8"))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Reads one request. `Ok(None)` when the client closed the connection between requests.
pub(super) async fn read_request<R, W>(r: &mut R, w: &mut W) -> io::Result<Option<Request>>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut budget = MAX_HEAD;
    // Skip empty lines before a request line (allowed by RFC 9112).
    let request_line = loop {
        if r.fill_buf().await?.is_empty() {
            return Ok(None);
        }
        let line = read_line(r, &mut budget).await?;
        if !line.is_empty() {
            break line;
        }
    };
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, &mut budget).await?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| bad("malformed header"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let connection = header("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if version == "HTTP/1.0" {
        connection.contains("keep-alive")
    } else {
        !connection.contains("close")
    };
    if header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")) {
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        w.flush().await?;
    }
    let chunked =
        header("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut b = MAX_HEAD;
            let size_line = read_line(r, &mut b).await?;
            let size_hex = size_line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16).map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                // Trailers until an empty line.
                while !read_line(r, &mut b).await?.is_empty() {}
                break;
            }
            if body.len() + size > MAX_BODY {
                return Err(bad("body too large"));
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..]).await?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).await?;
        }
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| bad("bad content-length"))?;
        if len > MAX_BODY {
            return Err(bad("body too large"));
        }
        body.resize(len, 0);
        r.read_exact(&mut body).await?;
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), parse_query(q)),
        None => (target.to_string(), Vec::new()),
    };
    Ok(Some(Request {
        method: method.to_string(),
        target: target.to_string(),
        path,
        query,
        headers,
        body,
        keep_alive,
    }))
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space).
pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

fn head(code: u16, headers: &[(&str, String)], framing: &str, keep_alive: bool) -> String {
    let mut s = format!("HTTP/1.1 {code} {}\r\n", reason_phrase(code));
    s.push_str("cache-control: no-cache, private\r\n");
    s.push_str("content-type: application/json\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str(framing);
    if !keep_alive {
        s.push_str("connection: close\r\n");
    }
    s.push_str("\r\n");
    s
}

/// Writes a complete response with `content-length`.
pub(super) async fn write_full<W: AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
    headers: &[(&str, String)],
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let h = head(
        code,
        headers,
        &format!("content-length: {}\r\n", body.len()),
        keep_alive,
    );
    let mut buf = h.into_bytes();
    buf.extend_from_slice(body);
    count(buf.len());
    w.write_all(&buf).await?;
    w.flush().await
}

/// Writes the head and only half of the body (the caller then closes the connection):
/// the client sees an incomplete message.
pub(super) async fn write_truncated<W: AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> io::Result<()> {
    let h = head(
        code,
        headers,
        &format!("content-length: {}\r\n", body.len().max(2)),
        false,
    );
    let mut buf = h.into_bytes();
    buf.extend_from_slice(&body[..body.len() / 2]);
    count(buf.len());
    w.write_all(&buf).await?;
    w.flush().await?;
    w.shutdown().await
}

/// Writes the head of a chunked (streaming) response.
pub(super) async fn write_stream_head<W: AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
) -> io::Result<()> {
    let h = head(code, &[], "transfer-encoding: chunked\r\n", true);
    count(h.len());
    w.write_all(h.as_bytes()).await?;
    w.flush().await
}

/// Writes one chunk and flushes it (one watch event per chunk, like the real server).
pub(super) async fn write_chunk<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8]) -> io::Result<()> {
    let mut buf = format!("{:x}\r\n", data.len()).into_bytes();
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
    count(buf.len());
    w.write_all(&buf).await?;
    w.flush().await
}

/// Ends a chunked response.
pub(super) async fn write_last_chunk<W: AsyncWrite + Unpin>(w: &mut W) -> io::Result<()> {
    count(5);
    w.write_all(b"0\r\n\r\n").await?;
    w.flush().await
}

/// Resolves when the client closes its side (or the connection fails); stays pending if it
/// sends more data (that is left buffered for the next request).
pub(super) async fn client_gone<R: AsyncBufRead + Unpin>(r: &mut R) {
    match r.fill_buf().await {
        Ok([]) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}
