//! `gpuctl`: the gpumesh command-line client. Exit codes: 0 ok, 1 negative answer, 2 error.
//! Data goes to stdout, messages to stderr.

mod args;
mod cli;
mod client;
mod commands;
mod ids;
mod output;
mod units;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, DEFAULT_TIMEOUT, Noun};
use crate::client::Endpoints;
use crate::commands::{Answer, Ctx, Failure};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let ctx = Ctx {
        endpoints: Endpoints::new(cli.endpoint, cli.timeout.unwrap_or(DEFAULT_TIMEOUT)),
        output: cli.output,
        timeout: cli.timeout,
    };
    let result: Result<Answer, Failure> = runtime.block_on(async {
        match cli.command {
            Noun::Cluster(verb) => commands::cluster::run(&ctx, verb).await,
            Noun::Node(verb) => commands::node::run(&ctx, verb).await,
            Noun::Gpu(verb) => commands::gpu::run(&ctx, verb).await,
            Noun::Job(verb) => commands::job::run(&ctx, verb).await,
            Noun::Debug(verb) => commands::debug::run(&ctx, verb).await,
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
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
