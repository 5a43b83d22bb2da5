//! Compiles `proto/` with protox (pure Rust, so no system `protoc` is needed) and
//! writes the encoded descriptor set that gRPC server reflection serves.

use prost::Message;
use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ctxbudget/v1/budget.proto";
    println!("cargo:rerun-if-changed={proto}");
    for script in fs::read_dir("lua")? {
        println!("cargo:rerun-if-changed={}", script?.path().display());
    }

    let fds = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("ctxbudget_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        // Undecodable requests are INVALID_ARGUMENT (see src/api/codec.rs).
        .codec_path("crate::api::codec::Codec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
