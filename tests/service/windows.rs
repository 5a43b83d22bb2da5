//! Calendar windows end to end over both stores: a limit per month in a time
//! zone denies until the month's boundary there, and says so in its status;
//! bad windows are configuration errors naming the field.

use crate::support;

use ctxbudget::config::FileConfig;
use ctxbudget::domain::window::{Window, WindowKind, parse_zone};
use ctxbudget::domain::{Clock, SystemClock};
use ctxbudget::pb::{Dimension, Level, Reason};
use support::{Backend, Harness, reserve};

on_every_store!(a_monthly_limit_denies_until_the_month_ends_in_its_zone);

const MONTHLY: &str = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 2, window = "month", timezone = "Asia/Bangkok" }, { limit = 1000, period = "1m" }] }
"#;

async fn a_monthly_limit_denies_until_the_month_ends_in_its_zone(backend: Backend) {
    let mut h = Harness::start(backend, MONTHLY).await;
    let c = &mut h.client;
    for _ in 0..2 {
        let ok = c
            .check_and_reserve(reserve("acme", "", "t", 1, 1))
            .await
            .unwrap()
            .into_inner();
        assert!(ok.allowed, "{ok:#?}");
    }
    let denied = c
        .check_and_reserve(reserve("acme", "", "t", 1, 1))
        .await
        .unwrap()
        .into_inner();
    let now = SystemClock.now_us();
    let bangkok = Window {
        kind: WindowKind::Month,
        tz: parse_zone("Asia/Bangkok").unwrap(),
    };
    let to_boundary_ms = (bangkok.span(now).end_us - now) / 1000;
    assert!(!denied.allowed);
    assert_eq!(denied.reason(), Reason::RpmExceeded);
    assert_eq!(denied.limiting_level(), Level::Tenant);
    assert_eq!(denied.limiting_period_seconds, 0);
    // Retry at the boundary (computed a moment before `now`), not after a refill.
    let retry = denied.retry_after_ms as i64;
    assert!(
        retry >= to_boundary_ms && retry <= to_boundary_ms + 30_000,
        "retry in {retry} ms, the month ends in {to_boundary_ms} ms"
    );
    assert!(
        denied.detail.contains("month (Asia/Bangkok)"),
        "{}",
        denied.detail
    );
    let monthly = denied
        .limits
        .iter()
        .find(|l| l.window == "month")
        .expect("the windowed limit is reported");
    assert_eq!(monthly.timezone, "Asia/Bangkok");
    assert_eq!(monthly.dimension(), Dimension::Requests);
    assert_eq!((monthly.limit, monthly.remaining), (2, 0));
    assert_eq!(monthly.reset_after_ms, denied.retry_after_ms);
    // The rolling per-minute limit beside it is unchanged in kind.
    let per_minute = denied
        .limits
        .iter()
        .find(|l| l.period_seconds == 60)
        .expect("the rolling limit");
    assert!(per_minute.window.is_empty() && per_minute.timezone.is_empty());
    h.stop().await;
}

#[test]
fn bad_windows_are_configuration_errors_naming_the_field() {
    let err = |rate: &str| {
        let toml = format!(
            "[tiers.t]\nmax_context_tokens = 1000\ndefault_max_output_tokens = 10\n\
             tenant = {{ tokens = [{rate}] }}\n"
        );
        FileConfig::built_in()
            .overlay(FileConfig::parse(&toml, "t").unwrap())
            .settings(Default::default())
            .unwrap_err()
            .to_string()
    };
    let e = err(r#"{ limit = 1, window = "fortnight" }"#);
    assert!(e.contains("tiers.t.tenant.tokens[0].window"), "{e}");
    let e = err(r#"{ limit = 1, window = "day", timezone = "Mars/Olympus_Mons" }"#);
    assert!(e.contains("tiers.t.tenant.tokens[0].timezone"), "{e}");
    let e = err(r#"{ limit = 1, period = "1m", window = "day" }"#);
    assert!(e.contains("not both"), "{e}");
    let e = err(r#"{ limit = 1 }"#);
    assert!(e.contains("tokens[0].period"), "{e}");
    let e =
        err(r#"{ limit = 1, window = "day" }, { limit = 2, window = "day", timezone = "UTC" }"#);
    assert!(e.contains("tokens[1].window"), "{e}");
}
