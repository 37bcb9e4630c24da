//! The `idemgate` command: arguments, logging, and running the proxy until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::serve_admin;
use crate::config::{Config, LogFormat, StoreKind, Workers};
use crate::proxy::{AppState, Shutdown, serve_workers};
use crate::store::{FileOptions, FileStore, MemoryStore, PostgresStore, RedisStore, Store};
use tokio_util::sync::CancellationToken;

mod list;
mod resolve;

pub use list::ListArgs;
pub use resolve::ResolveArgs;

/// An idempotency proxy: makes retried POST/PUT/PATCH/DELETE requests execute at most once.
#[derive(Debug, clap::Parser)]
#[command(name = "idemgate", version, about)]
pub struct Args {
    /// The YAML configuration file.
    #[arg(long, env = "IDEMGATE_CONFIG", value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,
    /// Run without a file: the memory store and every default, in front of URL.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Address to listen on (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Validate the configuration, print it with defaults filled in, and exit.
    #[arg(long)]
    pub check: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the record id a request with KEY would use, for the admin API.
    Key(KeyArgs),
    /// List records on a running proxy's admin listener (`keys list --state ...`).
    Keys(KeysArgs),
}

/// `idemgate keys list ...` (docs/behaviour.md §24).
#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub action: KeysCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Print every record in a state (GET /keys?state=... on the admin listener), one
    /// per line, following next_cursor to the last page.
    List(ListArgs),
}

/// `idemgate key --config PATH [--method M] [--path P] [-H 'Name: value']... KEY`, or
/// `idemgate key resolve ...`: a KEY literally named `resolve` is written after `--`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct KeyArgs {
    /// The request's method.
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// The request's path: it selects the policy, as for a request.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// A request header, e.g. -H 'Authorization: Bearer sk_live_...' (repeatable); the
    /// policy's scope headers and cookies are read from these.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// The key as the client sends it.
    #[arg(required = true)]
    pub key: Option<String>,
    #[command(subcommand)]
    pub action: Option<KeyCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Settle a record whose outcome is unknown (POST /keys/ID/resolve on the admin
    /// listener): --executed false, or the --status (headers, body) it answered.
    Resolve(ResolveArgs),
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("no configuration: give --config PATH (or IDEMGATE_CONFIG), or --upstream URL")]
    NoConfig,
    /// `idemgate key` takes no `--upstream`: the id it prints depends on the settings of
    /// the running proxy (`store.key_prefix`, the routes' key sources and scopes), which
    /// only its file holds.
    #[error(
        "idemgate key needs the configuration the proxy runs with: give --config PATH \
         (or IDEMGATE_CONFIG)"
    )]
    NoKeyConfig,
    #[error("give either --config PATH or --upstream URL, not both")]
    Contradiction,
    #[error("store: {0}")]
    Store(#[source] crate::store::StoreError),
    #[error("{0}")]
    FileStore(#[from] crate::store::file::OpenError),
    /// The PostgreSQL table is another version or not idemgate's (docs/behaviour.md §22).
    #[error("store: {0}")]
    Table(#[source] crate::store::SchemaError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Workers(#[from] crate::proxy::WorkerError),
    #[error("{0}")]
    RecordId(#[from] crate::proxy::RecordIdError),
    #[error("scope_principal: {0}")]
    Jwks(#[from] crate::principal::RefreshError),
    #[error("--method: '{0}' is not an HTTP method")]
    Method(String),
    #[error("-H: '{0}' is not a header; expected 'Name: value'")]
    Header(String),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let matches = <Args as clap::CommandFactory>::command().get_matches();
    let args = match <Args as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(err) => err.exit(),
    };
    // A config named by IDEMGATE_CONFIG in the environment yields to --upstream; one
    // named on the command line next to --upstream is a contradiction.
    let config_on_command_line =
        matches.value_source("config") == Some(clap::parser::ValueSource::CommandLine);
    if args.upstream.is_some() && config_on_command_line {
        return fail(&CliError::Contradiction);
    }
    // Resolving talks to a running proxy's admin listener: it needs no configuration.
    if let Some(Command::Key(KeyArgs {
        action: Some(KeyCommand::Resolve(resolve)),
        ..
    })) = &args.command
    {
        return resolve::run(resolve);
    }
    if let Some(Command::Keys(KeysArgs {
        action: KeysCommand::List(list),
    })) = &args.command
    {
        return list::run(list);
    }
    let config = match load(&args) {
        Ok(config) => config,
        Err(CliError::NoConfig) if matches!(args.command, Some(Command::Key(_))) => {
            return fail(&CliError::NoKeyConfig);
        }
        Err(err) => return fail(&err),
    };
    if let Some(Command::Key(key)) = &args.command {
        return match record_id(&config, key) {
            Ok(id) => {
                #[allow(
                    clippy::print_stdout,
                    reason = "idemgate key prints the id by contract"
                )]
                {
                    println!("{id}");
                }
                ExitCode::SUCCESS
            }
            Err(err) => fail(&err),
        };
    }
    if args.check {
        // A file store's directory must be creatable and writable
        // (docs/behaviour.md §12); checked without leaving anything behind, and without
        // opening the store (which may be in use by the running proxy).
        if config.store.kind == StoreKind::File
            && let Err(err) = crate::store::file::check_path(&config.store.path)
        {
            return fail(&CliError::FileStore(err));
        }
        #[allow(
            clippy::print_stdout,
            reason = "--check prints the configuration by contract"
        )]
        {
            print!("{}", config.to_yaml());
        }
        return ExitCode::SUCCESS;
    }
    let set_level = init_logs(&config);
    // SIGHUP re-reads the file idemgate started with; `--listen` still overrides it.
    let reload_from = match (&args.upstream, &args.config) {
        (None, Some(path)) => Some(Reload {
            path: path.clone(),
            listen: args.listen,
            set_level,
        }),
        _ => None,
    };
    let runtime = if config.workers == Workers::Shared {
        // The runtime's threads batch their lines from their first park on, when the
        // hook that writes them runs; its blocking threads (name lookups) never park.
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .on_thread_park(|| {
                crate::logs::batch_on_this_thread();
                crate::logs::flush();
            })
            .build()
    } else {
        // Worker 0 runs on this thread; `serve_workers` starts the others.
        crate::logs::batch_on_this_thread();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(crate::logs::flush)
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(err) => return fail(&CliError::Runtime(err)),
    };
    let outcome = runtime.block_on(run(config, reload_from));
    // Its threads write what they still hold as they end.
    drop(runtime);
    crate::logs::flush();
    match outcome {
        Ok(Shutdown::Drained) => ExitCode::SUCCESS,
        Ok(Shutdown::TimedOut) => ExitCode::FAILURE,
        // A port in use, a locked store: one plain line, like a configuration error,
        // whatever the log format (a person reads it, not a log pipeline).
        Err(err) => fail(&err),
    }
}

#[allow(
    clippy::print_stderr,
    reason = "before logging is set up, errors go to stderr"
)]
fn fail(err: &CliError) -> ExitCode {
    eprintln!("idemgate: {err}");
    ExitCode::FAILURE
}

/// `idemgate key`: the id through the proxy's own addressing; binds nothing and needs
/// no store.
fn record_id(config: &Config, args: &KeyArgs) -> Result<String, CliError> {
    let method = http::Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| CliError::Method(args.method.clone()))?;
    let mut headers = http::HeaderMap::new();
    for line in &args.headers {
        let parsed = line.split_once(':').and_then(|(name, value)| {
            let name = http::HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
            let value = http::HeaderValue::from_str(value.trim()).ok()?;
            Some((name, value))
        });
        let Some((name, value)) = parsed else {
            return Err(CliError::Header(line.clone()));
        };
        headers.append(name, value);
    }
    let key = args.key.as_deref().unwrap_or_default();
    Ok(crate::proxy::record_id(
        config, &method, &args.path, &headers, key,
    )?)
}

fn load(args: &Args) -> Result<Config, CliError> {
    let mut config = match (&args.upstream, &args.config) {
        (Some(url), _) => Config::for_upstream(url, args.listen)?,
        (None, Some(path)) => Config::from_file(path)?,
        (None, None) => return Err(CliError::NoConfig),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    Ok(config)
}

/// Sets the log level of a running process (`log.level` on reload).
type SetLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Logs to stderr in `log.format`, at `RUST_LOG` if set, else `log.level`. Returns how a
/// reload changes the level: a no-op under `RUST_LOG`, which then keeps deciding.
fn init_logs(config: &Config) -> SetLevel {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let env_decides = from_env.is_some();
    let filter = from_env
        .or_else(|| tracing_subscriber::EnvFilter::try_new(&config.log.level).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match config.log.format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(crate::logs::Stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(crate::logs::Stderr),
            )
            .try_init(),
    };
    Box::new(move |level: &str| {
        if env_decides {
            return Ok(());
        }
        let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

/// Where a SIGHUP reloads from.
struct Reload {
    path: PathBuf,
    listen: Option<SocketAddr>,
    set_level: SetLevel,
}

async fn run(config: Config, reload: Option<Reload>) -> Result<Shutdown, CliError> {
    let config = Arc::new(config);
    let hangups = hangups();
    let listeners = crate::proxy::bind_workers(config.listen, config.workers.resolve())
        .await
        .map_err(|source| CliError::Bind {
            addr: config.listen,
            source,
        })?;
    match config.store.kind {
        StoreKind::Memory => {
            let store = MemoryStore::new(config.store.max_entries)
                .with_scope_quota(config.store.max_entries_per_scope);
            run_with(listeners, config, Arc::new(store), (reload, hangups)).await
        }
        StoreKind::File => {
            let store = FileStore::open(&FileOptions::from_config(&config.store))?;
            tracing::info!(
                path = %config.store.path.display(),
                fsync = config.store.fsync,
                entries = store.len(),
                "file store open"
            );
            run_with(listeners, config, Arc::new(store), (reload, hangups)).await
        }
        StoreKind::Redis => {
            let mut store = RedisStore::for_workers(&config.store, config.workers.resolve())
                .map_err(CliError::Store)?;
            if !config.uses_wait() {
                store = store.without_notifications();
            }
            let store = Arc::new(store);
            tokio::spawn(check_redis(
                Arc::clone(&store),
                config.store.redacted_urls(),
            ));
            run_with(listeners, config, store, (reload, hangups)).await
        }
        StoreKind::Postgres => {
            let mut store = PostgresStore::new(&config.store).map_err(CliError::Store)?;
            if !config.uses_wait() {
                store = store.without_notifications();
            }
            let store = Arc::new(store);
            store.start().await.map_err(CliError::Table)?;
            tracing::info!(
                urls = ?config.store.redacted_urls(),
                table = store.table(),
                "postgres store"
            );
            run_with(listeners, config, store, (reload, hangups)).await
        }
    }
}

async fn run_with<S: Store>(
    listeners: Vec<tokio::net::TcpListener>,
    config: Arc<Config>,
    store: Arc<S>,
    (reload, hangups): (Option<Reload>, Hangups),
) -> Result<Shutdown, CliError> {
    tracing::info!(
        listen = %config.listen,
        upstream = %config.upstream.url,
        store = ?config.store.kind,
        workers = listeners.len(),
        "idemgate serving"
    );
    let state = Arc::new(AppState::new(Arc::clone(&config), store));
    // A `jwks_url` that cannot be read at start is fatal, as a `jwks_file` that cannot
    // is when the configuration loads (docs/behaviour.md §17).
    for verifier in state.live().verifiers() {
        verifier.load().await?;
    }
    let refresher = tokio::spawn(refresh_keys(Arc::clone(&state)));
    let admin_stop = CancellationToken::new();
    if let Some(addr) = config.admin.listen {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(admin) => {
                tracing::info!(admin = %addr, "admin listening: /healthz /readyz /metrics /keys");
                tokio::spawn(serve_admin(
                    admin,
                    Arc::clone(&state),
                    admin_stop.clone().cancelled_owned(),
                ));
            }
            // The proxy is what clients depend on; a taken admin port must not take it down.
            Err(err) => tracing::error!(admin = %addr, error = %err, "admin listener not started"),
        }
    }
    let reloader = tokio::spawn(reload_on_sighup(Arc::clone(&state), reload, hangups));
    let outcome = serve_workers(listeners, Arc::clone(&state), shutdown_signal()).await;
    reloader.abort();
    refresher.abort();
    // The spans of the last requests go out before the process does, for a few seconds
    // at most (docs/behaviour.md §20).
    if let Some(telemetry) = state.live().telemetry().cloned() {
        let flush = TRACES_AT_EXIT;
        match tokio::task::spawn_blocking(move || telemetry.shutdown(flush)).await {
            Ok(true) => tracing::info!("traces: the spans queued at shutdown went out"),
            _ => tracing::warn!(
                "traces: the spans queued at shutdown did not all go out within {flush:?}"
            ),
        }
    }
    // Health and metrics stay up while in-flight requests drain.
    admin_stop.cancel();
    Ok(outcome?)
}

/// How long the exporter gets to send the spans queued at shutdown.
const TRACES_AT_EXIT: Duration = Duration::from_secs(5);

/// Each SIGHUP re-reads the file; without one it is logged and ignored
/// (docs/behaviour.md §14).
async fn reload_on_sighup<S: Store>(
    state: Arc<AppState<S>>,
    reload: Option<Reload>,
    hangups: Hangups,
) {
    #[cfg(unix)]
    {
        let Some(mut hangups) = hangups else {
            return;
        };
        while hangups.recv().await.is_some() {
            let Some(reload) = &reload else {
                tracing::warn!("SIGHUP ignored: idemgate runs without a configuration file");
                continue;
            };
            match crate::proxy::reload::reload(
                &state,
                &reload.path,
                reload.listen,
                &*reload.set_level,
            ) {
                Ok(()) => tracing::info!(path = %reload.path.display(), "configuration reloaded"),
                Err(err) => tracing::error!(
                    path = %reload.path.display(),
                    error = %err,
                    "configuration not reloaded; the running one stays in force"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (state, reload, hangups);
}

/// Reads the key sets of the verifiers in force again as each one's `jwks_refresh`
/// comes (docs/behaviour.md §17), looking every second; aborted at shutdown.
async fn refresh_keys<S: Store>(state: Arc<AppState<S>>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for verifier in state.live().verifiers() {
            verifier.refresh_if_due(std::time::Instant::now()).await;
        }
    }
}

/// SIGHUP, listened to from before the listeners are bound: its default action ends the
/// process, and a SIGHUP sent as soon as the port answers must reload, not kill.
#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        signal(SignalKind::hangup())
            .inspect_err(|err| tracing::warn!(error = %err, "SIGHUP cannot be listened to"))
            .ok()
    }
}

/// Start-up check: warn loudly when Redis may evict records (docs/behaviour.md §5).
/// Redis being down is not fatal: requests follow `on_unavailable` and `/readyz` reports
/// it.
async fn check_redis(store: Arc<RedisStore>, urls: Vec<String>) {
    match store.eviction_warning().await {
        Ok(None) => tracing::info!(?urls, "redis reachable; maxmemory-policy is noeviction"),
        Ok(Some(warning)) => tracing::warn!(?urls, "{warning}"),
        Err(err) => tracing::warn!(
            ?urls,
            error = %err,
            "could not read Redis maxmemory-policy (unreachable, or CONFIG is disabled); make sure it is noeviction"
        ),
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
