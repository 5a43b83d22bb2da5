//! The Lua scripts in `lua/`, embedded at build time. Each file opens with its
//! contract (KEYS, ARGV, return value, invariants). The budget scripts come
//! from `build.rs`, which gives each the constants of
//! [`crate::domain::layout`] and the clock as a prelude.

/// Takes a reservation at every level, all or nothing.
pub const RESERVE: &str = include_str!(concat!(env!("OUT_DIR"), "/reserve.lua"));
/// Takes a reservation on the first of several plans with room (fallback
/// candidates): reserve.lua on each in turn, in one call.
pub const RESERVE_FIRST: &str = include_str!(concat!(env!("OUT_DIR"), "/reserve_first.lua"));
/// Commits or refunds a reservation.
pub const SETTLE: &str = include_str!(concat!(env!("OUT_DIR"), "/settle.lua"));
/// Extends a live reservation's lease.
pub const RENEW: &str = include_str!(concat!(env!("OUT_DIR"), "/renew.lua"));
/// Reads budgets without writing.
pub const STATUS: &str = include_str!(concat!(env!("OUT_DIR"), "/status.lua"));
/// Takes requests or tokens with no reservation behind them.
pub const CHARGE: &str = include_str!(concat!(env!("OUT_DIR"), "/charge.lua"));
/// A replica's sync with the global level on a Redis Cluster (leased chunks).
pub const GLOBAL_LEASE: &str = include_str!(concat!(env!("OUT_DIR"), "/global_lease.lua"));
/// A sender claims a tenant's due threshold alerts.
pub const ALERT_CLAIM: &str = include_str!(concat!(env!("OUT_DIR"), "/alert_claim.lua"));
/// What became of a claimed alert.
pub const ALERT_DONE: &str = include_str!(concat!(env!("OUT_DIR"), "/alert_done.lua"));
/// On a Redis Cluster, the index of alert queues as the tenant's scripts saw them.
pub const ALERT_INDEX: &str = include_str!(concat!(env!("OUT_DIR"), "/alert_index.lua"));
/// A shared level's line of waiting calls.
pub const LINE: &str = include_str!(concat!(env!("OUT_DIR"), "/line.lua"));

/// Changes one configuration document (versioned, audited, announced).
pub const CONFIG_SET: &str = include_str!(concat!(env!("OUT_DIR"), "/config_set.lua"));
/// Seeds the configuration when Redis holds no tier.
pub const CONFIG_SEED: &str = include_str!(concat!(env!("OUT_DIR"), "/config_seed.lua"));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::budget::calls;
    use crate::domain::layout::SERVER_CLOCK;

    /// Every budget script as built, by name.
    const BUDGET_SCRIPTS: [(&str, &str); 11] = [
        ("reserve", RESERVE),
        ("reserve_first", RESERVE_FIRST),
        ("settle", SETTLE),
        ("renew", RENEW),
        ("status", STATUS),
        ("charge", CHARGE),
        ("global_lease", GLOBAL_LEASE),
        ("alert_claim", ALERT_CLAIM),
        ("alert_done", ALERT_DONE),
        ("alert_index", ALERT_INDEX),
        ("line", LINE),
    ];

    /// Every name in capitals a budget script uses is a local it declares (the
    /// prelude's constants, or its own): Redis refuses an undeclared global
    /// only when that line runs, perhaps in production.
    #[test]
    fn every_constant_a_budget_script_uses_is_declared() {
        for (name, script) in BUDGET_SCRIPTS {
            assert!(
                script.starts_with("#!lua"),
                "{name}: the shebang stays first"
            );
            assert!(
                script.contains(SERVER_CLOCK),
                "{name}: the clock is in the prelude"
            );
            let code: String = script
                .lines()
                .map(|l| l.split("--").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let code = strip_strings(&code);
            for word in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let constant = word.len() > 1
                    && word.starts_with(|c: char| c.is_ascii_uppercase())
                    && word.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                if constant && !matches!(word, "KEYS" | "ARGV") {
                    assert!(
                        code.contains(&format!("local {word} =")),
                        "{name}.lua uses {word} without declaring it"
                    );
                }
            }
        }
    }

    /// `code` with the contents of its '…' string literals blanked.
    fn strip_strings(code: &str) -> String {
        let mut inside = false;
        code.chars()
            .map(|c| {
                if c == '\'' {
                    inside = !inside;
                }
                if inside && c != '\'' { ' ' } else { c }
            })
            .collect()
    }

    /// The lines of a spliced rule (`lua/splice/`) worth recognising: code,
    /// not comments, long enough to be the rule's own.
    fn rule_lines(snippet: &str) -> Vec<&str> {
        snippet
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("--") && l.len() >= 30)
            .collect()
    }

    /// A rule written once in `lua/splice/` reaches every script that asks
    /// for it, and no script in `lua/` carries its own copy of it: a copy
    /// would drift from the one the Rust algorithm is held to.
    #[test]
    fn no_script_carries_its_own_copy_of_a_spliced_rule() {
        let root = env!("CARGO_MANIFEST_DIR");
        let built = BUDGET_SCRIPTS;
        let scripts = lua_files(&format!("{root}/lua"));
        let rules = lua_files(&format!("{root}/lua/splice"));
        assert!(rules.len() >= 4, "the spliced rules are found: {rules:?}");
        for (rule, snippet) in &rules {
            let lines = rule_lines(snippet);
            assert!(!lines.is_empty(), "{rule} has lines to look for");
            let marker = format!("--@splice {rule}");
            let mut spliced = 0;
            for (script, source) in &scripts {
                for line in source.lines().map(str::trim) {
                    assert!(
                        !lines.contains(&line),
                        "lua/{script}.lua carries its own copy of lua/splice/{rule}.lua \
                         ({line:?}): write `{marker}` instead"
                    );
                }
                if !source.lines().any(|l| l.trim() == marker) {
                    continue;
                }
                spliced += 1;
                let (_, text) = built
                    .iter()
                    .find(|(name, _)| name == script)
                    .expect("a script that splices is a budget script");
                for line in &lines {
                    // As built: positions written by name are numbers there.
                    let line = calls::positions(line).expect("positions calls.rs declares");
                    assert!(text.contains(&line), "{script} lacks the spliced {line:?}");
                }
            }
            assert!(spliced > 0, "lua/splice/{rule}.lua is spliced nowhere");
        }
        for (name, text) in built {
            assert!(
                !text.contains("--@splice"),
                "{name}: a marker left unspliced"
            );
        }
    }

    /// The `.lua` files directly in `dir`, by name without the extension.
    fn lua_files(dir: &str) -> Vec<(String, String)> {
        let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
            .expect("a readable lua directory")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "lua"))
            .map(|p| {
                let name = p
                    .file_stem()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned();
                (name, std::fs::read_to_string(&p).expect("a script"))
            })
            .collect();
        files.sort();
        files
    }
}
