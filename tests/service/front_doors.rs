//! One rule, five front doors, a test each: a token bound to tenant `acme`
//! that acts for `globex` is refused by gRPC, the HTTP API, Envoy's rate
//! limit service and Envoy's external processor in the same words (the
//! application layer's), each in its own transport's "forbidden"; the admin
//! API, whose admin tokens act for every tenant (the configuration refuses
//! binding one), refuses it as the caller's token it is, 403 as well.
//! Nothing of `globex`'s budget changes, and the token still works for
//! `acme`.

use crate::support;

use ctxbudget::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ctxbudget::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ctxbudget::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use ctxbudget::envoy::service::ratelimit::v3::RateLimitRequest;
use ctxbudget::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ctxbudget::pb;
use serde_json::Value;
use support::{Backend, Harness, reserve};
use tonic::transport::Channel;
use tonic::{Code, Request};

const GATEWAY: &str = "gateway-token-0123456789abcdef";
const ACME_GATEWAY: &str = "acme-gateway-token-0123456789";
const ADMIN: &str = "admin-token-0123456789abcdefgh";

/// `message` with `authorization: Bearer <token>`.
fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    let value = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

/// The refusal every door gives the token named `name` acting for `globex`.
fn refusal(name: &str) -> String {
    format!("token {name:?} may not act for tenant \"globex\"; use a token bound to that tenant")
}

async fn channel(h: &Harness) -> Channel {
    Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Requests `globex` has left this minute, asked with the unbound token.
async fn globex_left(h: &Harness) -> i64 {
    let status = pb::GetStatusRequest {
        tenant_id: "globex".into(),
        user_id: "u".into(),
        tier: "free".into(),
        ..Default::default()
    };
    let s = h
        .client
        .clone()
        .get_status(with_token(status, GATEWAY))
        .await
        .expect("status with the unbound token")
        .into_inner();
    support::limit(&s.limits, pb::Level::Tenant, pb::Dimension::Requests, 60).remaining
}

/// POSTs or GETs `path` on the HTTP listener with `token`: the status and
/// the JSON body.
async fn http(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}{path}");
    let request = match method {
        "GET" => client.get(url),
        _ => client.post(url).body(body.to_owned()),
    };
    let response = request
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send()
        .await
        .expect("the HTTP listener answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).expect("a JSON body"))
}

/// One LLM request through the external processor for `tenant`, with the
/// bound token: the immediate answer's status and JSON body.
async fn ext_proc(h: &Harness, tenant: &str) -> (u32, Value) {
    let headers = [
        ("x-tenant-id", tenant),
        ("x-user-id", "u"),
        ("x-tier", "free"),
    ];
    let answer = support::ext_proc::one_request(
        h.addr,
        Some(ACME_GATEWAY),
        &headers,
        support::ext_proc::CHAT,
    )
    .await;
    match answer {
        Answer::ImmediateResponse(r) => (
            r.status.expect("a status").code as u32,
            serde_json::from_slice(&r.body).expect("a JSON body"),
        ),
        other => panic!("expected an immediate answer, got {other:#?}"),
    }
}

/// A service with an HTTP listener, Envoy's services, an unbound caller
/// token, one bound to `acme` and an admin token; its HTTP port.
async fn start() -> (Harness, u16) {
    let port = support::free_port();
    let config = format!(
        r#"
[http]
listen = "127.0.0.1:{port}"
allow_plaintext = true

[envoy]
default_tier = "free"

[ext_proc]
default_tier = "free"

[[auth.tokens]]
name = "gateway"
token = "{GATEWAY}"

[[auth.tokens]]
name = "acme-gateway"
token = "{ACME_GATEWAY}"
tenants = ["acme"]

[[auth.tokens]]
name = "admin"
token = "{ADMIN}"
role = "admin"
"#
    );
    (Harness::start(Backend::Memory, &config).await, port)
}

/// A CheckAndReserve of `tenant` for user `user` in the HTTP API's JSON.
fn http_reserve(tenant: &str, user: &str) -> String {
    format!(
        r#"{{"tenantId": "{tenant}", "userId": "{user}", "tier": "free", "model": "gpt-4o",
            "promptTokens": 10, "maxOutputTokens": 10}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_a_token_bound_to_another_tenant() {
    let (h, _) = start().await;
    let before = globex_left(&h).await;
    let mut client = h.client.clone();
    let e = client
        .check_and_reserve(with_token(
            reserve("globex", "u", "free", 10, 10),
            ACME_GATEWAY,
        ))
        .await
        .unwrap_err();
    let expected = refusal("acme-gateway");
    assert_eq!(
        (e.code(), e.message()),
        (Code::PermissionDenied, expected.as_str())
    );
    assert_eq!(globex_left(&h).await, before, "nothing of globex changed");
    let own = client
        .check_and_reserve(with_token(
            reserve("acme", "u", "free", 10, 10),
            ACME_GATEWAY,
        ))
        .await
        .expect("the bound token reserves for acme")
        .into_inner();
    assert!(own.allowed);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_refuses_a_token_bound_to_another_tenant() {
    let (h, port) = start().await;
    let before = globex_left(&h).await;
    let body = http_reserve("globex", "u");
    let (status, json) = http(port, "POST", "/v1/check-and-reserve", ACME_GATEWAY, &body).await;
    assert_eq!(status, 403, "{json}");
    assert_eq!(json["error"]["status"], "PERMISSION_DENIED", "{json}");
    assert_eq!(
        json["error"]["message"],
        refusal("acme-gateway").as_str(),
        "{json}"
    );
    assert_eq!(globex_left(&h).await, before, "nothing of globex changed");
    let body = http_reserve("acme", "u");
    let (status, json) = http(port, "POST", "/v1/check-and-reserve", ACME_GATEWAY, &body).await;
    assert_eq!(status, 200, "the bound token reserves for acme: {json}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_service_refuses_a_token_bound_to_another_tenant() {
    let (h, _) = start().await;
    let before = globex_left(&h).await;
    let descriptor = |tenant: &str| RateLimitDescriptor {
        entries: vec![
            Entry {
                key: "tenant".into(),
                value: tenant.into(),
            },
            Entry {
                key: "user".into(),
                value: "u".into(),
            },
        ],
        ..Default::default()
    };
    let request = |tenants: &[&str]| RateLimitRequest {
        domain: "llm".into(),
        descriptors: tenants.iter().map(|t| descriptor(t)).collect(),
        hits_addend: 1,
    };
    let mut rls = RateLimitServiceClient::new(channel(&h).await);
    // Its own tenant's descriptor beside another's: refused whole.
    let e = rls
        .should_rate_limit(with_token(request(&["acme", "globex"]), ACME_GATEWAY))
        .await
        .unwrap_err();
    let expected = refusal("acme-gateway");
    assert_eq!(
        (e.code(), e.message()),
        (Code::PermissionDenied, expected.as_str())
    );
    assert_eq!(globex_left(&h).await, before, "nothing of globex changed");
    rls.should_rate_limit(with_token(request(&["acme"]), ACME_GATEWAY))
        .await
        .expect("the bound token charges acme");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_external_processor_refuses_a_token_bound_to_another_tenant() {
    let (h, _) = start().await;
    let before = globex_left(&h).await;
    // The caller's request is answered 403 in its API's error format.
    let (status, json) = ext_proc(&h, "globex").await;
    assert_eq!(status, 403, "{json}");
    assert_eq!(
        json["error"]["message"],
        refusal("acme-gateway").as_str(),
        "{json}"
    );
    assert_eq!(json["error"]["code"], "permission_denied", "{json}");
    assert_eq!(globex_left(&h).await, before, "nothing of globex changed");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_token_bound_to_a_tenant() {
    let (h, port) = start().await;
    // Admin tokens act for every tenant (the configuration refuses binding
    // one): a bound token is a caller's, refused 403 as such.
    let path = "/admin/v1/tenants/globex?tier=free";
    let (status, json) = http(port, "GET", path, ACME_GATEWAY, "").await;
    assert_eq!(status, 403, "{json}");
    assert_eq!(json["error"]["status"], "PERMISSION_DENIED", "{json}");
    assert_eq!(
        json["error"]["message"],
        "token \"acme-gateway\" is a caller's token; the admin API takes a token of role \"admin\"",
        "{json}"
    );
    let (status, json) = http(port, "GET", path, ADMIN, "").await;
    assert_eq!(status, 200, "an admin token acts for every tenant: {json}");
    h.stop().await;
}
