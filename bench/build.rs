//! Generates the client for the few etcd v3 RPCs the benchmarks call, with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/etcd_subset.proto";
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(config, &[proto], &["proto"])?;
    println!("cargo:rerun-if-changed={proto}");
    Ok(())
}
