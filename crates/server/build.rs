//! Compiles the workspace's `proto/` with protox (pure Rust, so no system
//! `protoc` is needed) and writes the encoded descriptor set that gRPC server
//! reflection serves. The Lua scripts are the store crate's
//! (`crates/store/build.rs`).

use prost::Message;
use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "../../proto/ctxbudget/v1/budget.proto",
        // Envoy's rate limit service: the part served (proto/envoy/README.md).
        "../../proto/envoy/service/ratelimit/v3/rls.proto",
        // Envoy's external processor: the part served (proto/envoy/README.md).
        "../../proto/envoy/service/ext_proc/v3/external_processor.proto",
    ];
    println!("cargo:rerun-if-changed=../../proto");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let fds = protox::compile(protos, ["../../proto"])?;
    fs::write(out.join("ctxbudget_descriptor.bin"), fds.encode_to_vec())?;
    // proto3 JSON (serde) of ctxbudget's own messages, for the HTTP API.
    pbjson_build::Builder::new()
        .register_descriptors(&fds.encode_to_vec())?
        .out_dir(&out)
        // Every field, defaults too: a curl user reads `"allowed": false`.
        .emit_fields()
        .build(&[".ctxbudget.v1"])?;
    tonic_prost_build::configure()
        // Undecodable requests are INVALID_ARGUMENT (see crates/server/src/api/codec.rs).
        .codec_path("crate::api::codec::Codec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
