//! Request validation and key encoding under libFuzzer: the first byte picks
//! the RPC, the rest is its request message (see `ctxbudget_server::api::validate`).
//! Any panic is a finding. Run with `scripts/fuzz.sh`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ctxbudget_server::api::validate::check_bytes(data);
});
