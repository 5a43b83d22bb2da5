//! The core's decoders of stored bytes and parsers of ids under libFuzzer:
//! the first byte picks the form, the rest is its bytes (see
//! `ctxbudget_core::stored`). Links the core crate only. Any panic is a
//! finding. Run with `FUZZ_TARGET=stored_bytes scripts/fuzz.sh`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ctxbudget_core::stored::decode_any(data);
});
