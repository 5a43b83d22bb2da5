//! A gateway's view of ctxbudget: reserve before an upstream call, commit the
//! real usage after it, refund when it failed, and act on denials.
//!
//! Start the service (`cargo run --release -- serve`), then:
//! `cargo run --example quickstart [-- http://127.0.0.1:50051]`

use ctxbudget::pb::budget_service_client::BudgetServiceClient;
use ctxbudget::pb::{
    CheckAndReserveRequest, CheckAndReserveResponse, CommitRequest, GetStatusRequest, Message,
    Reason, RefundRequest,
};

fn request(prompt_tokens: u64, max_output_tokens: u64) -> CheckAndReserveRequest {
    CheckAndReserveRequest {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
        tier: "free".into(),
        model: "gpt-4o-mini".into(),
        prompt_tokens: Some(prompt_tokens),
        max_output_tokens,
        ..Default::default()
    }
}

fn show(what: &str, r: &CheckAndReserveResponse) {
    if r.allowed {
        println!(
            "{what}: ALLOWED  reservation {}  reserved {} tokens",
            r.reservation_id, r.reserved_tokens
        );
    } else {
        println!(
            "{what}: DENIED   {:?} at {:?}, retry after {} ms\n    {}",
            r.reason(),
            r.limiting_level(),
            r.retry_after_ms,
            r.detail
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let mut client = BudgetServiceClient::connect(target.clone())
        .await
        .map_err(|e| {
            format!("cannot reach ctxbudget at {target}: {e}; is `ctxbudget serve` running?")
        })?;

    // 1. Reserve before calling the upstream.
    let first = client
        .check_and_reserve(request(1200, 300))
        .await?
        .into_inner();
    show("reserve #1", &first);
    for l in &first.limits {
        println!(
            "    {:?} {:?} per {}s: {} of {} left, full again in {} ms",
            l.level(),
            l.dimension(),
            l.period_seconds,
            l.remaining,
            l.limit,
            l.reset_after_ms
        );
    }

    // 2. The free tier allows one call in flight per user: a second is denied.
    let second = client
        .check_and_reserve(request(500, 100))
        .await?
        .into_inner();
    show("reserve #2 while #1 is in flight", &second);

    // 3. The upstream answered: commit what it really used.
    let commit = client
        .commit(CommitRequest {
            reservation_id: first.reservation_id.clone(),
            prompt_tokens: 1180,
            completion_tokens: 210,
            ..Default::default()
        })
        .await?
        .into_inner();
    println!(
        "commit #1: {:?}, token delta {} (negative: surplus returned)",
        commit.outcome(),
        commit.token_delta
    );

    // 4. Send the chat messages instead of a count: the service counts them with
    //    the model's tokenizer and corrects the count with what it has learned.
    //    This call then fails upstream and is refunded: tokens, request and slot return.
    let chat = CheckAndReserveRequest {
        prompt_tokens: None,
        messages: vec![
            Message {
                role: "system".into(),
                content: "You are a concise assistant.".into(),
                name: String::new(),
            },
            Message {
                role: "user".into(),
                content: "Summarize the plot of Hamlet in two sentences.".into(),
                name: String::new(),
            },
        ],
        ..request(0, 200)
    };
    let third = client.check_and_reserve(chat).await?.into_inner();
    show("reserve #3", &third);
    println!(
        "    counted {} prompt tokens, corrected x{} (granted {} output tokens)",
        third.estimated_prompt_tokens, third.estimator_multiplier, third.granted_max_output_tokens
    );
    let refund = client
        .refund(RefundRequest {
            reservation_id: third.reservation_id.clone(),
        })
        .await?
        .into_inner();
    println!(
        "refund #3: {:?}, {} tokens returned",
        refund.outcome(),
        refund.refunded_tokens
    );

    // 5. A prompt over the tier's max context is refused outright (HTTP 413).
    let huge = client
        .check_and_reserve(request(40_000, 1000))
        .await?
        .into_inner();
    show("reserve a 40k-token prompt", &huge);

    // 6. Keep calling until the user's 10 requests per minute run out (HTTP 429).
    for i in 4.. {
        let r = client
            .check_and_reserve(request(100, 100))
            .await?
            .into_inner();
        if !r.allowed {
            show(&format!("reserve #{i}"), &r);
            assert_eq!(r.reason(), Reason::RpmExceeded);
            break;
        }
        client
            .commit(CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: 100,
                completion_tokens: 50,
                ..Default::default()
            })
            .await?;
    }

    // 7. Read the budgets without reserving anything.
    let status = client
        .get_status(GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
            tier: "free".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    for l in status.limits {
        println!(
            "status: {:?} {:?} per {}s: {} of {} left",
            l.level(),
            l.dimension(),
            l.period_seconds,
            l.remaining,
            l.limit
        );
    }
    Ok(())
}
