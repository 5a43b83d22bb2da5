//! The `ctxbudget` binary: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
    ctxbudget::cli::run(ctxbudget::cli::Cli::parse()).await
}
