//! Builds each budget script of `lua/` as its own header asks:
//! `--@prelude NAME…` (right after the `#!lua` line) puts, in order, the
//! constants of the core crate's `layout.rs` and the clock (`layout`) or
//! `lua/NAME.lua` before its body; `--@splice NAME` lines take
//! `lua/splice/NAME.lua` in place; `--@wrap SCRIPT FUNCTION` makes the script
//! a driver after SCRIPT's prelude and SCRIPT's body as `FUNCTION(KEYS, ARGV)`.
//! A script with neither (the configuration's) is loaded as it is. In every
//! script the positions `calls.rs` declares, written by name, become numbers.

use std::fmt::Write as _;
use std::{env, fs, path::PathBuf};

#[path = "../core/src/layout.rs"]
#[allow(dead_code, unreachable_pub)]
mod layout;

#[path = "../core/src/dimension.rs"]
#[allow(dead_code, unreachable_pub)]
mod dimension;

#[path = "../core/src/budget/calls.rs"]
#[allow(dead_code, unreachable_pub)]
mod calls;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for dir in ["lua", "lua/splice"] {
        for script in fs::read_dir(dir)? {
            println!("cargo:rerun-if-changed={}", script?.path().display());
        }
    }

    println!("cargo:rerun-if-changed=../core/src/layout.rs");
    println!("cargo:rerun-if-changed=../core/src/budget/calls.rs");
    println!("cargo:rerun-if-changed=../core/src/dimension.rs");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("spec.rs"), spec_modules()?)?;
    for entry in fs::read_dir("lua")? {
        let path = entry?.path();
        let Some(name) = path
            .file_stem()
            .and_then(|n| n.to_str())
            .filter(|_| path.extension().is_some_and(|e| e == "lua"))
        else {
            continue;
        };
        let script = fs::read_to_string(&path)?;
        if !script.starts_with("#!lua") {
            continue; // a piece a prelude joins, not a script
        }
        let built = match (directive(&script, "prelude"), directive(&script, "wrap")) {
            (Some(_), None) => with_prelude(&script, name)?,
            (None, Some(wrap)) => wrapped(&script, name, &wrap)?,
            (Some(_), Some(_)) => {
                return Err(format!("lua/{name}.lua: --@prelude or --@wrap, not both").into());
            }
            // The configuration's: as it is, but for its positions.
            (None, None) => script,
        };
        let built = calls::positions(&built).map_err(|e| format!("lua/{name}.lua: {e}"))?;
        fs::write(out.join(format!("{name}.lua")), built)?;
    }

    Ok(())
}

/// `script` with the shared constants and the clock after its first line (the
/// `#!lua` shebang must stay first).
fn with_prelude(script: &str, name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let (shebang, body) = shebang_and_body(script, name)?;
    let mut out = format!("{shebang}\n");
    out.push_str(&prelude(script, name)?);
    out.push_str(&splice(body, name)?);
    Ok(out)
}

/// A script's `#!lua` first line and the rest.
fn shebang_and_body<'a>(
    script: &'a str,
    name: &str,
) -> Result<(&'a str, &'a str), Box<dyn std::error::Error>> {
    script
        .split_once('\n')
        .filter(|(first, _)| first.starts_with("#!lua"))
        .ok_or_else(|| format!("lua/{name}.lua must open with a #!lua line").into())
}

/// The words after `--@KIND ` in `script`'s header (the comment lines after
/// its `#!lua` line), if it has such a line.
fn directive(script: &str, kind: &str) -> Option<Vec<String>> {
    let marker = format!("--@{kind} ");
    script
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("--"))
        .find_map(|l| l.strip_prefix(&marker))
        .map(|rest| rest.split_whitespace().map(str::to_owned).collect())
}

/// What script `name`'s `--@prelude` names, in its order: `layout` (the
/// constants and the clock) or a file of `lua/`.
fn prelude(script: &str, name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let parts = directive(script, "prelude")
        .ok_or_else(|| format!("lua/{name}.lua has no --@prelude line"))?;
    let mut out = String::new();
    for part in parts {
        match part.as_str() {
            "layout" => out.push_str(&layout_prelude()?),
            file => out.push_str(
                &fs::read_to_string(format!("lua/{file}.lua"))
                    .map_err(|e| format!("lua/{name}.lua's prelude names lua/{file}.lua: {e}"))?,
            ),
        }
    }
    Ok(out)
}

/// The constants of `crates/core/src/layout.rs`, the dimensions' codes
/// (`crates/core/src/dimension.rs`) and the clock.
fn layout_prelude() -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::from("-- prelude from crates/core/src/layout.rs (build.rs)\n");
    for (lua, value) in layout::LUA_CONSTANTS {
        assert!(
            value.fract() == 0.0 && value.abs() < 9e15,
            "{lua} must be an exact integer"
        );
        writeln!(out, "local {lua} = {}", *value as i64)?;
    }
    // Each rate dimension's code (its digit in a bucket id, its place in a
    // cost vector), and how many there are.
    for d in dimension::Dimension::RATES {
        writeln!(out, "local {} = {}", d.lua_name(), d.code())?;
    }
    writeln!(out, "local DIMS = {}", dimension::RATE_COUNT)?;
    writeln!(out, "local DECLARED_FIRST = {}", dimension::DECLARED_FIRST)?;
    // A denied reservation's mask: a double of 32 bits per 32 checks.
    writeln!(
        out,
        "local DENIED_DOUBLES = {}",
        2 * dimension::MAX_CHECKS.div_ceil(64)
    )?;
    for (lua, byte) in layout::LUA_STRINGS {
        writeln!(out, "local {lua} = '{}'", char::from(*byte))?;
    }
    writeln!(out, "{}", layout::SERVER_CLOCK)?;
    Ok(out)
}

/// A driver (`--@wrap SCRIPT FUNCTION`): SCRIPT's prelude, then
/// `FUNCTION(KEYS, ARGV)` — SCRIPT's body as a function, its KEYS and ARGV the
/// arguments, the prelude's names its upvalues (27 of Lua 5.1's 60 for
/// reserve) — then the driver's own body.
fn wrapped(
    driver: &str,
    name: &str,
    wrap: &[String],
) -> Result<String, Box<dyn std::error::Error>> {
    let [inner, function] = wrap else {
        return Err(format!("lua/{name}.lua: --@wrap SCRIPT FUNCTION").into());
    };
    let script = fs::read_to_string(format!("lua/{inner}.lua"))?;
    let (_, body) = shebang_and_body(&script, inner)?;
    let (shebang, driver) = shebang_and_body(driver, name)?;
    let mut out = format!("{shebang}\n");
    out.push_str(&prelude(&script, inner)?);
    writeln!(out, "-- {inner}.lua as {function} (build.rs)")?;
    writeln!(out, "local function {function}(KEYS, ARGV)")?;
    out.push_str(&splice(body, inner)?);
    out.push_str("end\n");
    out.push_str(driver);
    Ok(out)
}

/// `body` with each `--@splice NAME` line replaced by `lua/splice/NAME.lua`
/// (its comment lines left out), indented as the marker: one rule written
/// once and inlined where it runs, at no function call's cost.
fn splice(body: &str, script: &str) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::with_capacity(body.len() * 2);
    for line in body.lines() {
        let Some(name) = line.trim_start().strip_prefix("--@splice ") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let path = format!("lua/splice/{}.lua", name.trim());
        let snippet = fs::read_to_string(&path)
            .map_err(|e| format!("lua/{script}.lua splices {path}: {e}"))?;
        for l in snippet
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
        {
            writeln!(out, "{indent}{l}")?;
        }
    }
    Ok(out)
}

/// A Rust module per spec group (`crates/core/src/budget/calls.rs`): each field's
/// index in its group, and the group's width.
fn spec_modules() -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::from("// Generated by build.rs from crates/core/src/budget/calls.rs.\n");
    for group in calls::GROUPS {
        writeln!(out, "/// The `{}` group's positions.", group.name)?;
        writeln!(out, "#[allow(dead_code)]")?;
        writeln!(out, "pub(crate) mod {} {{", group.name)?;
        for (i, field) in group.fields.iter().enumerate() {
            writeln!(out, "    /// `{field}`.")?;
            writeln!(
                out,
                "    pub(crate) const {}: usize = {i};",
                field.to_uppercase()
            )?;
        }
        writeln!(out, "    /// How many doubles the group takes.")?;
        writeln!(
            out,
            "    pub(crate) const WIDTH: usize = {};",
            group.fields.len()
        )?;
        writeln!(out, "}}")?;
    }
    Ok(out)
}
