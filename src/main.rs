//! The `ctxbudget` binary: parses the command line and hands over to the library.

use clap::Parser;

/// mimalloc instead of the system allocator: every RPC allocates (HTTP/2 frames,
/// protobuf messages, script arguments), and glibc malloc took about a fifth of
/// the service's CPU under load (`ctxbudget bench`, README).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
    ctxbudget::cli::run(ctxbudget::cli::Cli::parse()).await
}
