//! Generates the tonic/prost code for the public and internal APIs with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/gpumesh/v1/cluster.proto",
        "proto/gpumesh/v1/node.proto",
        "proto/gpumesh/v1/job.proto",
        "proto/gpumesh/v1/auth.proto",
        "proto/gpumesh/v1/scheduler.proto",
        "proto/gpumesh/v1/alert.proto",
        "proto/gpumesh/v1/tenant.proto",
        "proto/gpumesh/v1/account.proto",
        "proto/gpumesh/internal/v1/peer.proto",
    ];
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &protos, &["proto"])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
