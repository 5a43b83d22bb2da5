//! Output of the operator commands: aligned tables and plain sentences for
//! people, JSON for scripts, and documents that the `set` commands take back.

use crate::config::{
    LevelOverrideSection, LevelSection, Period, RateSection, ShadowSection, UNLIMITED,
};
use crate::domain::decision::period_label;
use crate::domain::{LevelLimits, Rate, Setting, Tier};
use serde::Serialize;

/// Prints `value` as pretty JSON.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints `section` as a TOML document under `# ` comment lines: what `get`
/// shows and `set` takes back unchanged.
pub fn print_document<T: Serialize>(comments: &[String], section: &T) -> anyhow::Result<()> {
    for line in comments {
        match line.is_empty() {
            true => println!("#"),
            false => println!("# {line}"),
        }
    }
    print!("{}", toml_document(section)?);
    Ok(())
}

/// `value` as a TOML document in the style of the example configuration: each
/// table's plain values first, lists of rates inline on one line, then its
/// sub-tables under `[a.b]` headers.
pub fn toml_document<T: Serialize>(value: &T) -> anyhow::Result<String> {
    let table = toml::Table::try_from(value)?;
    let mut out = String::new();
    write_table(&mut out, "", &table);
    Ok(out.trim_start().to_string())
}

fn write_table(out: &mut String, path: &str, table: &toml::Table) {
    let (tables, values): (Vec<_>, Vec<_>) = table.iter().partition(|(_, v)| v.is_table());
    if !values.is_empty() && !path.is_empty() {
        out.push_str(&format!("\n[{path}]\n"));
    }
    for (k, v) in values {
        out.push_str(&format!("{} = {v}\n", toml_key(k)));
    }
    for (k, v) in tables {
        let sub = match path {
            "" => toml_key(k),
            p => format!("{p}.{}", toml_key(k)),
        };
        if let toml::Value::Table(t) = v {
            write_table(out, &sub, t);
        }
    }
}

fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        key.to_string()
    } else {
        toml::Value::String(key.to_string()).to_string()
    }
}

/// Prints rows under headers, columns aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}

fn rate_parts(unit: &str, rates: &[Rate]) -> Vec<String> {
    rates
        .iter()
        .map(|r| format!("{} {unit}/{}", r.limit, period_label(r.period_secs)))
        .collect()
}

/// A level's limits in one line: `60 req/1m, 500000 tok/1m, 5 concurrent`.
pub fn limits_summary(level: &LevelLimits) -> String {
    let mut parts = rate_parts("req", &level.requests);
    parts.extend(rate_parts("tok", &level.tokens));
    if let Some(c) = level.concurrency {
        parts.push(format!("{c} concurrent"));
    }
    if parts.is_empty() {
        UNLIMITED.into()
    } else {
        parts.join(", ")
    }
}

/// A written level's limits in one line (see [`limits_summary`]).
pub fn rate_summary(level: &LevelSection) -> String {
    match level.to_domain("") {
        Ok(l) => limits_summary(&l),
        Err(e) => format!("invalid ({e})"),
    }
}

/// What an override says about a level, in one line: the kinds it names, then
/// `the rest from the tier`.
pub fn override_summary(level: &LevelOverrideSection) -> String {
    let mut parts = Vec::new();
    let rates = |name: &str, unit: &str, s: &Setting<Vec<RateSection>>, parts: &mut Vec<_>| match s
    {
        Setting::Inherit => {}
        Setting::Unlimited => parts.push(format!("{name} {UNLIMITED}")),
        Setting::Limit(r) => match crate::config::rates("", r) {
            Ok(r) => parts.extend(rate_parts(unit, &r)),
            Err(e) => parts.push(format!("{name} invalid ({e})")),
        },
    };
    rates("requests", "req", &level.requests, &mut parts);
    rates("tokens", "tok", &level.tokens, &mut parts);
    match &level.concurrency {
        Setting::Inherit => {}
        Setting::Unlimited => parts.push(format!("concurrency {UNLIMITED}")),
        Setting::Limit(c) => parts.push(format!("{c} concurrent")),
    }
    match (parts.is_empty(), level.is_empty()) {
        (true, _) => "the tier's".into(),
        _ => format!("{}; the rest from the tier", parts.join(", ")),
    }
}

/// Domain limits as a written level: for JSON reports that read like documents.
pub fn level_section(level: &LevelLimits) -> LevelSection {
    let rates = |rates: &[Rate]| {
        rates
            .iter()
            .map(|r| RateSection {
                limit: r.limit,
                period: Period::Text(period_label(r.period_secs)),
            })
            .collect()
    };
    LevelSection {
        requests: rates(&level.requests),
        tokens: rates(&level.tokens),
        input_tokens: rates(&level.input_tokens),
        output_tokens: rates(&level.output_tokens),
        concurrency: level.concurrency,
    }
}

/// The limits in force of a resolved tier, by level: for JSON reports.
#[derive(Serialize)]
pub struct Effective {
    /// Tenant level.
    pub tenant: LevelSection,
    /// User level.
    pub user: LevelSection,
    /// The quota in shadow, if any: tenant and user levels.
    pub shadow: Option<ShadowSection>,
}

impl Effective {
    /// The levels of `tier` (as resolved for a tenant).
    pub fn of(tier: &Tier) -> Self {
        Effective {
            tenant: level_section(&tier.tenant),
            user: level_section(&tier.user),
            shadow: tier.shadow.as_ref().map(|s| ShadowSection {
                tenant: level_section(&s.tenant),
                user: level_section(&s.user),
                models: Default::default(),
            }),
        }
    }
}

/// The limits in force of a resolved tier as lines: `tenant  600 req/1m, …`.
pub fn effective_lines(tier: &Tier) -> Vec<String> {
    let mut lines = vec![
        format!("tenant  {}", limits_summary(&tier.tenant)),
        format!("user    {}", limits_summary(&tier.user)),
    ];
    if let Some(s) = &tier.shadow {
        lines.push(format!(
            "shadow  tenant {}; user {}",
            limits_summary(&s.tenant),
            limits_summary(&s.user)
        ));
    }
    lines
}
