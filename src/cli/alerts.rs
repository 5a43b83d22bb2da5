//! `ctxbudget alerts`: the threshold alerts of a shared store — `list` the
//! ones queued (not delivered yet, with their tries) and the recent ones sent
//! or dropped; `test` sends a made-up event to the receiver, signed as the
//! service signs, and says how the receiver answered.

use super::admin::AdminArgs;
use super::output::{outln, print_json, table};
use super::usage::{ledger_store, live_limits};
use crate::alerts::event::Event;
use crate::alerts::webhook;
use crate::config::{AlertsSection, FileConfig};
use crate::domain::alert::percent;
use crate::domain::{Clock, SystemClock};
use crate::store::AlertStore;
use crate::store::keys::Keys;
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::path::PathBuf;

/// `ctxbudget alerts` verbs.
#[derive(Debug, Subcommand)]
pub enum AlertsCmd {
    /// The alerts queued for delivery and the last ones sent or dropped.
    List {
        /// How many recent alerts to show.
        #[arg(long, default_value_t = 20)]
        recent: usize,
    },
    /// Send a test event to the receiver, signed, and report its answer.
    Test(TestArgs),
}

/// `ctxbudget alerts test` flags: the receiver, from the service's file or given.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The service's configuration file: its `[alerts]` receiver and secret.
    #[arg(long, env = "CTXBUDGET_CONFIG")]
    pub config: Option<PathBuf>,
    /// The receiver's URL (instead of the file's).
    #[arg(long)]
    pub webhook_url: Option<String>,
    /// The signing secret (instead of the file's).
    #[arg(long, env = "CTXBUDGET_ALERTS_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
}

/// Runs `ctxbudget alerts`.
pub(super) async fn alerts(cmd: AlertsCmd, admin: AdminArgs) -> anyhow::Result<()> {
    match cmd {
        AlertsCmd::List { recent } => list(&admin, recent).await,
        AlertsCmd::Test(args) => test(args, admin.json).await,
    }
}

async fn list(admin: &AdminArgs, recent: usize) -> anyhow::Result<()> {
    if admin.endpoint().is_none() {
        anyhow::bail!(
            "the alert queue is in Redis: pass --redis-url or set CTXBUDGET_REDIS_URL (with the \
             in-memory store it lives inside the service, whose log has every alert: \
             \"threshold alert\")"
        );
    }
    let store = ledger_store(admin).await?;
    let (_, limits) = live_limits(admin).await?;
    let keys = Keys::new(&admin.key_prefix)?;
    let backlog = store.alert_backlog().await?;
    let queued: Vec<Value> = backlog
        .queued
        .iter()
        .map(|a| {
            let mut v = Event::of(a, &keys, &limits)
                .map_or_else(|| json!({"event_id": a.id}), |e| json!(e));
            v["status"] = "queued".into();
            v["attempts"] = a.attempts.into();
            v
        })
        .collect();
    let recent: Vec<Value> = store
        .recent_alerts(recent)
        .await?
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if admin.json {
        return print_json(&json!({
            "queued": queued,
            "recent": recent,
            "dropped": backlog.dropped,
        }));
    }
    print_table(&queued, &recent, backlog.dropped);
    Ok(())
}

/// The queued alerts, then the recent ones, a line each.
fn print_table(queued: &[Value], recent: &[Value], dropped: u64) {
    let cell = |v: &Value, k: &str| match &v[k] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let rows: Vec<Vec<String>> = queued
        .iter()
        .chain(recent)
        .map(|v| {
            let limit = format!(
                "{} {}{}",
                cell(&v["limit"], "limit"),
                cell(&v["limit"], "dimension"),
                match (&v["limit"]["window"], &v["limit"]["period_secs"]) {
                    (Value::String(w), _) => format!(" / {w}"),
                    (_, Value::Number(p)) => format!(" / {p}s"),
                    _ => String::new(),
                }
            );
            vec![
                cell(v, "status"),
                cell(v, "timestamp"),
                cell(v, "tenant"),
                cell(v, "user"),
                cell(v, "level"),
                limit,
                format!("{}%", percent(v["threshold"].as_f64().unwrap_or(0.0))),
                v["usage"]
                    .as_f64()
                    .map_or_else(|| "-".into(), |u| format!("{u:.0}")),
                cell(v, "attempts"),
                cell(v, "event_id"),
            ]
        })
        .collect();
    table(
        &[
            "STATUS",
            "CROSSED AT",
            "TENANT",
            "USER",
            "LEVEL",
            "LIMIT",
            "AT",
            "USAGE",
            "TRIES",
            "EVENT",
        ],
        &rows,
    );
    outln!(
        "({} queued; {dropped} dropped in all: a full queue, or not delivered within max_age)",
        queued.len(),
    );
}

async fn test(args: TestArgs, json_out: bool) -> anyhow::Result<()> {
    let mut section = match &args.config {
        Some(path) => FileConfig::read(path)?.alerts.unwrap_or_default(),
        None => AlertsSection::default(),
    };
    if args.webhook_url.is_some() {
        section.webhook_url = args.webhook_url;
    }
    if args.secret.is_some() {
        section.secret = args.secret;
    }
    let settings = section.settings()?;
    let url = settings
        .webhook_url
        .clone()
        .context("no receiver: pass --webhook-url, or --config with an [alerts] webhook_url")?;
    let event = Event::test(SystemClock.now_us());
    let posted = webhook::post(
        &webhook::client(),
        &url,
        settings.secret.as_deref(),
        settings.timeout,
        &event,
    )
    .await;
    if json_out {
        print_json(&json!({
            "webhook_url": url,
            "event_id": event.event_id,
            "signed": settings.secret.is_some(),
            "delivered": posted.is_ok(),
            "error": posted.as_ref().err().map(ToString::to_string),
        }))?;
    }
    match posted {
        Ok(()) => {
            if !json_out {
                outln!(
                    "delivered test event {} to {url}{}",
                    event.event_id,
                    match settings.secret {
                        Some(_) => " (signed)",
                        None => " (unsigned: no secret)",
                    }
                );
            }
            Ok(())
        }
        Err(e) => anyhow::bail!(
            "the test event did not reach {url}: {e}; check the URL, that the receiver \
             answers 2xx to a POST, and its timeout ({:?})",
            settings.timeout
        ),
    }
}
