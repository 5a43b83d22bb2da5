//! Output of the operator commands: aligned tables and plain sentences for
//! people, JSON for scripts, and documents that the `set` commands take back.
//!
//! Every byte a command prints goes through [`Stdout`] (the [`outln!`] macro,
//! or a CSV writer over it; a layout test keeps `println!` out of the crate):
//! a reader that goes away early (`ctxbudget inspect … | head`) ends the
//! command quietly with status 0, as it would end `cat` or `grep`, instead of
//! a panic on the broken pipe.

use crate::config::{
    LevelOverrideSection, LevelSection, ModelLimitsSection, ShadowSection, UNLIMITED,
};
use crate::domain::{Dimension, LevelLimits, ModelLimits, Rate, Setting, Tier};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Standard output for the commands. A write the reader closed the pipe on
/// (`EPIPE`) ends the process at once with status 0: the reader has all it
/// wanted (`| head`), so there is nothing to report. Any other write error is
/// returned (to a CSV writer) or reported by [`outln!`].
///
/// Why not restore the default `SIGPIPE` action instead: it would also kill
/// the process, silently, on a write to a Redis or gRPC connection its peer
/// closed, and `serve` must never die of that.
pub(super) struct Stdout;

impl Stdout {
    fn quiet<T>(result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result
            && e.kind() == io::ErrorKind::BrokenPipe
        {
            std::process::exit(0);
        }
        result
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Self::quiet(io::stdout().lock().write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        Self::quiet(io::stdout().lock().write_all(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Self::quiet(io::stdout().lock().flush())
    }
}

/// Writes `text` to [`Stdout`]; a write error other than a closed pipe ends
/// the process with status 1 and the error (a full disk under `> file`).
pub(super) fn write_out(text: &str) {
    if let Err(e) = Stdout.write_all(text.as_bytes()) {
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` for the commands: one line to [`Stdout`] (see [`write_out`]).
macro_rules! outln {
    () => {
        $crate::cli::output::write_out("\n")
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_out(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// `n` and a noun, in the singular for one: `1 tenant`, `2 tenants`.
pub(super) fn count(n: usize, singular: &str, plural: &str) -> String {
    match n {
        1 => format!("1 {singular}"),
        n => format!("{n} {plural}"),
    }
}

/// Prints `value` as pretty JSON.
pub(super) fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints `section` as a TOML document under `# ` comment lines: what `get`
/// shows and `set` takes back unchanged.
pub(super) fn print_document<T: Serialize>(comments: &[String], section: &T) -> anyhow::Result<()> {
    for line in comments {
        match line.is_empty() {
            true => outln!("#"),
            false => outln!("# {line}"),
        }
    }
    write_out(&toml_document(section)?);
    Ok(())
}

/// `value` as a TOML document in the style of the example configuration: each
/// table's plain values first, lists of rates inline on one line, then its
/// sub-tables under `[a.b]` headers.
pub(super) fn toml_document<T: Serialize>(value: &T) -> anyhow::Result<String> {
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
pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) {
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
        outln!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
    if rows.is_empty() {
        outln!("(none)");
    }
}

/// How a rate of `dimension` reads: `60 req/1m`, `500000 tok/1m`,
/// `in 2000000/1m`, `out 400000/1m`, `$500/month`; any other dimension by
/// its name (`50 images/1m`). Input and output token rates name their kind
/// first, so they read apart from the all-token rates.
fn rate_part(dimension: Dimension, rate: &Rate) -> String {
    let (limit, period) = (rate.limit, rate.label());
    match dimension {
        Dimension::Requests => format!("{limit} req/{period}"),
        Dimension::Tokens => format!("{limit} tok/{period}"),
        Dimension::InputTokens => format!("in {limit}/{period}"),
        Dimension::OutputTokens => format!("out {limit}/{period}"),
        Dimension::Spend => format!("${}/{period}", limit as f64 / 1e6),
        other => format!("{limit} {}/{period}", other.as_str()),
    }
}

/// A level's limits in one line:
/// `60 req/1m, 500000 tok/1m, in 2000000/1m, out 400000/1m, 5 concurrent`.
pub(super) fn limits_summary(level: &LevelLimits) -> String {
    let mut parts: Vec<String> = level
        .rates
        .iter()
        .flat_map(|(d, rates)| rates.iter().map(move |r| rate_part(d, r)))
        .collect();
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
pub(super) fn rate_summary(level: &LevelSection) -> String {
    match level.to_domain("") {
        Ok(l) => limits_summary(&l),
        Err(e) => format!("invalid ({e})"),
    }
}

/// What an override says about a level, in one line: the kinds it names, then
/// `the rest from the tier`.
pub(super) fn override_summary(level: &LevelOverrideSection) -> String {
    let mut parts = Vec::new();
    for (d, setting) in level.rates.0.iter() {
        match setting {
            Setting::Inherit => {}
            Setting::Unlimited => parts.push(format!("{} {UNLIMITED}", d.as_str())),
            Setting::Limit(r) => match crate::config::rates("", d, r) {
                Ok(r) => parts.extend(r.iter().map(|r| rate_part(d, r))),
                Err(e) => parts.push(format!("{} invalid ({e})", d.as_str())),
            },
        }
    }
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

/// The limits in force of a resolved tier, by level: for JSON reports.
#[derive(Serialize)]
pub(super) struct Effective {
    /// Tenant level.
    pub tenant: LevelSection,
    /// User level.
    pub user: LevelSection,
    /// Session level (of each session of a user).
    pub session: LevelSection,
    /// How long a session's keys live unused (seconds).
    pub session_ttl_secs: u64,
    /// The quota in shadow, if any: tenant and user levels, and per model group.
    pub shadow: Option<ShadowSection>,
    /// The tier's limits per model group, by group name.
    pub models: BTreeMap<String, ModelLimitsSection>,
}

impl Effective {
    /// The levels of `tier` (as resolved for a tenant).
    pub(super) fn of(tier: &Tier) -> Self {
        Effective {
            tenant: LevelSection::of(&tier.tenant),
            user: LevelSection::of(&tier.user),
            session: LevelSection::of(&tier.session),
            session_ttl_secs: tier.session_ttl_secs,
            shadow: tier.shadow.as_ref().map(|s| ShadowSection {
                tenant: LevelSection::of(&s.tenant),
                user: LevelSection::of(&s.user),
                models: model_sections(&s.models),
            }),
            models: model_sections(&tier.models),
        }
    }
}

/// Domain per-group limits as written ones.
fn model_sections(models: &BTreeMap<String, ModelLimits>) -> BTreeMap<String, ModelLimitsSection> {
    models
        .iter()
        .map(|(name, m)| {
            let section = ModelLimitsSection {
                tenant: LevelSection::of(&m.tenant),
                user: LevelSection::of(&m.user),
                session: LevelSection::of(&m.session),
            };
            (name.clone(), section)
        })
        .collect()
}

/// The limits in force of a resolved tier as lines: `tenant  600 req/1m, …`,
/// then one line per model group the tier limits (`model gpt-4o  tenant …;
/// user …`), and the same for the quota in shadow.
pub(super) fn effective_lines(tier: &Tier) -> Vec<String> {
    let mut lines = vec![
        format!("tenant  {}", limits_summary(&tier.tenant)),
        format!("user    {}", limits_summary(&tier.user)),
    ];
    if !tier.session.is_unlimited() {
        lines.push(format!(
            "session {} (keys kept {} unused)",
            limits_summary(&tier.session),
            crate::domain::level::period_label(tier.session_ttl_secs)
        ));
    }
    lines.extend(model_lines("", &tier.models));
    if let Some(s) = &tier.shadow {
        lines.push(format!(
            "shadow  tenant {}; user {}",
            limits_summary(&s.tenant),
            limits_summary(&s.user)
        ));
        lines.extend(model_lines("shadow ", &s.models));
    }
    lines
}

fn model_lines<'a>(
    prefix: &'a str,
    models: &'a BTreeMap<String, ModelLimits>,
) -> impl Iterator<Item = String> + 'a {
    models.iter().map(move |(name, m)| {
        let session = match m.session.is_unlimited() {
            true => String::new(),
            false => format!("; session {}", limits_summary(&m.session)),
        };
        format!(
            "{prefix}model {name}  tenant {}; user {}{session}",
            limits_summary(&m.tenant),
            limits_summary(&m.user)
        )
    })
}
