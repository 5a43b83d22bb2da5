//! The real `ctxbudget serve` binary as a child process: its gRPC and metrics
//! listeners on free ports, its log captured to a file, killed on drop.

use super::free_port;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A running `ctxbudget serve`.
pub(crate) struct Service {
    child: Child,
    /// gRPC address.
    pub addr: SocketAddr,
    /// Prometheus address.
    pub metrics: SocketAddr,
    dir: PathBuf,
}

impl Service {
    /// Starts the binary with `config` as its configuration file and the store
    /// at `redis_url` (memory without one), and waits until /metrics answers.
    pub(crate) fn start(name: &str, config: &str, redis_url: Option<&str>) -> Self {
        Self::start_with(name, config, redis_url, &[])
    }

    /// [`Service::start`] with extra `serve` arguments (e.g. `--log-format json`).
    pub(crate) fn start_with(
        name: &str,
        config: &str,
        redis_url: Option<&str>,
        extra: &[&str],
    ) -> Self {
        // A free port can be taken by another test between our pick and the
        // child's bind: then start again on other ports.
        for _ in 0..5 {
            let dir = std::env::temp_dir().join(format!(
                "ctxbudget-svc-{name}-{}-{}",
                std::process::id(),
                free_port()
            ));
            match Self::spawn(&dir, config, redis_url, extra) {
                Ok(service) => return service,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("ctxbudget exited with {log}"),
            }
        }
        panic!("ctxbudget found no free ports in 5 tries");
    }

    /// One start in `dir` on freshly picked ports: the service once /metrics
    /// answers, or its exit status and log if it exited first (its directory
    /// then goes with it).
    fn spawn(
        dir: &std::path::Path,
        config: &str,
        redis_url: Option<&str>,
        extra: &[&str],
    ) -> Result<Self, String> {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join("ctxbudget.toml");
        std::fs::write(&file, config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbudget"));
        command
            .args(["serve", "--listen", &addr.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .arg("--config")
            .arg(&file)
            .env_remove("CTXBUDGET_REDIS_URL")
            .args(extra)
            .env("RUST_LOG", "info,ctxbudget=debug")
            .stdout(std::fs::File::create(dir.join("stdout.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap());
        if let Some(url) = redis_url {
            command.args(["--redis-url", url]);
        }
        let child = command.spawn().expect("the ctxbudget binary starts");
        let mut service = Service {
            child,
            addr,
            metrics,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // The binary binds gRPC before /metrics; both must answer here, as a
        // port lost to another test between our pick and the bind ends it.
        // The log's line that its own /metrics is bound comes first: the
        // process that took the port from it would answer a scrape too.
        let bound = format!("metrics at http://{metrics}/metrics");
        while !service.log().contains(&bound)
            || service.scrape().is_none()
            || !service.accepts_grpc()
        {
            if let Ok(Some(status)) = service.child.try_wait() {
                return Err(format!("{status}:\n{}", service.log()));
            }
            assert!(Instant::now() < deadline, "no /metrics:\n{}", service.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(service)
    }

    /// Whether the gRPC port accepts a connection.
    fn accepts_grpc(&self) -> bool {
        std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).is_ok()
    }

    /// The text of `GET /metrics`, if it answers.
    pub(crate) fn scrape(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect_timeout(&self.metrics, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    }

    /// The value of the series `name` whose labels include every `labels`
    /// pair (summed over the others), if any matches.
    pub(crate) fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.scrape()?;
        let mut found = None;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (series_name, series_labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if series_name != name {
                continue;
            }
            let matches = labels
                .iter()
                .all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")));
            if matches && let Ok(v) = value.parse::<f64>() {
                found = Some(found.unwrap_or(0.0) + v);
            }
        }
        found
    }

    /// Waits up to `within` for `name{labels}` to satisfy `check`; the last
    /// value seen, or a panic naming what was expected.
    pub(crate) fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        within: Duration,
        what: &str,
        check: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let value = self.metric(name, labels);
            if let Some(v) = value
                && check(v)
            {
                return v;
            }
            if Instant::now() > deadline {
                panic!("{what}: {name}{labels:?} is {value:?} after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything the service logged so far.
    pub(crate) fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        read("stdout.log") + &read("stderr.log")
    }

    /// Still running?
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
