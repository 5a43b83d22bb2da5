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
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
