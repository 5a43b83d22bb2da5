//! Money end to end over both stores: a monthly budget in a time zone, the
//! worst case reserved, the actual cost committed (cached prompt tokens at the
//! cached price), the surplus returned, and the denial once committed spend
//! reaches the budget — with Retry-After at the month's end there.

use crate::operations::ctl_binary_at;
use crate::support;

use ctxbudget::domain::window::{Window, WindowKind, parse_zone};
use ctxbudget::domain::{Clock, SystemClock};
use ctxbudget::pb::{self, Dimension, Level, Reason};
use support::{Backend, Harness, reserve};
use tonic::Code;

on_every_store!(
    a_monthly_budget_denies_once_committed_spend_reaches_it,
    a_refund_returns_the_reserved_spend,
    a_model_without_a_price_costs_nothing_or_is_refused,
    calls_are_priced_as_the_provider_bills_them,
);

const BUDGET: &str = r#"
[models.gpt-4o]
match = ["gpt-4o*"]

[prices.gpt-4o]
input = 2.50
cached_input = 1.25
output = 10.00

[tiers.t]
max_context_tokens = 200000
default_max_output_tokens = 100
tenant = { spend = [{ limit_usd = 1.00, window = "month", timezone = "Asia/Bangkok" }] }
"#;

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

/// 100,000 prompt tokens and 10,000 output: at most $0.35.
fn ask(model: &str) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        model: model.into(),
        ..reserve("acme", "", "t", 100_000, 10_000)
    }
}

async fn call(c: &mut Client, r: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    c.check_and_reserve(r).await.expect("rpc").into_inner()
}

fn spend_left(r: &pb::CheckAndReserveResponse) -> i64 {
    r.limits
        .iter()
        .find(|l| l.dimension() == Dimension::Spend)
        .expect("the spend limit is reported")
        .remaining
}

async fn commit(c: &mut Client, id: &str, prompt: u64, cached: u64, completion: u64) -> u64 {
    let r = c
        .commit(pb::CommitRequest {
            reservation_id: id.into(),
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_prompt_tokens: cached,
            ..Default::default()
        })
        .await
        .expect("commit")
        .into_inner();
    assert_eq!(r.outcome(), pb::Outcome::Applied);
    r.cost_micros
}

async fn a_monthly_budget_denies_once_committed_spend_reaches_it(backend: Backend) {
    let mut h = Harness::start(backend, BUDGET).await;
    let c = &mut h.client;
    let first = call(c, ask("gpt-4o")).await;
    assert!(first.allowed, "{first:#?}");
    assert_eq!(
        spend_left(&first),
        650_000,
        "the worst case, $0.35, is reserved"
    );
    // 60,000 uncached at $2.50/M, 40,000 cached at $1.25/M, 5,000 out at $10/M.
    let cost = commit(c, &first.reservation_id, 100_000, 40_000, 5_000).await;
    assert_eq!(cost, 150_000 + 50_000 + 50_000);
    // The surplus ($0.10) is back: $0.75 left; two more at the full $0.35
    // leave $0.05.
    for left in [400_000, 50_000] {
        let r = call(c, ask("gpt-4o")).await;
        assert!(r.allowed, "{r:#?}");
        assert_eq!(
            commit(c, &r.reservation_id, 100_000, 0, 10_000).await,
            350_000
        );
        let probe = call(c, ask("gpt-4o")).await;
        assert_eq!(
            spend_left(&probe),
            left - if probe.allowed { 350_000 } else { 0 }
        );
        if probe.allowed {
            c.refund(pb::RefundRequest {
                reservation_id: probe.reservation_id,
            })
            .await
            .unwrap();
        }
    }
    let denied = call(c, ask("gpt-4o")).await;
    let now = SystemClock.now_us();
    assert!(!denied.allowed);
    assert_eq!(denied.reason(), Reason::BudgetExceeded);
    assert_eq!(denied.limiting_dimension(), Dimension::Spend);
    assert_eq!(denied.limiting_level(), Level::Tenant);
    assert_eq!(spend_left(&denied), 50_000);
    let month = Window {
        kind: WindowKind::Month,
        tz: parse_zone("Asia/Bangkok").unwrap(),
    };
    let to_boundary_ms = (month.span(now).end_us - now) / 1000;
    let retry = denied.retry_after_ms as i64;
    assert!(
        retry >= to_boundary_ms && retry <= to_boundary_ms + 30_000,
        "retry in {retry} ms, the month ends in {to_boundary_ms} ms"
    );
    h.stop().await;
}

async fn a_refund_returns_the_reserved_spend(backend: Backend) {
    let mut h = Harness::start(backend, BUDGET).await;
    let c = &mut h.client;
    let r = call(c, ask("gpt-4o")).await;
    assert!(r.allowed);
    let refund = c
        .refund(pb::RefundRequest {
            reservation_id: r.reservation_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refund.cost_micros, 350_000);
    let again = call(c, ask("gpt-4o")).await;
    assert_eq!(spend_left(&again), 650_000, "the whole budget was back");
    // A repeated refund changes nothing and returns nothing.
    let repeat = c
        .refund(pb::RefundRequest {
            reservation_id: r.reservation_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (repeat.outcome(), repeat.cost_micros),
        (pb::Outcome::AlreadySettled, 0)
    );
    h.stop().await;
}

async fn a_model_without_a_price_costs_nothing_or_is_refused(backend: Backend) {
    let mut h = Harness::start(backend, BUDGET).await;
    let c = &mut h.client;
    let free = call(c, ask("o3")).await;
    assert!(free.allowed);
    assert_eq!(spend_left(&free), 1_000_000, "no price: no spend");
    h.stop().await;
    let strict = format!("{BUDGET}\n[money]\nrequire_price = true\n");
    let mut h = Harness::start(backend, &strict).await;
    let err = h.client.check_and_reserve(ask("o3")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("no price"), "{err:?}");
    assert!(call(&mut h.client, ask("gpt-4o")).await.allowed);
    h.stop().await;
}

/// Claude Sonnet's prices: above 200K prompt tokens the whole call at the
/// long-context rates; 5-minute and 1-hour cache writes; a fee per call.
const PROVIDER: &str = r#"
[models.sonnet]
match = ["claude-sonnet*"]

[prices.sonnet]
input = 3.00
cached_input = 0.30
cache_write = 3.75
cache_write_1h = 6.00
output = 15.00
per_call = 0.01

[[prices.sonnet.above]]
prompt_tokens = 200000
input = 6.00
cached_input = 0.60
cache_write = 7.50
cache_write_1h = 12.00
output = 22.50

[tiers.t]
max_context_tokens = 1000000
default_max_output_tokens = 100
tenant = { spend = [{ limit_usd = 100.00, window = "month" }] }
"#;

async fn calls_are_priced_as_the_provider_bills_them(backend: Backend) {
    // The calls stay within one hour, so the export's hourly row is the
    // test's to write: wait out the last 30 s of an hour.
    let left = 3600 - now_secs() % 3600;
    if left < 30 {
        tokio::time::sleep(std::time::Duration::from_secs(left + 1)).await;
    }
    let hour = now_secs() - now_secs() % 3600;
    let mut h = Harness::start(backend, PROVIDER).await;
    let c = &mut h.client;
    let ask = |prompt| pb::CheckAndReserveRequest {
        model: "claude-sonnet-4".into(),
        ..reserve("acme", "", "t", prompt, 1_000)
    };
    // Reserved at the tier the prompt falls in: 250,000 × $6/M + 1,000 ×
    // $22.50/M + $0.01; 150,000 × $3/M + 1,000 × $15/M + $0.01.
    let long = call(c, ask(250_000)).await;
    assert!(long.allowed, "{long:?}");
    assert_eq!(spend_left(&long), 100_000_000 - 1_532_500);
    let short = call(c, ask(150_000)).await;
    assert_eq!(spend_left(&short), 100_000_000 - 1_532_500 - 475_000);
    // Committed as billed: of the prompt 10,000 read from the cache, 20,000
    // and 30,000 written for 5 minutes and an hour; 500 of 2,000 output
    // tokens reasoning (at the output price, the default).
    let billed = |id: &str, prompt| pb::CommitRequest {
        reservation_id: id.into(),
        prompt_tokens: prompt,
        completion_tokens: 2_000,
        cached_prompt_tokens: 10_000,
        cache_write_prompt_tokens: 20_000,
        cache_write_1h_prompt_tokens: 30_000,
        reasoning_tokens: 500,
        ..Default::default()
    };
    // Malformed parts are refused and change nothing.
    for (bad, field) in [
        (
            pb::CommitRequest {
                cache_write_1h_prompt_tokens: 230_000,
                ..billed(&long.reservation_id, 250_000)
            },
            "cache_write_1h_prompt_tokens",
        ),
        (
            pb::CommitRequest {
                reasoning_tokens: 2_001,
                ..billed(&long.reservation_id, 250_000)
            },
            "reasoning_tokens",
        ),
        (
            pb::CommitRequest {
                completion_tokens: 0,
                completion_text: "Hello".into(),
                ..billed(&long.reservation_id, 250_000)
            },
            "reasoning_tokens",
        ),
    ] {
        let err = c.commit(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(field), "{}", err.message());
    }
    let cost = |r: tonic::Response<pb::CommitResponse>| {
        let r = r.into_inner();
        assert_eq!(r.outcome(), pb::Outcome::Applied);
        r.cost_micros
    };
    let long_cost = cost(
        c.commit(billed(&long.reservation_id, 250_000))
            .await
            .unwrap(),
    );
    let long_parts = 190_000 * 6 + 10_000 * 6 / 10 + 20_000 * 15 / 2 + 30_000 * 12;
    assert_eq!(long_cost, long_parts + 2_000 * 45 / 2 + 10_000);
    // Under 200K, the base rates; the reservation's tier does not matter.
    let short_cost = cost(
        c.commit(billed(&short.reservation_id, 100_000))
            .await
            .unwrap(),
    );
    let short_parts = 40_000 * 3 + 10_000 * 3 / 10 + 20_000 * 15 / 4 + 30_000 * 6;
    assert_eq!(short_cost, short_parts + 2_000 * 15 + 10_000);
    // The spend limit holds what was billed.
    let after = call(c, ask(1)).await;
    let one = 3 + 15_000 + 10_000;
    assert_eq!(
        spend_left(&after),
        100_000_000 - long_cost as i64 - short_cost as i64 - one
    );
    // The ledger holds the parts; the memory store's ledger lives in the
    // service (the differential test holds it to Redis's).
    if let Some(store) = h.store_args() {
        the_ledger_reconciles_with_the_bill(&store, hour, long_cost + short_cost);
    }
}

fn now_secs() -> u64 {
    SystemClock.now_us() as u64 / 1_000_000
}

/// `usage` shows the two calls' cache writes and reasoning tokens, and
/// `reconcile` finds no drift against an export with those columns — and
/// flags the row once the export's reasoning count is changed.
fn the_ledger_reconciles_with_the_bill(store: &[String], hour: u64, cost: u64) {
    let (from, to) = (hour.to_string(), (hour + 3600).to_string());
    let rfc = |secs: u64| {
        chrono::DateTime::from_timestamp(secs as i64, 0)
            .unwrap()
            .to_rfc3339()
    };
    let (from, to) = (rfc(from.parse().unwrap()), rfc(to.parse().unwrap()));
    let (ok, out, err) = ctl_binary_at(
        store,
        &[
            "usage", "--tenant", "acme", "--by", "hour", "--from", &from, "--to", &to, "--json",
        ],
    );
    assert!(ok, "{out}{err}");
    let total = &json(&out)["total"];
    for (column, want) in [
        ("prompt_tokens", 350_000),
        ("cached_prompt_tokens", 20_000),
        ("cache_write_prompt_tokens", 40_000),
        ("cache_write_1h_prompt_tokens", 60_000),
        ("completion_tokens", 4_000),
        ("reasoning_tokens", 1_000),
        ("cost_micros", cost),
    ] {
        assert_eq!(total[column], want, "{column} of {total}");
    }
    let dir = crate::operations::temp_dir("reconcile-parts");
    let export = |reasoning: u64| {
        let text = format!(
            "hour,model,input,cache_read,cache_5m,cache_1h,output,thinking,usd\n\
             {hour},claude-sonnet-4,350000,20000,40000,60000,4000,{reasoning},{}.{:06}\n",
            cost / 1_000_000,
            cost % 1_000_000
        );
        crate::operations::document(&dir, &format!("export-{reasoning}.csv"), &text)
    };
    let reconcile = |file: &str| {
        ctl_binary_at(
            store,
            &[
                "reconcile",
                "--provider-usage",
                file,
                "--from",
                &from,
                "--to",
                &to,
                "--columns",
                "hour_start=hour,input_tokens=input,cached_input_tokens=cache_read,\
                 cache_write_input_tokens=cache_5m,cache_write_1h_input_tokens=cache_1h,\
                 output_tokens=output,reasoning_tokens=thinking,cost=usd",
                "--format",
                "json",
            ],
        )
    };
    let (ok, out, err) = reconcile(&export(1_000));
    assert!(ok, "no drift: {out}{err}");
    let row = &json(&out)["rows"][0];
    for m in [
        "input_tokens",
        "cached_input_tokens",
        "cache_write_input_tokens",
        "cache_write_1h_input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cost_micros",
    ] {
        assert_eq!(row[m]["drift_pct"], 0.0, "{m} of {row}");
    }
    let (ok, out, err) = reconcile(&export(1_100));
    assert!(!ok && err.contains("1 of 1 row drifts"), "{out}{err}");
    let row = &json(&out)["rows"][0];
    assert_eq!(row["reasoning_tokens"]["drift_pct"], 9.09, "{row}");
    assert_eq!(row["flagged"], true);
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}
