//! A TCP proxy in front of a Redis that can keep one store call in flight:
//! armed with a marker, it holds the first chunk a client sends that
//! contains the marker (and everything that connection sends after it)
//! until the test releases it. Replies pass untouched. A test uses it to
//! act at the moment a script has been sent and not yet run.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy; dropped, it accepts no more connections.
pub(crate) struct HoldingProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    /// Bytes whose first sighting is held.
    marker: Mutex<Option<Vec<u8>>>,
    /// A chunk is held now.
    holding: watch::Sender<bool>,
    /// Held chunks may go on.
    released: watch::Sender<bool>,
}

impl Shared {
    /// Whether `chunk` is the one to hold (the marker is then spent).
    fn hold(&self, chunk: &[u8]) -> bool {
        let mut marker = self.marker.lock().unwrap_or_else(PoisonError::into_inner);
        let marked = marker
            .as_deref()
            .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m));
        if marked {
            *marker = None;
        }
        marked
    }
}

impl HoldingProxy {
    /// A proxy on a free local port in front of `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            marker: Mutex::new(None),
            holding: watch::channel(false).0,
            released: watch::channel(false).0,
        });
        let for_accept = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(pipe(client, upstream, for_accept.clone()));
            }
        });
        HoldingProxy {
            addr,
            shared,
            accept,
        }
    }

    /// Its address as a Redis URL.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds the next chunk a client sends that contains `marker`.
    pub(crate) fn arm(&self, marker: &str) {
        *self
            .shared
            .marker
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(marker.as_bytes().to_vec());
    }

    /// Waits until a chunk is held (`within` at most, else panics).
    pub(crate) async fn held(&self, within: Duration) {
        let mut holding = self.shared.holding.subscribe();
        tokio::time::timeout(within, holding.wait_for(|h| *h))
            .await
            .expect("a call with the marker was sent within the time")
            .expect("the proxy is running");
    }

    /// Lets the held chunk, and all behind it, go on.
    pub(crate) fn release(&self) {
        self.shared.released.send_replace(true);
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.release();
    }
}

/// Carries one client connection to `upstream`, holding what `shared` says.
async fn pipe(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let replies = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from_client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.hold(&buf[..n]) {
            shared.holding.send_replace(true);
            let mut released = shared.released.subscribe();
            let _ = released.wait_for(|r| *r).await;
        }
        if to_server.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    replies.abort();
}
