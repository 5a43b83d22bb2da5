//! Hostile input over gRPC: huge strings, huge counts, non-UTF-8 bytes, long
//! message lists and made-up ids all end in INVALID_ARGUMENT or a bounded
//! decision — and the service keeps serving. Random bytes and random messages
//! through request validation (the fuzz target's function) are unit tests
//! beside it, `crates/server/src/api/validate_tests.rs`: it is no public library item.

use crate::support;

use ctxbudget::pb;
use support::{Backend, Harness};
use tonic::Code;

async fn raw_call(
    h: &Harness,
    method: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    support::raw_call(h.addr, method, body, None).await
}

fn invalid(r: Result<impl std::fmt::Debug, tonic::Status>, what: &str) {
    let err = r.expect_err(what);
    assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
    assert!(
        err.message().len() < 1000,
        "{what}: the message stays short"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_invalid_argument_or_a_bounded_decision() {
    let h = Harness::start(Backend::Memory, "").await;
    let mut c = h.client.clone();
    const RESERVE: &str = "/ctxbudget.v1.BudgetService/CheckAndReserve";

    // Not UTF-8 where a string belongs: field 1 (tenant_id), 2 bytes 0xff 0xfe.
    invalid(
        raw_call(&h, RESERVE, vec![0x0a, 0x02, 0xff, 0xfe]).await,
        "non-UTF-8",
    );
    // Not protobuf at all: a truncated varint and a bogus wire type.
    invalid(
        raw_call(&h, RESERVE, vec![0x28, 0xff]).await,
        "truncated varint",
    );
    invalid(
        raw_call(&h, RESERVE, vec![0x0f, 0x00]).await,
        "bad wire type",
    );

    // Huge strings.
    let huge = "x".repeat(1 << 20);
    for (field, request) in [
        (
            "tenant_id",
            pb::CheckAndReserveRequest {
                tenant_id: huge.clone(),
                ..support::reserve("a", "u", "free", 1, 1)
            },
        ),
        (
            "user_id",
            pb::CheckAndReserveRequest {
                user_id: huge.clone(),
                ..support::reserve("a", "u", "free", 1, 1)
            },
        ),
        (
            "tier",
            pb::CheckAndReserveRequest {
                tier: huge.clone(),
                ..support::reserve("a", "u", "free", 1, 1)
            },
        ),
        (
            "model",
            pb::CheckAndReserveRequest {
                model: huge.clone(),
                ..support::reserve("a", "u", "free", 1, 1)
            },
        ),
        (
            "idempotency_key",
            pb::CheckAndReserveRequest {
                idempotency_key: huge.clone(),
                ..support::reserve("a", "u", "free", 1, 1)
            },
        ),
    ] {
        invalid(c.check_and_reserve(request).await, field);
    }
    // Control characters in an id.
    invalid(
        c.check_and_reserve(support::reserve("a\u{0}b", "u", "free", 1, 1))
            .await,
        "NUL",
    );

    // Huge counts: refused as input, or decided (too large), never a panic.
    for (prompt, output) in [
        (u64::MAX, 1),
        (1, u64::MAX),
        (u64::MAX, u64::MAX),
        (1 << 53, 1 << 53),
    ] {
        match c
            .check_and_reserve(support::reserve("a", "u", "free", prompt, output))
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                assert!(!r.allowed, "{prompt}+{output} allowed: {r:?}");
                assert!(matches!(
                    r.reason(),
                    pb::Reason::ContextTooLarge | pb::Reason::RequestTooLarge
                ));
            }
            Err(e) => assert_eq!(e.code(), Code::InvalidArgument, "{e:?}"),
        }
    }
    let lease = pb::CheckAndReserveRequest {
        lease_ttl_ms: Some(u64::MAX),
        ..support::reserve("a", "u", "free", 1, 1)
    };
    invalid(
        c.check_and_reserve(lease).await,
        "lease_ttl_ms beyond the maximum",
    );

    // A message list longer than any chat: refused before counting.
    let messages = vec![
        pb::Message {
            role: "user".into(),
            content: String::new(),
            name: String::new(),
        };
        100_001
    ];
    let many = pb::CheckAndReserveRequest {
        prompt_tokens: None,
        messages,
        ..support::reserve("a", "u", "free", 1, 1)
    };
    invalid(c.check_and_reserve(many).await, "100,001 messages");

    // Made-up reservation ids.
    for id in [
        "",
        "rsv_",
        "rsv_AAAA",
        "rsv_!!!!",
        &"rsv_A".repeat(10_000),
        "\u{202e}rsv",
    ] {
        let r = c
            .commit(pb::CommitRequest {
                reservation_id: id.to_string(),
                prompt_tokens: 1,
                completion_tokens: 1,
                ..Default::default()
            })
            .await;
        invalid(r, "made-up id");
    }

    // Still serving.
    let ok = c
        .check_and_reserve(support::reserve("a", "u", "free", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.allowed);
    h.stop().await;
}

/// A prompt far over the max context is counted only until it passes the
/// limit: the denial says "more than" the limit, never the count where it
/// stopped; a prompt counted in full (the caller's count) is quoted exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_denied_as_more_than_the_max_context() {
    let h = Harness::start(Backend::Memory, "").await;
    let mut c = h.client.clone();
    let huge = pb::CheckAndReserveRequest {
        prompt_tokens: None,
        prompt: "lorem ipsum dolor sit amet ".repeat(40_000),
        ..support::reserve("a", "u", "free", 0, 100)
    };
    assert!(huge.prompt.len() > 1_000_000);
    let d = c.check_and_reserve(huge).await.unwrap().into_inner();
    assert_eq!(d.reason(), pb::Reason::ContextTooLarge, "{d:?}");
    assert!(
        d.detail.contains("more than 32000 tokens")
            && d.detail.contains("free tier's max context of 32000 tokens")
            && !d.detail.contains("32001"),
        "{}",
        d.detail
    );
    let counted = c
        .check_and_reserve(support::reserve("a", "u", "free", 32_001, 100))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counted.reason(), pb::Reason::ContextTooLarge);
    assert!(
        counted
            .detail
            .starts_with("prompt 32001 + output 100 tokens exceed"),
        "{}",
        counted.detail
    );
    h.stop().await;
}
