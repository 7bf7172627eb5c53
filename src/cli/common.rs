//! What every client command shares: the broker connection options, the one
//! way to find the owner token and run a command over the typed [`Client`],
//! and how answers, refusals and exit codes are printed.
//!
//! Every command prints either exactly the broker's JSON answer (`--format
//! json`, for scripts) or a short summary for people (`--format text`), and
//! exits 0 on success, 1 when the broker refused, 2 on a usage or local input
//! error (checked before any request is sent) and 3 when the broker is
//! unreachable. These commands never start, resume or fake an agent runtime.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use crate::client::{Client, ClientError, DEFAULT_BROKER_URL, Reply};
use crate::config::{self, TokenSource};

/// Exit code: the broker refused (or answered something this client does not understand).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: a usage or local input error; nothing was sent.
pub const EXIT_LOCAL: u8 = 2;
/// Exit code: no HTTP answer from the broker.
pub const EXIT_UNREACHABLE: u8 = 3;

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A short summary for people.
    Text,
    /// Exactly the broker's JSON answer, one document on stdout.
    Json,
}

/// The options of every client command that prints answers.
#[derive(Debug, Clone, Args)]
pub struct ClientOptions {
    /// `text` for people; `json` prints exactly the broker's JSON answer
    /// (also its error body on a refusal), one document on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    #[command(flatten)]
    pub connection: Connection,
}

/// Where the broker is and how to prove the owner: shared by every client command.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Broker connection")]
pub struct Connection {
    /// The broker's base URL.
    #[arg(long, env = "LOOPX_BROKER_URL", default_value = DEFAULT_BROKER_URL, value_parser = parse_broker_url)]
    pub broker_url: String,
    /// Read the owner token from this file (LOOPX_TOKEN wins over it).
    #[arg(long, env = "LOOPX_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The broker's data dir, whose owner.token is used when neither
    /// LOOPX_TOKEN nor --token-file is given
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl Connection {
    /// The data dir: `--data-dir`, else the default one `serve` uses.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(config::default_data_dir)
    }

    /// The typed client with the owner token, found as `serve` finds it, and
    /// where the token came from; `Err` is the message for a local error.
    pub fn client(&self) -> Result<(Client, TokenSource), String> {
        let data_dir = self.data_dir();
        let (token, source) = config::owner_token(self.token_file.as_deref(), &data_dir, false)
            .map_err(|reason| {
                format!(
                    "no owner token: LOOPX_TOKEN is not set and {reason}; set LOOPX_TOKEN, pass --token-file FILE, or point --data-dir at the broker's data dir (where `loopx serve` keeps owner.token)"
                )
            })?;
        Ok((Client::new(&self.broker_url, Some(token)), source))
    }
}

/// An http(s) URL, so that a typo is a usage error (2), not an unreachable broker (3).
pub fn parse_broker_url(value: &str) -> Result<String, String> {
    let url = url::Url::parse(value).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(value.trim_end_matches('/').to_owned()),
        "http" | "https" => Err("the URL has no host".into()),
        other => Err(format!("the scheme must be http or https, not {other}")),
    }
}

// ---------------------------------------------------------------------------
// Running a command: token, runtime, output and exit codes
// ---------------------------------------------------------------------------

/// What a running command has: the client and how to print.
pub struct Ctx {
    pub client: Client,
    pub format: Format,
}

impl Ctx {
    /// Prints an answer: the raw body in json format, `text()` otherwise.
    pub fn print(&self, reply: &Reply, text: impl FnOnce() -> String) {
        match self.format {
            Format::Json => stdout_line(&reply.text),
            Format::Text => stdout_line(&text()),
        }
    }
}

/// Finds the token, runs `command` on a current-thread runtime and turns its
/// outcome into the exit code.
pub fn with_client<F, Fut>(options: ClientOptions, command: F) -> ExitCode
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = Result<(), ClientError>>,
{
    let (client, source) = match options.connection.client() {
        Ok(found) => found,
        Err(message) => return local_error(&message),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let ctx = Ctx {
        client,
        format: options.format,
    };
    match runtime.block_on(command(ctx)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => client_error(error, options.format, Some(&source)),
    }
}

/// Reports a failed call: the refusal's code on stderr (and, in json format,
/// the broker's error body on stdout for scripts).
/// `source` says where the owner token came from, for commands that sent one.
pub fn client_error(error: ClientError, format: Format, source: Option<&TokenSource>) -> ExitCode {
    match error {
        ClientError::Unreachable { url, reason } => {
            eprintln!("loopx: the broker at {url} is unreachable: {reason}");
            eprintln!("loopx: is `loopx serve` running there? (--broker-url / LOOPX_BROKER_URL)");
            ExitCode::from(EXIT_UNREACHABLE)
        }
        ClientError::Refused { reply, error } => {
            if format == Format::Json {
                stdout_line(&reply.text);
            }
            let detail = &error.error;
            let code = detail.code_str();
            eprintln!("loopx: {code}: {}", detail.message);
            if let (Some(claim_id), Some(at)) = (&detail.active_claim_id, &detail.claimed_at) {
                eprintln!("loopx: the active claim is {claim_id}, claimed at {at}");
            }
            if code == "unauthorized"
                && let Some(source) = source
            {
                eprintln!(
                    "loopx: the owner token came from {source}; it must be the broker's owner token"
                );
            }
            ExitCode::from(EXIT_REFUSED)
        }
        ClientError::Unexpected { reply, reason } => {
            eprintln!(
                "loopx: unexpected answer ({}) from the broker: {reason}; is --broker-url a LoopX broker?",
                reply.status
            );
            ExitCode::from(EXIT_REFUSED)
        }
    }
}

pub fn local_error(message: &str) -> ExitCode {
    eprintln!("loopx: {message}");
    ExitCode::from(EXIT_LOCAL)
}

/// One line on stdout; a closed pipe (`| head`) is not worth a panic.
pub fn stdout_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}
