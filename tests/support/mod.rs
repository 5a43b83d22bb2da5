//! Test fixtures: a real `redis-server` on a free port, a real gRPC server on
//! port 0 (memory or Redis store), and a tonic client.
#![allow(dead_code)]

use ctxbudget::config::{FileConfig, Flags, Settings};
use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub(crate) mod cluster;
pub(crate) mod ext_proc;
pub(crate) mod hold;
pub(crate) mod process;
pub(crate) mod receiver;

/// A `redis-server` child process on 127.0.0.1, killed on drop. Fault tests
/// kill, restart, freeze and thaw it.
pub(crate) struct RedisServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

fn redis_server_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server was not found on PATH. Install it (Debian/Ubuntu: \
                 `sudo apt-get install -y redis-server`) or run `scripts/test.sh`, \
                 which installs it when missing."
            )
        })
}

/// A port nothing listens on right now.
pub(crate) fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

impl RedisServer {
    /// Starts a throwaway Redis (no persistence) and waits until it answers PING.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts Redis with extra `--name value` arguments.
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        for _attempt in 0..5 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("ctxbudget-redis-{port}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir for redis");
            let child = spawn_redis(port, &dir, &args);
            let mut server = RedisServer {
                child,
                port,
                dir,
                args: args.clone(),
            };
            if server.wait_ready(Duration::from_secs(5)) {
                return server;
            }
            let _ = server.child.kill();
        }
        panic!("redis-server did not start on any free port");
    }

    /// Starts Redis on `port` (one a test kept free for it, e.g. to start the
    /// service before Redis).
    pub(crate) fn start_on(port: u16) -> Self {
        Self::start_on_with(port, &[])
    }

    /// Starts Redis on `port` with extra `--name value` arguments.
    pub(crate) fn start_on_with(port: u16, extra: &[&str]) -> Self {
        Self::try_start_on_with(port, extra)
            .unwrap_or_else(|| panic!("redis-server did not start on port {port}"))
    }

    /// [`Self::start_on_with`], or `None` when redis-server exits or does not
    /// answer (a port another process took between the pick and the bind).
    pub(crate) fn try_start_on_with(port: u16, extra: &[&str]) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("ctxbudget-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir for redis");
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let child = spawn_redis(port, &dir, &args);
        let mut server = RedisServer {
            child,
            port,
            dir,
            args,
        };
        server.wait_ready(Duration::from_secs(10)).then_some(server)
    }

    /// Kills it (SIGKILL: no shutdown, no save) and waits until it is gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port, directory and arguments (with
    /// `--appendonly yes` among them, its data survives).
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.child = spawn_redis(self.port, &self.dir, &self.args);
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// SIGSTOP: it holds its connections but answers nothing.
    pub(crate) fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: it answers again, queued commands first.
    pub(crate) fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} redis-server");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A synchronous connection for assertions.
    pub(crate) fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to test redis")
    }
}

fn spawn_redis(port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
    Command::new(redis_server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Which store a test runs against.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Backend {
    Memory,
    Redis,
    /// A local three-master Redis Cluster.
    Cluster,
}

/// A running service and a client to it.
pub(crate) struct Harness {
    pub addr: SocketAddr,
    pub client: BudgetServiceClient<Channel>,
    pub redis: Option<RedisServer>,
    /// The cluster behind a [`Backend::Cluster`] service.
    pub cluster: Option<cluster::RedisCluster>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Test defaults: no jitter so retry_after is exact; no global limits; a
/// generous store deadline (debug builds, many tests at once on 2 cores).
pub(crate) const TEST_RESERVATIONS: &str = r#"
[store]
timeout_ms = 5000

[reservations]
default_lease_ttl_ms = 30000
max_lease_ttl_ms = 60000
retention_ms = 60000
idempotency_ttl_ms = 60000
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[global]
"#;

/// Settings from the test defaults plus `toml` (which may replace sections).
pub(crate) fn settings(toml: &str, redis_url: Option<String>) -> Settings {
    let file = FileConfig::built_in()
        .overlay(FileConfig::parse(TEST_RESERVATIONS, "test defaults").unwrap())
        .overlay(FileConfig::parse(toml, "test config").expect("test config parses"));
    file.settings(Flags {
        redis_url,
        ..Flags::default()
    })
    .expect("test config is valid")
}

impl Harness {
    /// Starts a service over `backend` configured by `toml`.
    pub(crate) async fn start(backend: Backend, toml: &str) -> Self {
        if let Backend::Cluster = backend {
            let cluster = cluster::RedisCluster::start(false);
            let file = FileConfig::built_in()
                .overlay(FileConfig::parse(TEST_RESERVATIONS, "test defaults").unwrap())
                .overlay(FileConfig::parse(toml, "test config").expect("test config parses"));
            let settings = file
                .settings(Flags {
                    redis_cluster_nodes: cluster.urls(),
                    ..Flags::default()
                })
                .expect("test config is valid");
            let mut h = Self::start_with(settings, None).await;
            h.cluster = Some(cluster);
            return h;
        }
        let redis = match backend {
            Backend::Memory | Backend::Cluster => None,
            Backend::Redis => Some(RedisServer::start()),
        };
        let settings = settings(toml, redis.as_ref().map(RedisServer::url));
        Self::start_with(settings, redis).await
    }

    /// Starts a service with explicit settings, keeping `redis` alive with it.
    pub(crate) async fn start_with(settings: Settings, redis: Option<RedisServer>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            ctxbudget::server::run(settings, listener, async {
                let _ = rx.await;
            })
            .await
            .expect("server runs");
        });
        let client = connect(addr).await;
        Harness {
            addr,
            client,
            redis,
            cluster: None,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// The operator CLI's flags that reach this service's store: none for
    /// the memory store (which has no shared configuration).
    pub(crate) fn store_args(&self) -> Option<Vec<String>> {
        if let Some(r) = &self.redis {
            return Some(vec!["--redis-url".into(), r.url()]);
        }
        let c = self.cluster.as_ref()?;
        Some(vec!["--redis-cluster-nodes".into(), c.urls().join(",")])
    }

    /// Runs the operator CLI (`ctxbudget ARGS…`) against this service's
    /// shared store, as `test-operator`.
    pub(crate) async fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        use clap::Parser;
        let store = self.store_args().expect("a shared store");
        let mut argv = vec!["ctxbudget"];
        argv.extend_from_slice(args);
        argv.extend(store.iter().map(String::as_str));
        argv.extend_from_slice(&["--actor", "test-operator"]);
        ctxbudget::cli::run(ctxbudget::cli::Cli::try_parse_from(argv)?).await
    }

    /// Stops the server and waits for it to finish.
    pub(crate) async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A client to `addr`, once the server reports SERVING on the gRPC health service.
pub(crate) async fn connect(addr: SocketAddr) -> BudgetServiceClient<Channel> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(channel) => {
                let check = HealthClient::new(channel.clone())
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await;
                match check {
                    Ok(r) if r.get_ref().status() == ServingStatus::Serving => {
                        return BudgetServiceClient::new(channel);
                    }
                    other => format!("{other:?}"),
                }
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            panic!("test server at {addr} never became ready: {last}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reservation request with the usual test ids.
pub(crate) fn reserve(
    tenant: &str,
    user: &str,
    tier: &str,
    prompt: u64,
    output: u64,
) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        tenant_id: tenant.into(),
        user_id: user.into(),
        tier: tier.into(),
        model: "gpt-4o".into(),
        prompt_tokens: Some(prompt),
        max_output_tokens: output,
        ..Default::default()
    }
}

/// The `LimitStatus` of (level, dimension, period) in a list.
pub(crate) fn limit(
    limits: &[pb::LimitStatus],
    level: pb::Level,
    dimension: pb::Dimension,
    period: u64,
) -> pb::LimitStatus {
    limits
        .iter()
        .find(|l| {
            l.level() == level
                && l.dimension() == dimension
                && l.period_seconds == period
                && l.model_group.is_empty()
        })
        .unwrap_or_else(|| panic!("no {level:?} {dimension:?} {period}s limit in {limits:#?}"))
        .clone()
}

/// Sends `body` as the raw bytes of a gRPC request to `method` (e.g.
/// `/ctxbudget.v1.BudgetService/CheckAndReserve`), with a bearer `token` if
/// given, and returns the raw reply: for bytes no generated client would send.
pub(crate) async fn raw_call(
    addr: SocketAddr,
    method: &'static str,
    body: Vec<u8>,
    token: Option<&str>,
) -> Result<Vec<u8>, tonic::Status> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(body);
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static(method);
    grpc.unary(request, path, Raw).await.map(|r| r.into_inner())
}

/// A codec that passes bytes through untouched.
#[derive(Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}
