//! `loopx serve`: open the store, take the data dir's lock, serve until
//! SIGINT/SIGTERM, then answer parked claims and exit cleanly. [`App`] wires a
//! broker (core, HTTP state, background loops) from an [`AppConfig`]; the
//! integration tests build theirs with it, so they run what users run. Only
//! process concerns (flags, lock, signals, file limit) stay in [`run`].

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::broker::MAX_WAIT_SECONDS;
use crate::config::{self, DatabaseUrl, Secret, TokenSource};
use crate::http::{self, AppState, ConnectionLimits, OwnerToken};
use crate::lark::long_connection::{ConnectorStatus, LongConnection};
use crate::lark::{EventMode, LarkConfig};
use crate::store::postgres::PgStore;
use crate::store::sqlite::{Durability, SqliteStore};
use crate::store::{Store, retention};

/// Run the broker.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The address to listen on. Non-loopback addresses need --allow-remote.
    #[arg(long, env = "LOOPX_LISTEN", default_value = "127.0.0.1:7317")]
    pub listen: SocketAddr,
    /// Where the SQLite database, the owner token and the lock live (with
    /// --database-url, only the owner token)
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A PostgreSQL URL (postgres://…) for replicas sharing one database; the
    /// embedded SQLite store in the data dir is used when this is unset.
    #[arg(long, env = "LOOPX_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,
    /// Read the owner token from this file (LOOPX_TOKEN wins over it).
    #[arg(long, env = "LOOPX_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    pub allow_remote: bool,
    /// SQLite only (PostgreSQL follows its server's synchronous_commit):
    /// `full` survives power loss (every commit synced before it is
    /// answered); `relaxed` only process crashes (answered at the commit,
    /// synced right behind it), and is faster.
    #[arg(long, env = "LOOPX_DURABILITY", value_enum, default_value_t = Durability::Full)]
    pub durability: Durability,
    /// The Lark app's id; with the secret, turns the Lark connector on.
    #[arg(long, env = "LOOPX_LARK_APP_ID")]
    pub lark_app_id: Option<String>,
    /// The Lark app's secret.
    #[arg(long, env = "LOOPX_LARK_APP_SECRET", hide_env_values = true)]
    pub lark_app_secret: Option<Secret>,
    /// How Lark events reach the broker: `long-connection` (the broker
    /// connects to Lark; no public address needed) or `webhook` (Lark posts
    /// to /v1/connectors/lark/events; needs the verification token)
    /// [default: webhook when a verification token is set, else long-connection].
    #[arg(long, env = "LOOPX_LARK_EVENTS", value_enum)]
    pub lark_events: Option<EventMode>,
    /// The Verification Token of the app's event subscription (webhook only).
    #[arg(long, env = "LOOPX_LARK_VERIFICATION_TOKEN", hide_env_values = true)]
    pub lark_verification_token: Option<Secret>,
    /// The Encrypt Key of the app's event subscription (webhook only: events
    /// then arrive encrypted and signed).
    #[arg(long, env = "LOOPX_LARK_ENCRYPT_KEY", hide_env_values = true)]
    pub lark_encrypt_key: Option<Secret>,
    /// Lark's Open Platform (https://open.larksuite.com outside China).
    #[arg(long, env = "LOOPX_LARK_BASE_URL", default_value = crate::lark::DEFAULT_BASE_URL)]
    pub lark_base_url: String,
    /// Caps claim waits below the contract's 1800 s (for fuzzing a live broker).
    #[arg(
        long,
        env = "LOOPX_MAX_WAIT_SECONDS",
        default_value_t = MAX_WAIT_SECONDS,
        hide = true
    )]
    pub max_wait_seconds: u64,
    /// Seconds between keep-alive comments on parked SSE claims.
    #[arg(long, env = "LOOPX_SSE_KEEP_ALIVE", default_value_t = DEFAULT_KEEP_ALIVE_SECONDS, hide = true)]
    pub sse_keep_alive_seconds: u64,
    /// Prune sessions closed more than this many days ago, with all their
    /// turns, claims, events and Lark rows, in small batches at start and
    /// hourly [default: keep everything].
    #[arg(long, env = "LOOPX_RETAIN_CLOSED_DAYS", value_parser = clap::value_parser!(u32).range(1..))]
    pub retain_closed_days: Option<u32>,
    /// Release the turn of a holder that said it works on its claim (a
    /// `loopx mcp` bridge does every minute) and has been silent this long
    /// since (e.g. `5m`, `90s`, `2s`; a bare number is seconds). A holder
    /// that never says so (a hook, an API client) is never released by time.
    #[arg(long, env = "LOOPX_HOLDER_SILENCE", default_value = "5m", value_parser = parse_duration)]
    pub holder_silence: Duration,
    /// Announce a working agent `stalled` (on the Web page, in
    /// `attached-session-list`, once in its linked Lark chat) when none of
    /// its hooks has said a word for this long (e.g. `10m`, `2s`; `0`:
    /// never). The next hook event clears it; time alone never releases its
    /// turn.
    #[arg(long, env = "LOOPX_STALL_AFTER", default_value = "10m", value_parser = parse_duration_or_never)]
    pub stall_after: Duration,
    /// Close a session whose agent exited (its SessionEnd hook said it
    /// left; not `/clear`, whose next session continues it) this long ago
    /// with nothing waiting for it (e.g. `5m`, `2s`; `0`: never). A message
    /// sent meanwhile keeps it open for the agent to be resumed.
    #[arg(long, env = "LOOPX_CLOSE_EXITED_AFTER", default_value = "5m", value_parser = parse_duration_or_never)]
    pub close_exited_after: Duration,
    #[command(flatten)]
    pub limits: ConnectionLimits,
}

/// Remove the sessions closed more than N days ago, with all their rows.
#[derive(Debug, Clone, clap::Args)]
pub struct PruneArgs {
    /// Prune the sessions closed more than this many days ago.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub older_than_days: u32,
    /// The broker's data dir (its SQLite store)
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The replicas' PostgreSQL URL, instead of the data dir's SQLite store.
    #[arg(long, env = "LOOPX_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,
}

/// A duration as [`parse_duration`] reads it, or `0`: never (zero).
pub fn parse_duration_or_never(text: &str) -> Result<Duration, String> {
    match text.trim() {
        "0" => Ok(Duration::ZERO),
        _ => parse_duration(text),
    }
}

/// A duration: a number with a unit (`ms`, `s`, `m`, `h`), or bare seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as 5m, 90s or 500ms"))?;
    let millis = match unit.trim() {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        _ => return Err(format!("`{text}`: the unit is one of ms, s, m, h")),
    };
    match millis {
        Some(0) => Err("a duration must be more than zero".into()),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err(format!("`{text}` is too long")),
    }
}

/// Seconds between keep-alive comments on parked SSE claims.
const DEFAULT_KEEP_ALIVE_SECONDS: u64 = 15;

/// Descriptors the broker keeps besides its connections: the store's files
/// and pool, the listener, the lock, logs, the Lark client's sockets.
const OTHER_DESCRIPTORS: u64 = 128;

/// What a broker is built from, however it starts: [`run`] fills it from the
/// flags, the integration tests from their fixtures, and both go through
/// [`App::new`] and [`App::serve`], so the tests run the wiring users run.
pub struct AppConfig {
    pub store: Arc<dyn Store>,
    pub owner_token: String,
    /// The comment interval on parked SSE claims.
    pub keep_alive: Duration,
    /// The claim wait cap (the contract's 1800 s, lowered only for fuzzing).
    pub max_wait_seconds: u64,
    /// The Lark connector, off when `None`.
    pub lark: Option<LarkConfig>,
    /// Prune sessions closed this many days ago, at start and hourly.
    pub retain_closed_days: Option<u32>,
    /// How long a holder that names its claim may be silent before the
    /// broker releases its turn.
    pub holder_silence: Duration,
    /// How long a working agent may go without a hook event before it is
    /// announced stalled (zero: never).
    pub stall_after: Duration,
    /// How long after its agent exited an idle session closes (zero: never).
    pub close_exited_after: Duration,
    pub limits: ConnectionLimits,
    /// Where uploads' files stream to before they are stored (unnamed
    /// temporary files): `<data dir>/uploads`.
    pub upload_dir: PathBuf,
}

impl AppConfig {
    /// A broker over `store` with `serve`'s defaults.
    pub fn new(store: Arc<dyn Store>, owner_token: String) -> Self {
        Self {
            store,
            owner_token,
            keep_alive: Duration::from_secs(DEFAULT_KEEP_ALIVE_SECONDS),
            max_wait_seconds: MAX_WAIT_SECONDS,
            lark: None,
            retain_closed_days: None,
            holder_silence: crate::broker::DEFAULT_HOLDER_SILENCE,
            stall_after: crate::broker::DEFAULT_STALL_AFTER,
            close_exited_after: crate::broker::DEFAULT_CLOSE_EXITED_AFTER,
            limits: ConnectionLimits::default(),
            upload_dir: std::env::temp_dir(),
        }
    }
}

/// A wired broker whose background loops run, ready to serve a listener.
pub struct App {
    state: AppState,
    limits: ConnectionLimits,
    /// The Lark reply dispatcher and the long connection, when on.
    lark_tasks: Vec<tokio::task::JoinHandle<()>>,
    shutdown: CancellationToken,
}

impl App {
    /// Wires the broker core and the HTTP state, and starts the background
    /// loops (Lark replies and long connection, retention); `shutdown` stops
    /// all of them.
    pub fn new(config: AppConfig, shutdown: CancellationToken) -> Self {
        if let Some(days) = config.retain_closed_days {
            tokio::spawn(retention::run(config.store.clone(), days, shutdown.clone()));
        }
        tokio::spawn(retention::sweep_blobs(
            config.store.clone(),
            shutdown.clone(),
        ));
        let broker = Arc::new(
            Broker::new(config.store, shutdown.clone())
                .with_max_wait_seconds(config.max_wait_seconds)
                .with_holder_silence(config.holder_silence)
                .with_stall_after(config.stall_after)
                .with_close_exited_after(config.close_exited_after),
        );
        tokio::spawn(broker.clone().sweep_holders());
        let mut lark_tasks = Vec::new();
        let mut lark_connector = None;
        if let Some(lark) = &config.lark {
            lark_tasks.push(broker.spawn_lark_dispatcher(lark.clone()));
            lark_tasks.push(broker.spawn_lark_fetcher(lark.clone()));
        }
        if let Some(lark) = config
            .lark
            .clone()
            .filter(|lark| lark.events == EventMode::LongConnection)
        {
            let status = Arc::new(ConnectorStatus::new(broker.metrics()));
            let connection = LongConnection::new(
                lark,
                broker.clone(),
                status.clone(),
                shutdown.clone(),
                Duration::from_secs(config.limits.shutdown_grace_seconds),
            );
            lark_tasks.push(tokio::spawn(connection.run()));
            lark_connector = Some(status);
        }
        let state = AppState {
            broker,
            owner_token: Arc::new(OwnerToken::new(config.owner_token)),
            keep_alive: config.keep_alive,
            lark: config.lark.map(Arc::new),
            lark_connector,
            openapi: crate::openapi::document_json,
            uploads: Arc::new(http::attachments::Uploads::new(config.upload_dir)),
        };
        Self {
            state,
            limits: config.limits,
            lark_tasks,
            shutdown,
        }
    }

    /// The broker core, for what the HTTP API does not reach.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.state.broker
    }

    /// Serves `listener` until shutdown, then lets the Lark dispatcher and
    /// long connection finish (the connection acknowledges the event it is
    /// committing, within the grace period, and closes).
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let connections = self.state.broker.metrics().connections.clone();
        let router = http::router(self.state);
        http::serve(listener, router, self.shutdown, self.limits, connections).await?;
        for task in self.lark_tasks {
            let _ = task.await;
        }
        Ok(())
    }
}

/// Runs the broker until a signal; `Err` is a message for the operator.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    if !args.allow_remote && !args.listen.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {}: it is not a loopback address; pass --allow-remote to expose the broker",
            args.listen
        ));
    }
    let database_url = database_url(args.database_url.as_ref())?;
    let lark = lark_config(&args)?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(config::default_data_dir);
    config::prepare_data_dir(&data_dir)
        .map_err(|e| format!("cannot create the data dir {}: {e}", data_dir.display()))?;
    // One process per SQLite file. With PostgreSQL many replicas share the
    // database, each with a data dir of its own that holds only the owner
    // token (give them one token: LOOPX_TOKEN or --token-file).
    let _lock = match database_url {
        None => Some(lock_data_dir(&data_dir)?),
        Some(_) => None,
    };
    let (token, source) = config::owner_token(args.token_file.as_deref(), &data_dir, true)?;
    let store = open_store(&data_dir, database_url, args.durability).await?;
    let limits = fit_file_limit(args.limits.clone());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let lark_events = match lark.as_ref().map(|lark| lark.events) {
        None => "off",
        Some(EventMode::LongConnection) => "long-connection",
        Some(EventMode::Webhook) => "webhook",
    };
    let app = App::new(
        AppConfig {
            keep_alive: Duration::from_secs(args.sse_keep_alive_seconds.max(1)),
            max_wait_seconds: args.max_wait_seconds,
            lark,
            retain_closed_days: args.retain_closed_days,
            holder_silence: args.holder_silence,
            stall_after: args.stall_after,
            close_exited_after: args.close_exited_after,
            limits,
            upload_dir: data_dir.join("uploads"),
            ..AppConfig::new(store, token)
        },
        shutdown,
    );
    let listen = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(
        %listen,
        data_dir = %data_dir.display(),
        durability = ?args.durability,
        lark = lark_events,
        "loopx broker listening"
    );
    announce_page(listen, &source);
    app.serve(listener)
        .await
        .map_err(|e| format!("the server failed: {e}"))?;
    tracing::info!("loopx broker stopped");
    Ok(())
}

/// Tells a person where the chat page is and which token it asks for; on the
/// data dir's first start, that the token was just created.
fn announce_page(listen: SocketAddr, token: &TokenSource) {
    // An unspecified address (0.0.0.0, ::) listens on every interface; this
    // machine reaches it on loopback.
    let mut page = listen;
    if page.ip().is_unspecified() {
        page.set_ip(match page {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let from = match token {
        TokenSource::Env => "the LOOPX_TOKEN variable".to_owned(),
        TokenSource::File(path) | TokenSource::Created(path) => path.display().to_string(),
    };
    tracing::info!("chat page: http://{page}/ (paste the token from {from} into the page)");
    if let TokenSource::Created(path) = token {
        tracing::info!(
            "first start: the owner token was just created in {} (mode 0600); every /v1 request needs it",
            path.display()
        );
    }
}

/// `loopx prune`: a one-off run of the retention `--retain-closed-days` runs
/// hourly. On SQLite the broker must be stopped (one process per data dir);
/// PostgreSQL replicas may keep serving.
pub async fn prune(args: PruneArgs) -> Result<retention::Pruned, String> {
    let database_url = database_url(args.database_url.as_ref())?;
    let data_dir = args.data_dir.unwrap_or_else(config::default_data_dir);
    let _lock = match database_url {
        None => Some(
            lock_data_dir(&data_dir)
                .map_err(|e| format!("{e} (a running broker prunes with --retain-closed-days)"))?,
        ),
        Some(_) => None,
    };
    let store = open_store(&data_dir, database_url, Durability::Full).await?;
    let cutoff = retention::cutoff_ms(crate::time::now_ms(), args.older_than_days);
    retention::prune(store.as_ref(), cutoff, Duration::ZERO)
        .await
        .map_err(|e| format!("pruning failed: {}", e.message))
}

/// `--database-url`, unless blank: it must be a PostgreSQL URL.
fn database_url(url: Option<&DatabaseUrl>) -> Result<Option<&str>, String> {
    match url.map(|u| u.0.as_str()).filter(|u| !u.trim().is_empty()) {
        Some(url) if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) => Err(
            "--database-url must be a postgres:// (or postgresql://) URL; unset it to use the embedded SQLite store"
                .into(),
        ),
        url => Ok(url),
    }
}

/// PostgreSQL when a URL is given, else the data dir's SQLite file.
pub async fn open_store(
    data_dir: &std::path::Path,
    database_url: Option<&str>,
    durability: Durability,
) -> Result<Arc<dyn Store>, String> {
    Ok(match database_url {
        Some(url) => Arc::new(
            PgStore::open(url)
                .await
                .map_err(|e| format!("cannot open the PostgreSQL store: {}", e.message))?,
        ),
        None => Arc::new(
            SqliteStore::open(&data_dir.join("broker.db"), durability)
                .await
                .map_err(|e| {
                    format!(
                        "cannot open the store in {}: {}",
                        data_dir.display(),
                        e.message
                    )
                })?,
        ),
    })
}

/// Raises the soft open-file limit to the hard one (a default shell's 1,024
/// would otherwise be an outage at ~1,000 connections) and lowers the
/// connection cap to what the limit can hold, saying so.
fn fit_file_limit(mut limits: ConnectionLimits) -> ConnectionLimits {
    let before = rlimit::Resource::NOFILE.get().map(|(soft, _)| soft).ok();
    let soft = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read or raise the open-file limit");
            return limits;
        }
    };
    let budget = soft.saturating_sub(OTHER_DESCRIPTORS) as usize;
    let needed = limits.max_connections + limits.connection_reserve;
    if needed > budget {
        // A tenth for the reserve at most, the rest for served connections.
        limits.connection_reserve = limits.connection_reserve.min(budget / 10);
        limits.max_connections = budget.saturating_sub(limits.connection_reserve).max(1);
        tracing::warn!(
            file_limit = soft,
            needed = needed as u64 + OTHER_DESCRIPTORS,
            max_connections = limits.max_connections,
            connection_reserve = limits.connection_reserve,
            "the open-file limit cannot hold --max-connections and its reserve; serving fewer (raise the hard limit: ulimit -Hn, or LimitNOFILE= in systemd)"
        );
    }
    tracing::info!(
        file_limit = soft,
        raised_from = before,
        max_connections = limits.max_connections,
        connection_reserve = limits.connection_reserve,
        "connections"
    );
    limits
}

/// The Lark connector's configuration, off when no Lark setting is given.
/// The long connection needs the app id and secret; the webhook (the default
/// when a verification token is set, so existing deployments keep theirs)
/// needs the verification token too.
fn lark_config(args: &ServeArgs) -> Result<Option<LarkConfig>, String> {
    let token = args.lark_verification_token.as_ref().map(|t| t.0.clone());
    let events = args.lark_events.unwrap_or(match token {
        Some(_) => EventMode::Webhook,
        None => EventMode::LongConnection,
    });
    let (app_id, secret) = match (&args.lark_app_id, &args.lark_app_secret) {
        (None, None) if token.is_none() && args.lark_events.is_none() => return Ok(None),
        (Some(app_id), Some(secret)) => (app_id.clone(), secret.0.clone()),
        _ => {
            return Err(
                "the Lark connector needs --lark-app-id and --lark-app-secret together".into(),
            );
        }
    };
    let base_url = args.lark_base_url.clone();
    match (events, token) {
        (EventMode::LongConnection, _) => {
            Ok(Some(LarkConfig::long_connection(app_id, secret, base_url)))
        }
        (EventMode::Webhook, Some(token)) => Ok(Some(LarkConfig::new(
            app_id,
            secret,
            token,
            args.lark_encrypt_key.as_ref().map(|k| k.0.clone()),
            base_url,
        ))),
        (EventMode::Webhook, None) => Err(
            "--lark-events webhook needs --lark-verification-token (or use --lark-events long-connection, which needs no public address)"
                .into(),
        ),
    }
}

/// One broker per data dir: an exclusive lock held for the process lifetime
/// (released by the OS however the process ends).
fn lock_data_dir(data_dir: &std::path::Path) -> Result<File, String> {
    let path = data_dir.join("broker.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another loopx broker is already serving the data dir {}; stop it first, or pass another --data-dir",
            data_dir.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM can be handled");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: answering parked claims and finishing requests");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn lark_events_of(args: &[&str]) -> Result<Option<crate::lark::EventMode>, String> {
        let mut argv = vec!["loopx", "serve"];
        argv.extend(args);
        let Command::Serve(serve) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        super::lark_config(&serve).map(|c| c.map(|c| c.events))
    }

    #[test]
    fn the_lark_events_default_keeps_webhooks_and_needs_only_id_and_secret_otherwise() {
        use crate::lark::EventMode::{LongConnection, Webhook};
        let app = ["--lark-app-id", "cli_1", "--lark-app-secret", "s"];
        let token = ["--lark-verification-token", "t"];
        assert_eq!(lark_events_of(&[]), Ok(None));
        assert_eq!(lark_events_of(&app), Ok(Some(LongConnection)));
        assert_eq!(
            lark_events_of(&[&app[..], &token].concat()),
            Ok(Some(Webhook))
        );
        let long = ["--lark-events", "long-connection"];
        assert_eq!(
            lark_events_of(&[&app[..], &token, &long].concat()),
            Ok(Some(LongConnection))
        );
        let webhook = ["--lark-events", "webhook"];
        assert!(lark_events_of(&[&app[..], &webhook].concat()).is_err());
        assert!(lark_events_of(&["--lark-app-id", "cli_1"]).is_err());
        assert!(lark_events_of(&long).is_err());
        assert!(lark_events_of(&token).is_err());
    }

    #[test]
    fn the_serve_and_prune_arguments_debug_print_without_secrets() {
        let url = "postgres://loopx:hunter2@db.internal/loopx?password=s3cret";
        let serve = Cli::try_parse_from([
            "loopx",
            "serve",
            "--database-url",
            url,
            "--lark-app-id",
            "cli_1",
            "--lark-app-secret",
            "lark-secret-1",
            "--lark-verification-token",
            "lark-token-1",
            "--lark-encrypt-key",
            "lark-key-1",
        ])
        .unwrap();
        let prune = Cli::try_parse_from([
            "loopx",
            "prune",
            "--older-than-days",
            "1",
            "--database-url",
            url,
        ])
        .unwrap();
        for cli in [serve, prune] {
            assert!(matches!(cli.command, Command::Serve(_) | Command::Prune(_)));
            let shown = format!("{cli:?}");
            assert!(shown.contains("db.internal"), "{shown}");
            for secret in [
                "hunter2",
                "s3cret",
                "lark-secret-1",
                "lark-token-1",
                "lark-key-1",
            ] {
                assert!(!shown.contains(secret), "{shown} shows {secret}");
            }
        }
    }
}
