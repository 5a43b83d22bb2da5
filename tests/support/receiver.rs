//! A real HTTP receiver for threshold alerts on 127.0.0.1: HTTP/1.1 with
//! keep-alive, answering 200 — or 503 while it is "down" — and keeping every
//! POST it saw (its event id, signature and body).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One POST the receiver saw.
#[derive(Clone, Debug)]
pub(crate) struct Post {
    /// `x-ctxbudget-event-id`.
    pub event_id: String,
    /// `x-ctxbudget-signature`.
    pub signature: Option<String>,
    /// The body.
    pub body: Vec<u8>,
    /// Whether it was answered 2xx.
    pub accepted: bool,
}

impl Post {
    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("an alert is JSON")
    }
}

#[derive(Default)]
struct State {
    posts: Vec<Post>,
    down: bool,
}

/// The receiver, stopped on drop.
pub(crate) struct Receiver {
    /// Its URL.
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Listens on a free port.
    pub(crate) async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let state: Arc<Mutex<State>> = Arc::default();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, shared.clone()));
            }
        });
        Receiver { url, state, task }
    }

    /// While down, every POST is answered 503.
    pub(crate) fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    /// Every POST seen so far.
    pub(crate) fn posts(&self) -> Vec<Post> {
        self.state.lock().unwrap().posts.clone()
    }

    /// The POSTs answered 2xx.
    pub(crate) fn accepted(&self) -> Vec<Post> {
        self.posts().into_iter().filter(|p| p.accepted).collect()
    }

    /// Waits until `n` POSTs were accepted (at most `within`), then a little
    /// longer for any that should not come; the accepted ones.
    pub(crate) async fn await_accepted(&self, n: usize, within: Duration) -> Vec<Post> {
        let end = Instant::now() + within;
        while self.accepted().len() < n && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        self.accepted()
    }

    /// Waits until some POST was refused (while down).
    pub(crate) async fn await_refused(&self, within: Duration) {
        let end = Instant::now() + within;
        while !self.posts().iter().any(|p| !p.accepted) {
            assert!(
                Instant::now() < end,
                "no POST reached the receiver while it was down"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Serves one connection's requests until it closes.
async fn serve(conn: TcpStream, state: Arc<Mutex<State>>) {
    let mut conn = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let (mut length, mut event_id, mut signature) = (0usize, String::new(), None);
        loop {
            let mut header = String::new();
            if conn.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim().to_owned();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "x-ctxbudget-event-id" => event_id = value,
                "x-ctxbudget-signature" => signature = Some(value),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        if conn.read_exact(&mut body).await.is_err() {
            return;
        }
        let accepted = {
            let mut s = state.lock().unwrap();
            let accepted = !s.down;
            s.posts.push(Post {
                event_id,
                signature,
                body,
                accepted,
            });
            accepted
        };
        let status = match accepted {
            true => "200 OK",
            false => "503 Service Unavailable",
        };
        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        if conn.get_mut().write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
