//! A gateway's view of ctxbudget: reserve before an upstream call, commit the
//! real usage after it, refund when it failed, and act on denials.
//!
//! Start the service (`cargo run --release -- serve`), then:
//! `cargo run --example quickstart [-- http://127.0.0.1:50051]`
//!
//! Each run is a new tenant (`acme-` and four random hex digits), so it runs
//! again at once: the limits it spends (10 requests per minute per user, one
//! call in flight) belong to that run alone.

use ctxbudget::pb::budget_service_client::BudgetServiceClient;
use ctxbudget::pb::{
    CheckAndReserveRequest, CheckAndReserveResponse, CommitRequest, GetStatusRequest, Message,
    Reason, RefundRequest,
};

/// Who this run reserves for.
struct Caller {
    tenant: String,
    user: &'static str,
}

impl Caller {
    /// A CheckAndReserve of a counted prompt on the free tier.
    fn request(&self, prompt_tokens: u64, max_output_tokens: u64) -> CheckAndReserveRequest {
        CheckAndReserveRequest {
            tenant_id: self.tenant.clone(),
            user_id: self.user.into(),
            tier: "free".into(),
            model: "gpt-4o-mini".into(),
            prompt_tokens: Some(prompt_tokens),
            max_output_tokens,
            ..Default::default()
        }
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

#[expect(
    clippy::too_many_lines,
    reason = "the quickstart is one walk-through, read from top to bottom"
)]
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

    let me = Caller {
        tenant: format!("acme-{:04x}", rand::random::<u16>()),
        user: "alice",
    };
    println!("tenant {}, user {}", me.tenant, me.user);

    // 1. Reserve before calling the upstream.
    let first = client
        .check_and_reserve(me.request(1200, 300))
        .await?
        .into_inner();
    show("reserve #1", &first);
    if !first.allowed {
        // A denial holds nothing: there is nothing to commit or refund. A
        // gateway answers 429 (413 for a prompt too large) and stops here.
        return Err(format!("reserve #1 was denied: {}", first.detail).into());
    }
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
        .check_and_reserve(me.request(500, 100))
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
        ..me.request(0, 200)
    };
    let third = client.check_and_reserve(chat).await?.into_inner();
    show("reserve #3", &third);
    println!(
        "    counted {} prompt tokens, corrected x{} (granted {} output tokens)",
        third.estimated_prompt_tokens, third.estimator_multiplier, third.granted_max_output_tokens
    );
    if third.allowed {
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
    }

    // 5. A prompt over the tier's max context is refused outright (HTTP 413).
    let huge = client
        .check_and_reserve(me.request(40_000, 1000))
        .await?
        .into_inner();
    show("reserve a 40k-token prompt", &huge);

    // 6. Keep calling until the user's 10 requests per minute run out (HTTP 429):
    //    a denial is shown, never committed.
    for i in 4..=100 {
        let r = client
            .check_and_reserve(me.request(100, 100))
            .await?
            .into_inner();
        if !r.allowed {
            show(&format!("reserve #{i}"), &r);
            if r.reason() != Reason::RpmExceeded {
                println!("    (expected the user's request limit; another limit came first)");
            }
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
            tenant_id: me.tenant.clone(),
            user_id: me.user.into(),
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
