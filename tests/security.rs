//! Who may call: bearer tokens (missing, wrong, old and new during a rotation,
//! reloaded on SIGHUP), tokens bound to tenants, TLS and mutual TLS on the gRPC
//! listener, and Redis reached with an ACL user — whose password never shows.
#![allow(
    clippy::too_many_lines,
    reason = "a test is one scenario, read from start to end"
)]

mod support;

use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use std::time::Duration;
use support::{Backend, Harness, RedisServer, reserve};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request};

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-fedcba9876543210";

const TOKENS: &str = r#"
[[auth.tokens]]
name = "gateway-old"
token = "old-token-0123456789abcdef"

[[auth.tokens]]
name = "gateway-acme"
token = "new-token-fedcba9876543210"
tenants = ["acme"]
"#;

/// `message` carrying `authorization: Bearer <token>` when a token is given.
fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    request
}

fn status(tenant: &str) -> pb::GetStatusRequest {
    pb::GetStatusRequest {
        tenant_id: tenant.into(),
        user_id: "u".into(),
        tier: "free".into(),
        ..Default::default()
    }
}

/// Requests `tenant` has left this minute.
async fn requests_left(client: &mut BudgetServiceClient<Channel>, tenant: &str) -> i64 {
    let s = client
        .get_status(with_token(status(tenant), Some(OLD)))
        .await
        .expect("status with a valid token")
        .into_inner();
    support::limit(&s.limits, pb::Level::Tenant, pb::Dimension::Requests, 60).remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_valid_token_are_unauthenticated_and_touch_nothing() {
    let h = Harness::start(Backend::Memory, TOKENS).await;
    let mut c = h.client.clone();
    let before = requests_left(&mut c, "globex").await;

    for token in [None, Some("wrong-token-0000000000000"), Some("")] {
        let err = c
            .check_and_reserve(with_token(reserve("globex", "u", "free", 10, 10), token))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{token:?}: {err:?}");
        assert!(
            err.message().contains("bearer"),
            "says what to send: {err:?}"
        );
        assert!(!err.message().contains(OLD) && !err.message().contains(NEW));
    }
    // A token without the Bearer scheme is not accepted either.
    let mut raw = Request::new(reserve("globex", "u", "free", 10, 10));
    raw.metadata_mut()
        .insert("authorization", OLD.parse().unwrap());
    assert_eq!(
        c.check_and_reserve(raw).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        requests_left(&mut c, "globex").await,
        before,
        "nothing reserved"
    );

    // The old token and the new one both work during a rotation.
    let old = c
        .check_and_reserve(with_token(
            reserve("globex", "u", "free", 10, 10),
            Some(OLD),
        ))
        .await
        .unwrap()
        .into_inner();
    let new = c
        .check_and_reserve(with_token(reserve("acme", "u", "free", 10, 10), Some(NEW)))
        .await
        .unwrap()
        .into_inner();
    assert!(old.allowed && new.allowed);
    assert_eq!(requests_left(&mut c, "globex").await, before - 1);

    // Settling without a token fails and leaves the reservation open.
    let commit = pb::CommitRequest {
        reservation_id: old.reservation_id.clone(),
        prompt_tokens: 10,
        completion_tokens: 5,
        ..Default::default()
    };
    let err = c
        .commit(with_token(commit.clone(), None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let refund = pb::RefundRequest {
        reservation_id: old.reservation_id.clone(),
    };
    assert_eq!(
        c.refund(with_token(refund, Some("nope-nope-nope-nope")))
            .await
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );
    let applied = c
        .commit(with_token(commit, Some(OLD)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applied.outcome(), pb::Outcome::Applied, "still open");

    // Health stays open to probes without a token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        Channel::from_shared(format!("http://{}", h.addr))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health needs no token");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bound_to_tenants_cannot_act_for_another() {
    let h = Harness::start(Backend::Redis, TOKENS).await;
    let mut c = h.client.clone();
    let denied = |err: tonic::Status, what: &str| {
        assert_eq!(err.code(), Code::PermissionDenied, "{what}: {err:?}");
        assert!(err.message().contains("gateway-acme"), "{what}: {err:?}");
    };
    let globex = c
        .check_and_reserve(with_token(
            reserve("globex", "u", "free", 10, 10),
            Some(OLD),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(globex.allowed);
    let before = requests_left(&mut c, "globex").await;

    let e = c
        .check_and_reserve(with_token(
            reserve("globex", "u", "free", 10, 10),
            Some(NEW),
        ))
        .await
        .unwrap_err();
    denied(e, "reserve for another tenant");
    let e = c
        .get_status(with_token(status("globex"), Some(NEW)))
        .await
        .unwrap_err();
    denied(e, "status of another tenant");
    let id = globex.reservation_id.clone();
    let e = c
        .commit(with_token(
            pb::CommitRequest {
                reservation_id: id.clone(),
                prompt_tokens: 1,
                completion_tokens: 1,
                ..Default::default()
            },
            Some(NEW),
        ))
        .await
        .unwrap_err();
    denied(e, "commit another tenant's reservation");
    let e = c
        .refund(with_token(
            pb::RefundRequest {
                reservation_id: id.clone(),
            },
            Some(NEW),
        ))
        .await
        .unwrap_err();
    denied(e, "refund another tenant's reservation");
    let e = c
        .renew_lease(with_token(
            pb::RenewLeaseRequest {
                reservation_id: id.clone(),
                lease_ttl_ms: Some(1000),
            },
            Some(NEW),
        ))
        .await
        .unwrap_err();
    denied(e, "renew another tenant's lease");
    assert_eq!(
        requests_left(&mut c, "globex").await,
        before,
        "nothing changed"
    );

    // The reservation is untouched: its own tenant's caller still refunds it.
    let refunded = c
        .refund(with_token(
            pb::RefundRequest { reservation_id: id },
            Some(OLD),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refunded.outcome(), pb::Outcome::Applied);
    // And the bound token works for its own tenant.
    let own = c
        .check_and_reserve(with_token(reserve("acme", "u", "free", 10, 10), Some(NEW)))
        .await
        .unwrap()
        .into_inner();
    assert!(own.allowed);
    h.stop().await;
}

#[test]
fn bad_token_configurations_are_refused_without_quoting_secrets() {
    let cases = [
        (
            "[[auth.tokens]]\nname = \"a\"\ntoken = \"short-secret\"\n",
            "auth.tokens[0].token",
        ),
        (
            "[[auth.tokens]]\nname = \"a\"\ntoken = \"same-secret-0123456789\"\n\
             [[auth.tokens]]\nname = \"b\"\ntoken = \"same-secret-0123456789\"\n",
            "auth.tokens[1].token",
        ),
        (
            "[[auth.tokens]]\nname = \"a\"\ntoken = \"has a space 0123456789\"\n",
            "auth.tokens[0].token",
        ),
        (
            "[[auth.tokens]]\nname = \"a\"\ntoken = \"tenantless-0123456789\"\ntenants = []\n",
            "auth.tokens[0].tenants",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:1\"\ntls_cert = \"/x.pem\"\n",
            "server.tls_cert",
        ),
    ];
    for (toml, field) in cases {
        let err = ctxbudget::config::FileConfig::built_in()
            .overlay(ctxbudget::config::FileConfig::parse(toml, "t").unwrap())
            .settings(Default::default())
            .expect_err(toml)
            .to_string();
        assert!(err.contains(field), "{err}");
        for secret in ["short-secret", "same-secret", "has a space", "tenantless"] {
            assert!(!err.contains(secret), "quotes a secret: {err}");
        }
    }
}

/// A CA, a server certificate for localhost signed by it, and a client one.
struct Pki {
    dir: std::path::PathBuf,
    ca: String,
    client_cert: String,
    client_key: String,
}

fn pki(name: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = std::env::temp_dir().join(format!("ctxbudget-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct subjects: OpenSSL takes a leaf named like its CA for self-signed.
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ctxbudget test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].clone());
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
    let (client_cert, client_key) = leaf(vec!["gateway".into()]);
    for (file, text) in [
        ("ca.pem", ca.pem()),
        ("server.pem", server_cert),
        ("server.key", server_key),
        ("client.pem", client_cert.clone()),
        ("client.key", client_key.clone()),
    ] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    Pki {
        dir,
        ca: ca.pem(),
        client_cert,
        client_key,
    }
}

async fn start_plain_unready(
    settings: ctxbudget::config::Settings,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        ctxbudget::server::run(settings, listener, async {
            let _ = rx.await;
        })
        .await
        .expect("server runs");
    });
    (addr, tx)
}

async fn tls_client(
    addr: std::net::SocketAddr,
    pki: &Pki,
    identity: bool,
) -> Result<BudgetServiceClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    if identity {
        tls = tls.identity(Identity::from_pem(&pki.client_cert, &pki.client_key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(BudgetServiceClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_clients_with_a_certificate_from_the_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = pki("mtls");
    let path = |f: &str| pki.dir.join(f).display().to_string();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntls_client_ca = \"{}\"\n",
        path("server.pem"),
        path("server.key"),
        path("ca.pem")
    );
    let (addr, stop) = start_plain_unready(support::settings(&toml, None)).await;
    // With a client certificate: served (retry while the server starts).
    let mut served = None;
    for _ in 0..100 {
        if let Ok(mut c) = tls_client(addr, &pki, true).await
            && let Ok(r) = c
                .check_and_reserve(reserve("acme", "u", "free", 10, 10))
                .await
        {
            served = Some(r.into_inner());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served.expect("an mTLS client is served").allowed);

    // Without one: the handshake or the first call fails.
    let refused = match tls_client(addr, &pki, false).await {
        Err(_) => true,
        Ok(mut c) => c
            .check_and_reserve(reserve("acme", "u", "free", 10, 10))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate must be refused");

    // Plaintext: refused.
    let plain = async {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        BudgetServiceClient::new(channel)
            .check_and_reserve(reserve("acme", "u", "free", 10, 10))
            .await
            .map_err(|e| e.to_string())
    };
    assert!(plain.await.is_err(), "plaintext must not be served");
    let _ = stop.send(());
    let _ = std::fs::remove_dir_all(&pki.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_an_acl_user_works_and_the_password_never_shows() {
    let redis = RedisServer::start();
    let secret = "acl-pass-5f0d2c7a";
    {
        let mut admin = redis.conn();
        redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "ctxb",
                "on",
                &format!(">{secret}"),
                "~*",
                "&*",
                "+@all",
            ])
            .query::<()>(&mut admin)
            .unwrap();
        // The default user stops working: only the ACL user gets in.
        redis::cmd("ACL")
            .arg(&["SETUSER", "default", "off"])
            .query::<()>(&mut admin)
            .unwrap();
    }
    let url = format!("redis://ctxb:{secret}@127.0.0.1:{}/0", redis.port);
    let settings = support::settings("", Some(url));
    assert!(!format!("{settings:?}").contains(secret), "Debug hides it");
    let h = Harness::start_with(settings, None).await;
    let mut c = h.client.clone();
    let r = c
        .check_and_reserve(reserve("acme", "u", "free", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "served through the ACL user");
    h.stop().await;

    // A wrong password: a clear error that does not echo the password.
    let wrong = format!("redis://ctxb:not-{secret}@127.0.0.1:{}/0", redis.port);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = ctxbudget::server::run(support::settings("", Some(wrong)), listener, async {})
        .await
        .expect_err("wrong password refused")
        .to_string();
    assert!(!err.contains(secret), "{err}");
    assert!(err.contains("127.0.0.1"), "names the server: {err}");
    assert!(
        err.to_lowercase().contains("authentication"),
        "says why: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_client_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = pki("rediss");
    let path = |f: &str| pki.dir.join(f).display().to_string();
    let tls_port = support::free_port();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &path("server.pem"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.pem"),
        "--tls-auth-clients",
        "yes",
    ]);
    let url = format!("rediss://localhost:{tls_port}/0");
    let store = |files: &str| {
        format!(
            "[store]\ntimeout_ms = 5000\ntls_ca = \"{}\"\n{files}",
            path("ca.pem")
        )
    };
    let with_cert = store(&format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        path("client.pem"),
        path("client.key")
    ));
    let h = Harness::start_with(support::settings(&with_cert, Some(url.clone())), None).await;
    let mut c = h.client.clone();
    let r = c
        .check_and_reserve(reserve("acme", "u", "free", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "served over TLS to Redis");
    h.stop().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("ctxb:*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(!keys.is_empty(), "state went to that Redis: {keys:?}");

    // Without the client certificate Redis refuses the handshake: a clear error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = ctxbudget::server::run(support::settings(&store(""), Some(url)), listener, async {})
        .await
        .expect_err("no client certificate");
    assert!(err.to_string().contains("localhost"), "{err}");
    let _ = std::fs::remove_dir_all(&pki.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_tokens_and_logs_no_secret() {
    let dir = std::env::temp_dir().join(format!("ctxbudget-rotate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ctxbudget.toml");
    let log = dir.join("stdout.log");
    let tokens = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(name, token)| {
                format!("[[auth.tokens]]\nname = \"{name}\"\ntoken = \"{token}\"\n")
            })
            .collect::<String>()
    };
    std::fs::write(&file, tokens(&[("old", OLD)])).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
        .args(["serve", "--listen", &listen, "--config"])
        .arg(&file)
        .env_remove("CTXBUDGET_REDIS_URL")
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .expect("the binary starts");
    let mut c = support::connect(listen.parse().unwrap()).await;
    let code = |r: Result<tonic::Response<pb::CheckAndReserveResponse>, tonic::Status>| {
        r.map(|_| Code::Ok).unwrap_or_else(|e| e.code())
    };
    let hup = || {
        assert!(
            std::process::Command::new("kill")
                .args(["-HUP", &child.id().to_string()])
                .status()
                .unwrap()
                .success()
        )
    };
    let call = |token: &'static str| {
        let mut c = c.clone();
        async move {
            c.check_and_reserve(with_token(reserve("acme", "u", "free", 1, 1), Some(token)))
                .await
        }
    };
    assert_eq!(code(call(OLD).await), Code::Ok);
    assert_eq!(code(call(NEW).await), Code::Unauthenticated);

    // Waits until `token` gets `want` (the reload is asynchronous to the signal).
    let settles = |token: &'static str, want: Code, what: &'static str| {
        let call = &call;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let got = code(call(token).await);
                if got == want {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "{what}: {got:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // Step 1: add the new token beside the old one.
    std::fs::write(&file, tokens(&[("old", OLD), ("new", NEW)])).unwrap();
    hup();
    settles(NEW, Code::Ok, "new now valid").await;
    assert_eq!(code(call(OLD).await), Code::Ok, "old still valid");

    // Step 2: retire the old token.
    std::fs::write(&file, tokens(&[("new", NEW)])).unwrap();
    hup();
    settles(OLD, Code::Unauthenticated, "old retired").await;
    assert_eq!(code(call(NEW).await), Code::Ok);

    // A file without [auth] does not turn authentication off on reload.
    std::fs::write(&file, "").unwrap();
    hup();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("no [auth] tokens")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the refusal is logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(code(call(NEW).await), Code::Ok, "tokens kept");
    let anonymous = c
        .check_and_reserve(reserve("acme", "u", "free", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "still required");

    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(&log).unwrap()
        + &std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(logged.contains("reloaded caller tokens"), "{logged}");
    for secret in [OLD, NEW] {
        assert!(!logged.contains(secret), "a token reached the log");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Envoy's rate limit service sits behind the same authentication: no token
/// is UNAUTHENTICATED, and a token bound to tenants may not charge another's
/// descriptor — refused whole, the bound tenant's descriptor beside it
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_service_checks_tokens_and_their_tenants() {
    use ctxbudget::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use ctxbudget::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use ctxbudget::envoy::service::ratelimit::v3::RateLimitRequest;
    use ctxbudget::envoy::service::ratelimit::v3::rate_limit_response::Code as RlsCode;
    use ctxbudget::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let h = Harness::start(
        Backend::Memory,
        &format!("{TOKENS}\n[envoy]\ndefault_tier = \"free\"\n"),
    )
    .await;
    let mut c = h.client.clone();
    let channel = Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut envoy = RateLimitServiceClient::new(channel);
    let of = |tenants: &[&str]| RateLimitRequest {
        domain: "llm".into(),
        descriptors: tenants
            .iter()
            .map(|t| RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "tenant".into(),
                        value: t.to_string(),
                    },
                    Entry {
                        key: "user".into(),
                        value: "u".into(),
                    },
                ],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let before = requests_left(&mut c, "acme").await;
    let e = envoy
        .should_rate_limit(with_token(of(&["acme"]), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = envoy
        .should_rate_limit(with_token(of(&["acme", "globex"]), Some(NEW)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("gateway-acme"), "{e:?}");
    assert_eq!(
        requests_left(&mut c, "acme").await,
        before,
        "nothing charged"
    );
    let ok = envoy
        .should_rate_limit(with_token(of(&["acme"]), Some(NEW)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.overall_code(), RlsCode::Ok);
    // One request taken: the user's 10 per minute are the tightest, 9 left.
    let status = &ok.statuses[0];
    assert_eq!(status.limit_remaining, 9, "{ok:#?}");
    let limit = status.current_limit.as_ref().unwrap();
    assert!(limit.name.starts_with("user requests"), "{limit:?}");
    h.stop().await;
}
