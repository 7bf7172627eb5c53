//! `loopx health`: asks a broker whether its store answers (`GET /healthz`,
//! no token needed): the container image's `HEALTHCHECK`, and a quick check
//! for people.

use std::process::ExitCode;

use clap::Args;

use super::common::{Format, client_error, local_error, parse_broker_url, stdout_line};
use crate::client::{Client, DEFAULT_BROKER_URL};

/// Asks a broker whether its store answers (`GET /healthz`, no token needed):
/// the container image's `HEALTHCHECK`, and a quick check for people.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The broker's base URL.
    #[arg(long, env = "LOOPX_BROKER_URL", default_value = DEFAULT_BROKER_URL, value_parser = parse_broker_url)]
    pub broker_url: String,
}

/// Exit 0 when the broker answers healthy, 1 when it answers otherwise
/// (`503 store_unavailable`), 3 when nothing answers.
pub fn run(args: HealthArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let client = Client::new(&args.broker_url, None);
    match runtime.block_on(client.healthz()) {
        Ok(_) => {
            stdout_line(&format!("ok: the broker at {} is healthy", args.broker_url));
            ExitCode::SUCCESS
        }
        Err(error) => client_error(error, Format::Text, None),
    }
}
