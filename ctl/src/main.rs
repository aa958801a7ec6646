//! `gpuctl`: the gpumesh command-line client. Exit codes: 0 ok, 1 negative answer, 2 error
//! (`run` exits with its job's code).
//! Data goes to stdout, messages to stderr.

mod args;
mod cli;
mod client;
mod commands;
mod config;
mod ids;
mod output;
mod units;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use gpu_proto::tls;

use crate::cli::{Cli, DEFAULT_TIMEOUT, Noun, PULL_TIMEOUT};
use crate::client::{Credentials, Endpoints};
use crate::commands::{Answer, Ctx, Failure};
use crate::config::{CtlConfig, DEFAULT_ENDPOINT};

/// What `gpuctl --version` prints after the name: the version and the commit it was built
/// from (`build.rs`), `0.1.0 (commit 3439984)`.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUMESH_COMMIT"),
    ")"
);

/// The bearer token: `GPUCTL_TOKEN`, else the token file. Without either, requests go out
/// unauthenticated and the agent says so.
fn load_credentials(token_file: Option<&std::path::Path>) -> Result<Credentials, String> {
    if let Ok(token) = std::env::var("GPUCTL_TOKEN") {
        return Credentials::new(Some(&token));
    }
    match token_file {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .map_err(|e| format!("reading the token file {}: {e}", path.display()))?;
            Credentials::new(Some(&token))
        }
        None => Credentials::new(None),
    }
}

/// TLS from the CA file (and the client certificate and key, both or neither); plaintext when
/// no CA file is given. A key file other users could read is refused.
fn load_tls(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
    let Some(ca) = ca else {
        return match cert.or(key) {
            Some(_) => Err("a client certificate needs the cluster CA too (--ca-file)".into()),
            None => Ok(None),
        };
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => {
            let key_pem = tls::read_secret(key).map_err(|e| e.to_string())?;
            Some((tls::read_public(cert).map_err(|e| e.to_string())?, key_pem))
        }
        (None, None) => None,
        _ => return Err("--cert-file and --key-file go together".into()),
    };
    let ca_pem = tls::read_public(ca).map_err(|e| e.to_string())?;
    Ok(Some(tls::client_config(
        &ca_pem,
        client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
    )))
}

/// `gpuctl generate completion SHELL | man DIR`, straight from the clap definition.
fn generate(what: cli::GenerateVerb) -> std::io::Result<()> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    match what {
        cli::GenerateVerb::Completion { shell } => {
            let mut cmd = cmd;
            clap_complete::generate(shell, &mut cmd, "gpuctl", &mut std::io::stdout());
            Ok(())
        }
        cli::GenerateVerb::Man { dir } => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(cmd, &dir)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Noun::Generate(what) = cli.command {
        return match generate(what) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match CtlConfig::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let endpoints = cli
        .endpoint
        .or(config.endpoint)
        .unwrap_or_else(|| vec![DEFAULT_ENDPOINT.to_owned()]);
    let token_file = cli.token_file.or(config.token_file);
    let credentials = match load_credentials(token_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let tls = match load_tls(
        cli.ca_file.or(config.ca_file).as_deref(),
        cli.cert_file.or(config.cert_file).as_deref(),
        cli.key_file.or(config.key_file).as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let ctx = Ctx {
        endpoints: Endpoints::new(
            endpoints,
            cli.timeout
                .unwrap_or(if matches!(cli.command, Noun::Image(_)) {
                    PULL_TIMEOUT
                } else {
                    DEFAULT_TIMEOUT
                }),
            credentials,
            tls,
        ),
        output: cli.output,
        timeout: cli.timeout,
    };
    let result: Result<Answer, Failure> = runtime.block_on(async {
        match cli.command {
            Noun::Cluster(verb) => commands::cluster::run(&ctx, verb).await,
            Noun::Node(verb) => commands::node::run(&ctx, verb).await,
            Noun::Gpu(verb) => commands::gpu::run(&ctx, verb).await,
            Noun::Image(verb) => commands::image::run(&ctx, verb).await,
            Noun::Job(verb) => commands::job::run(&ctx, verb).await,
            Noun::Debug(verb) => commands::debug::run(&ctx, verb).await,
            Noun::Token(verb) => commands::token::run(&ctx, verb).await,
            Noun::Audit(verb) => commands::audit::run(&ctx, verb).await,
            Noun::Cert(verb) => commands::cert::run(&ctx, verb).await,
            Noun::Scheduler(verb) => commands::scheduler::run(&ctx, verb).await,
            Noun::Alert(verb) => commands::alert::run(&ctx, verb).await,
            Noun::Top { interval, once } => commands::top::run(&ctx, interval, once).await,
            Noun::Tenant(verb) => commands::tenant::run(&ctx, verb).await,
            Noun::Run(args) => commands::run::run(&ctx, *args).await,
            Noun::Generate(_) => Err(Failure::Usage("generate runs without an agent".into())),
        }
    });
    match result {
        Ok(answer) => {
            output::emit(&answer.text);
            if answer.positive {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(Failure::JobEnded(code)) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
