//! The `idemgate` command: arguments, logging, and running the proxy until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::config::{Config, LogFormat, StoreKind};
use crate::proxy::{AppState, Shutdown, serve};
use crate::store::MemoryStore;

/// An idempotency proxy: makes retried POST/PUT/PATCH/DELETE requests execute at most once.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about)]
pub struct Args {
    /// The YAML configuration file.
    #[arg(long, env = "IDEMGATE_CONFIG", value_name = "PATH")]
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
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("no configuration: give --config PATH (or IDEMGATE_CONFIG), or --upstream URL")]
    NoConfig,
    #[error("store.kind: redis is not supported by this build yet")]
    RedisUnsupported,
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let config = match load(&args) {
        Ok(config) => config,
        Err(err) => return fail(&err),
    };
    if args.check {
        #[allow(
            clippy::print_stdout,
            reason = "--check prints the configuration by contract"
        )]
        {
            print!("{}", config.to_yaml());
        }
        return ExitCode::SUCCESS;
    }
    init_logs(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => return fail(&CliError::Runtime(err)),
    };
    match runtime.block_on(run(config)) {
        Ok(Shutdown::Drained) => ExitCode::SUCCESS,
        Ok(Shutdown::TimedOut) => ExitCode::FAILURE,
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

fn init_logs(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn run(config: Config) -> Result<Shutdown, CliError> {
    let config = Arc::new(config);
    let listener = crate::proxy::bind(config.listen)
        .await
        .map_err(|source| CliError::Bind {
            addr: config.listen,
            source,
        })?;
    let store = match config.store.kind {
        StoreKind::Memory => MemoryStore::new(config.store.max_entries),
        StoreKind::Redis => return Err(CliError::RedisUnsupported),
    };
    tracing::info!(listen = %config.listen, upstream = %config.upstream.url, "idemgate serving");
    let state = Arc::new(AppState::new(Arc::clone(&config), store));
    Ok(serve(listener, state, shutdown_signal()).await)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
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
