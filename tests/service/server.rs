//! The server around the API: health, reflection (grpcurl needs no proto file),
//! and a clean shutdown.

use crate::support;

use support::{Backend, Harness};
/// Lists the services through one reflection version's client.
macro_rules! list_services {
    ($version:ident, $addr:expr) => {{
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", $addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream_once(request))
            .await
            .unwrap_or_else(|e| panic!("reflection {} is served: {e:?}", stringify!($version)))
            .into_inner();
        let reply = stream.message().await.unwrap().expect("one reply");
        let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
            panic!("unexpected reflection reply {reply:?}");
        };
        list.service
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<String>>()
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_budget_and_envoy_services_and_health_in_v1_and_v1alpha() {
    let h = Harness::start(Backend::Memory, "").await;
    // grpcurl speaks v1; Python's grpcio-reflection and older tools v1alpha.
    let v1 = list_services!(v1, h.addr);
    let v1alpha = list_services!(v1alpha, h.addr);
    for names in [&v1, &v1alpha] {
        assert!(
            names.iter().any(|n| n == "ctxbudget.v1.BudgetService"),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n == "grpc.health.v1.Health"),
            "{names:?}"
        );
        for envoy in [
            "envoy.service.ratelimit.v3.RateLimitService",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ] {
            assert!(names.iter().any(|n| n == envoy), "{names:?}");
        }
    }
    h.stop().await;
}

fn tokio_stream_once<T: Send + 'static>(item: T) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::iter([item])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_and_frees_the_port() {
    let h = Harness::start(Backend::Memory, "").await;
    let addr = h.addr;
    h.stop().await;
    let rebound = tokio::net::TcpListener::bind(addr).await;
    assert!(rebound.is_ok(), "the listener was released on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_above_the_message_limit_are_refused_clearly() {
    let mut settings = support::settings("", None);
    settings.max_message_bytes = 64 * 1024;
    let mut h = Harness::start_with(settings, None).await;
    let request = ctxbudget::pb::CheckAndReserveRequest {
        tenant_id: "acme".into(),
        tier: "free".into(),
        model: "gpt-4o".into(),
        prompt: "x".repeat(100 * 1024),
        ..Default::default()
    };
    let size = prost::Message::encoded_len(&request);
    let err = h.client.check_and_reserve(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    // The size, the limit, and the setting that raises it.
    for words in [
        &format!("the request is {size} bytes"),
        "limit of 65536 bytes",
        "[server] max_message_bytes",
    ] {
        assert!(
            err.message().contains(words),
            "{words:?}: {}",
            err.message()
        );
    }
    // Envoy's rate limit service says the same.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    use ctxbudget::envoy::service::ratelimit::v3 as rls;
    let mut envoy = rls::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let err = envoy
        .should_rate_limit(rls::RateLimitRequest {
            domain: "x".repeat(100 * 1024),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("[server] max_message_bytes"),
        "{}",
        err.message()
    );
    // A request under the limit is served as ever.
    let small = ctxbudget::pb::CheckAndReserveRequest {
        prompt_tokens: Some(10),
        ..support::reserve("acme", "u", "free", 10, 10)
    };
    assert!(
        h.client
            .check_and_reserve(small)
            .await
            .unwrap()
            .into_inner()
            .allowed
    );
}
