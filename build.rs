//! Compiles `proto/` with protox (pure Rust, so no system `protoc` is needed),
//! writes the encoded descriptor set that gRPC server reflection serves, and
//! gives each budget script in `lua/` its prelude: the constants of
//! `src/domain/budget/layout.rs` (the Rust algorithm's own), the clock, and
//! for the scripts that write the usage ledger `lua/ledger.lua`, for those that
//! read level states `lua/state.lua`, for those that write them `lua/level.lua`,
//! for those that queue threshold alerts `lua/alerts.lua`;
//! and makes `reserve_first.lua` of `reserve.lua` wrapped in a function.

use prost::Message;
use std::fmt::Write as _;
use std::{env, fs, path::PathBuf};

#[path = "src/domain/budget/layout.rs"]
#[allow(dead_code, unreachable_pub)]
mod layout;

/// The scripts that run the budget algorithm.
const BUDGET_SCRIPTS: [&str; 9] = [
    "reserve",
    "settle",
    "renew",
    "status",
    "charge",
    "global_lease",
    "alert_claim",
    "alert_done",
    "alert_index",
];
/// The scripts that write the usage ledger: `lua/ledger.lua` joins their prelude.
const LEDGER_SCRIPTS: [&str; 2] = ["reserve", "settle"];
/// The scripts that queue threshold alerts: `lua/alerts.lua` joins their prelude.
const ALERT_SCRIPTS: [&str; 3] = ["reserve", "settle", "charge"];
/// The scripts that read level states: `lua/state.lua` joins their prelude.
const STATE_SCRIPTS: [&str; 5] = ["reserve", "settle", "renew", "charge", "global_lease"];
/// The scripts that write level states: `lua/level.lua` joins their prelude.
const LEVEL_SCRIPTS: [&str; 3] = ["reserve", "charge", "global_lease"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/ctxbudget/v1/budget.proto",
        // Envoy's rate limit service: the part served (proto/envoy/README.md).
        "proto/envoy/service/ratelimit/v3/rls.proto",
        // Envoy's external processor: the part served (proto/envoy/README.md).
        "proto/envoy/service/ext_proc/v3/external_processor.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    for dir in ["lua", "lua/splice"] {
        for script in fs::read_dir(dir)? {
            println!("cargo:rerun-if-changed={}", script?.path().display());
        }
    }

    println!("cargo:rerun-if-changed=src/domain/budget/layout.rs");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    for name in BUDGET_SCRIPTS {
        let script = fs::read_to_string(format!("lua/{name}.lua"))?;
        fs::write(
            out.join(format!("{name}.lua")),
            with_prelude(&script, name)?,
        )?;
    }
    fs::write(out.join("reserve_first.lua"), reserve_first()?)?;

    let fds = protox::compile(protos, ["proto"])?;
    fs::write(out.join("ctxbudget_descriptor.bin"), fds.encode_to_vec())?;
    // proto3 JSON (serde) of ctxbudget's own messages, for the HTTP API.
    pbjson_build::Builder::new()
        .register_descriptors(&fds.encode_to_vec())?
        .out_dir(&out)
        // Every field, defaults too: a curl user reads `"allowed": false`.
        .emit_fields()
        .build(&[".ctxbudget.v1"])?;
    tonic_prost_build::configure()
        // Undecodable requests are INVALID_ARGUMENT (see src/api/codec.rs).
        .codec_path("crate::api::codec::Codec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

/// `script` with the shared constants and the clock after its first line (the
/// `#!lua` shebang must stay first).
fn with_prelude(script: &str, name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let (shebang, body) = shebang_and_body(script, name)?;
    let mut out = format!("{shebang}\n");
    out.push_str(&prelude(name)?);
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

/// The constants, the clock and the shared Lua of script `name`.
fn prelude(name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::from("-- prelude from src/domain/budget/layout.rs (build.rs)\n");
    for (lua, value) in layout::LUA_CONSTANTS {
        assert!(
            value.fract() == 0.0 && value.abs() < 9e15,
            "{lua} must be an exact integer"
        );
        writeln!(out, "local {lua} = {}", *value as i64)?;
    }
    for (lua, byte) in layout::LUA_STRINGS {
        writeln!(out, "local {lua} = '{}'", char::from(*byte))?;
    }
    writeln!(out, "{}", layout::SERVER_CLOCK)?;
    if LEDGER_SCRIPTS.contains(&name) {
        out.push_str(&fs::read_to_string("lua/ledger.lua")?);
    }
    if STATE_SCRIPTS.contains(&name) {
        out.push_str(&fs::read_to_string("lua/state.lua")?);
    }
    if LEVEL_SCRIPTS.contains(&name) {
        out.push_str(&fs::read_to_string("lua/level.lua")?);
    }
    if ALERT_SCRIPTS.contains(&name) {
        out.push_str(&fs::read_to_string("lua/alerts.lua")?);
    }
    Ok(out)
}

/// `lua/reserve_first.lua` after reserve.lua's prelude and
/// `reserve_one(KEYS, ARGV)`: reserve.lua's body as a function, its KEYS and
/// ARGV the arguments, the prelude's names its upvalues (27 of Lua 5.1's 60).
fn reserve_first() -> Result<String, Box<dyn std::error::Error>> {
    let reserve = fs::read_to_string("lua/reserve.lua")?;
    let (_, reserve) = shebang_and_body(&reserve, "reserve")?;
    let driver = fs::read_to_string("lua/reserve_first.lua")?;
    let (shebang, driver) = shebang_and_body(&driver, "reserve_first")?;
    let mut out = format!("{shebang}\n");
    out.push_str(&prelude("reserve")?);
    out.push_str("-- reserve.lua as reserve_one (build.rs)\n");
    out.push_str("local function reserve_one(KEYS, ARGV)\n");
    out.push_str(&splice(reserve, "reserve")?);
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
