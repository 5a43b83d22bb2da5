//! The `ctxbudget` binary: parses the command line and hands over to the library.

use clap::Parser;

/// mimalloc instead of the system allocator: every RPC allocates (HTTP/2 frames,
/// protobuf messages, script arguments), and glibc malloc took about a fifth of
/// the service's CPU under load (`ctxbudget bench`, docs/benchmarks.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match ctxbudget::cli::run(ctxbudget::cli::Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain of causes, without a backtrace: errors here are for
            // operators, and each says what to do.
            eprintln!("error: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error, then each cause whose words it does not carry already (a store
/// error's text names its cause, which it also gives as its source).
fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}
