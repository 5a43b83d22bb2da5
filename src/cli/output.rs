//! Output of the operator commands: aligned tables for people, JSON for scripts.

use crate::config::LevelSection;
use serde::Serialize;

/// Prints `value` as pretty JSON.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
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

/// A level's limits in one line: `60 req/1m, 500000 tok/1m, 5 concurrent`.
pub fn rate_summary(level: &LevelSection) -> String {
    let mut parts = Vec::new();
    for (unit, rates) in [("req", &level.requests), ("tok", &level.tokens)] {
        for r in rates {
            let period = match &r.period {
                crate::config::Period::Secs(s) => crate::domain::decision::period_label(*s),
                crate::config::Period::Text(t) => t.clone(),
            };
            parts.push(format!("{} {unit}/{period}", r.limit));
        }
    }
    if let Some(c) = level.concurrency {
        parts.push(format!("{c} concurrent"));
    }
    if parts.is_empty() {
        "unlimited".into()
    } else {
        parts.join(", ")
    }
}
