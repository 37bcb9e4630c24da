//! A JWT source's key set kept fresh (docs/behaviour.md §17, §25).
//!
//! The set is read again every `jwks_refresh`, and at once when a token names a key the
//! set does not hold (a rotation), but then at most every [`ON_DEMAND_EVERY`], so that
//! tokens with made-up `kid`s cannot make idemgate hammer the identity provider.
//!
//! At most one read runs at a time per key source (a single flight): a request whose
//! `kid` is unknown joins the read in progress rather than queueing for one of its own,
//! and every read is bounded by `jwks_timeout`, so a hanging identity provider holds such
//! requests that long and no longer. The read runs on a task of its own: a waiting client
//! that goes away does not cancel it for the others. Tokens whose `kid` is known never
//! look here. A read that fails keeps the last good set, is logged at `warn` (naming the
//! file or URL, never a key) and counted.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio::time::Instant;

use super::JwkSet;
use super::cache::TokenCache;
use super::jwks::{JwksError, KeySet, parse_jwks};

/// The shortest time between two reads of a key set for unknown `kid`s.
pub(super) const ON_DEMAND_EVERY: Duration = Duration::from_secs(30);

/// A key set as read: the body of a file or URL.
pub type FetchFuture<'a> = Pin<
    Box<dyn Future<Output = Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>> + Send + 'a>,
>;

/// Reads a key set from where it is published; the proxy gives one for `jwks_url`
/// (its own HTTPS client), this module has the one for `jwks_file`.
pub trait Fetch: Send + Sync + std::fmt::Debug {
    fn fetch(&self) -> FetchFuture<'_>;
    /// The file or URL, for a log line.
    fn describe(&self) -> String;
}

#[derive(Debug)]
pub(super) struct FileFetch(pub(super) PathBuf);

impl Fetch for FileFetch {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(async move { Ok(std::fs::read(&self.0)?) })
    }

    fn describe(&self) -> String {
        self.0.display().to_string()
    }
}

/// Why a key set was not read.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("cannot read {0}: {1}")]
    Fetch(String, #[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot read {0}: no answer within jwks_timeout ({1:?})")]
    Timeout(String, Duration),
    #[error("{0}: {1}")]
    Parse(String, #[source] JwksError),
}

/// How a read ended, as the requests that waited on it learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The set was read; its keys are in force.
    Done,
    /// It failed or timed out; the last good set stays.
    Failed,
}

/// What a request whose `kid` the set lacks gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnDemand {
    /// A read ended with the set read: verify again with its keys.
    Read,
    /// No read runs, and the last one for an unknown `kid` is too recent to make another:
    /// the set is as it was (verify again: a read may have just ended).
    TooSoon,
    /// The read it waited on failed or timed out: the `kid` may exist. `retry_after`: when
    /// another read will be made for it, in whole seconds, at least 1.
    Failed { retry_after: Duration },
}

/// When the set was read, what it held, and the read in progress.
#[derive(Debug, Default)]
struct Reads {
    /// When the last read started, periodic or on demand; `None` before the first.
    last: Option<Instant>,
    /// When the last read for an unknown `kid` started.
    on_demand: Option<Instant>,
    /// What the last good read held, to tell whether the keys changed.
    set: Option<Arc<JwkSet>>,
    /// The read in progress: told how it ended.
    flight: Option<watch::Receiver<Option<Read>>>,
    /// Whether the last read that ended failed: the set may lack a `kid` that exists.
    failed: bool,
}

/// A `jwks_file` or `jwks_url`: its keys in force and the reads that keep them fresh.
#[derive(Debug)]
pub(super) struct KeySource {
    fetch: Arc<dyn Fetch>,
    /// `jwks_refresh`.
    every: Duration,
    /// `jwks_timeout`.
    timeout: Duration,
    keys: ArcSwap<KeySet>,
    /// Tokens verified with the keys in force: forgotten when they change.
    cache: Arc<TokenCache>,
    failures: Counter,
    reads: Mutex<Reads>,
}

impl KeySource {
    /// A source read by `fetch`; `set` is what it holds already (a `jwks_file`, read
    /// when the configuration loaded), else it is empty until [`load`](Self::load).
    pub(super) fn new(
        fetch: Arc<dyn Fetch>,
        (every, timeout): (Duration, Duration),
        set: Option<Arc<JwkSet>>,
        cache: Arc<TokenCache>,
        failures: Counter,
    ) -> Self {
        let keys = set.as_deref().map(KeySet::new).unwrap_or_default();
        let reads = Reads {
            last: set.is_some().then(Instant::now),
            set,
            ..Reads::default()
        };
        Self {
            fetch,
            every,
            timeout,
            keys: ArcSwap::from_pointee(keys),
            cache,
            failures,
            reads: Mutex::new(reads),
        }
    }

    /// The keys in force.
    pub(super) fn current(&self) -> Arc<KeySet> {
        self.keys.load_full()
    }

    /// Reads the set, failing if it cannot: at start, where a `jwks_url` that cannot be
    /// read is fatal, as a `jwks_file` is when the configuration loads.
    pub(super) async fn load(&self) -> Result<(), RefreshError> {
        self.lock().last = Some(Instant::now());
        self.read().await
    }

    /// Reads the set again if `jwks_refresh` has passed since the last read began,
    /// unless a read is in progress; a failure keeps the last good set.
    pub(super) async fn refresh_if_due(self: &Arc<Self>, now: Instant) {
        let flight = {
            let mut reads = self.lock();
            let due = reads
                .last
                .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
            if !due || reads.flight.is_some() {
                return;
            }
            self.start(&mut reads, now)
        };
        wait(flight).await;
    }

    /// For a token whose `kid` the set lacks: joins the read in progress, or starts one
    /// unless the last read for an unknown `kid` began less than [`ON_DEMAND_EVERY`] ago,
    /// and says how it ended.
    pub(super) async fn on_unknown_kid(self: &Arc<Self>) -> OnDemand {
        let flight = {
            let mut reads = self.lock();
            let now = Instant::now();
            match &reads.flight {
                Some(flight) => flight.clone(),
                None if reads
                    .on_demand
                    .is_some_and(|last| now.saturating_duration_since(last) < ON_DEMAND_EVERY) =>
                {
                    // After a failed read the `kid` may exist: the client is told when
                    // the next read may be made rather than that its token is invalid.
                    return if reads.failed {
                        OnDemand::Failed {
                            retry_after: until_next_on_demand(&reads, now),
                        }
                    } else {
                        OnDemand::TooSoon
                    };
                }
                None => {
                    reads.on_demand = Some(now);
                    self.start(&mut reads, now)
                }
            }
        };
        match wait(flight).await {
            Read::Done => OnDemand::Read,
            Read::Failed => OnDemand::Failed {
                retry_after: until_next_on_demand(&self.lock(), Instant::now()),
            },
        }
    }

    /// Starts a read on a task of its own, as the one flight of `reads`.
    fn start(self: &Arc<Self>, reads: &mut Reads, now: Instant) -> watch::Receiver<Option<Read>> {
        let (told, flight) = watch::channel(None);
        reads.last = Some(now);
        reads.flight = Some(flight.clone());
        let source = Arc::clone(self);
        tokio::spawn(async move {
            let read = match source.read().await {
                Ok(()) => Read::Done,
                Err(err) => {
                    source.failures.inc();
                    tracing::warn!(
                        error = %err,
                        "reading the JWKS failed; the last good key set stays in use"
                    );
                    Read::Failed
                }
            };
            let mut reads = source.lock();
            reads.flight = None;
            reads.failed = read == Read::Failed;
            drop(reads);
            let _ = told.send(Some(read));
        });
        flight
    }

    /// One read, bounded by `jwks_timeout`; the keys change when the set did.
    async fn read(&self) -> Result<(), RefreshError> {
        let bytes = tokio::time::timeout(self.timeout, self.fetch.fetch())
            .await
            .map_err(|_| RefreshError::Timeout(self.fetch.describe(), self.timeout))?
            .map_err(|err| RefreshError::Fetch(self.fetch.describe(), err))?;
        let set =
            parse_jwks(&bytes).map_err(|err| RefreshError::Parse(self.fetch.describe(), err))?;
        let mut reads = self.lock();
        if reads.set.as_deref() != Some(&set) {
            self.keys.store(Arc::new(KeySet::new(&set)));
            // A token verified with a key that is gone must not stay trusted.
            self.cache.clear();
            reads.set = Some(Arc::new(set));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reads> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long until a read for an unknown `kid` may be made again, rounded up to whole
/// seconds and at least 1: a client that retries sooner would find no read to wait on.
fn until_next_on_demand(reads: &Reads, now: Instant) -> Duration {
    let left = reads.on_demand.map_or(Duration::ZERO, |last| {
        ON_DEMAND_EVERY.saturating_sub(now.saturating_duration_since(last))
    });
    let whole = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    Duration::from_secs(whole.max(1))
}

/// How the read `flight` tells of ended; one whose task ended without telling (it
/// cannot, short of a panic) failed.
async fn wait(mut flight: watch::Receiver<Option<Read>>) -> Read {
    match flight.wait_for(Option::is_some).await {
        Ok(read) => (*read).unwrap_or(Read::Failed),
        Err(_) => Read::Failed,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An Ed25519 key (RFC 8037 A.2) under `kid` "a".
    const JWKS: &[u8] = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"a",
        "x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;

    const TIMEOUT: Duration = Duration::from_millis(300);

    /// What the identity provider does with a read.
    #[derive(Debug, Clone, Copy)]
    enum Answer {
        Jwks,
        Refuse,
        Hang,
    }

    /// A key set's publisher that counts its reads.
    #[derive(Debug)]
    struct Idp {
        reads: AtomicUsize,
        answer: Mutex<Answer>,
    }

    impl Fetch for Idp {
        fn fetch(&self) -> FetchFuture<'_> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let answer = *self.answer.lock().expect("lock");
            Box::pin(async move {
                match answer {
                    Answer::Jwks => Ok(JWKS.to_vec()),
                    Answer::Refuse => Err("answered 500".into()),
                    Answer::Hang => std::future::pending().await,
                }
            })
        }

        fn describe(&self) -> String {
            "idp".to_owned()
        }
    }

    impl Idp {
        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }

        fn answer(&self, answer: Answer) {
            *self.answer.lock().expect("lock") = answer;
        }
    }

    /// A source read every 5 minutes, never read yet, whose reads `answer`.
    fn source(answer: Answer) -> (Arc<KeySource>, Arc<Idp>, Counter) {
        let idp = Arc::new(Idp {
            reads: AtomicUsize::new(0),
            answer: Mutex::new(answer),
        });
        let failures = Counter::default();
        let fetch: Arc<dyn Fetch> = idp.clone();
        let timing = (Duration::from_secs(300), TIMEOUT);
        let cache = Arc::new(TokenCache::default());
        let source = KeySource::new(fetch, timing, None, cache, failures.clone());
        (Arc::new(source), idp, failures)
    }

    fn waiting(source: &Arc<KeySource>, n: usize) -> Vec<tokio::task::JoinHandle<OnDemand>> {
        (0..n)
            .map(|_| {
                let source = Arc::clone(source);
                tokio::spawn(async move { source.on_unknown_kid().await })
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_kids_share_one_read_bounded_by_jwks_timeout() {
        let (source, idp, failures) = source(Answer::Hang);
        let started = Instant::now();
        for waiter in waiting(&source, 5) {
            let failed = waiter.await.expect("task");
            // The next read for an unknown kid, 30 s after this one began: 29.7 s, up.
            assert_eq!(
                failed,
                OnDemand::Failed {
                    retry_after: Duration::from_secs(30)
                }
            );
        }
        assert_eq!(
            started.elapsed(),
            TIMEOUT,
            "answered when the read timed out"
        );
        assert_eq!((idp.reads(), failures.get()), (1, 1));
        // Too soon for another read: nothing is read, and since the last read failed the
        // kid may exist: told when the next read may be made, not that it is unknown.
        idp.answer(Answer::Jwks);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            source.on_unknown_kid().await,
            OnDemand::Failed {
                retry_after: Duration::from_secs(20)
            }
        );
        assert_eq!(idp.reads(), 1);
        assert!(source.current().find("a").is_none());
        // Past ON_DEMAND_EVERY, a read is made and its keys are in force.
        tokio::time::advance(ON_DEMAND_EVERY).await;
        assert_eq!(source.on_unknown_kid().await, OnDemand::Read);
        assert_eq!(idp.reads(), 2);
        assert!(source.current().find("a").is_some());
        // After a good read, an unknown kid too soon after it is simply unknown.
        assert_eq!(source.on_unknown_kid().await, OnDemand::TooSoon);
        assert_eq!(idp.reads(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_in_progress_is_joined_whoever_started_it() {
        let (source, idp, failures) = source(Answer::Hang);
        // The periodic read is due (never read yet) and hangs; unknown kids join it, and
        // the next periodic tick does not start another.
        let periodic = {
            let source = Arc::clone(&source);
            tokio::spawn(async move { source.refresh_if_due(Instant::now()).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(idp.reads(), 1);
        let waiters = waiting(&source, 3);
        source
            .refresh_if_due(Instant::now() + Duration::from_secs(600))
            .await;
        for waiter in waiters {
            assert!(matches!(
                waiter.await.expect("task"),
                OnDemand::Failed { .. }
            ));
        }
        periodic.await.expect("task");
        assert_eq!((idp.reads(), failures.get()), (1, 1));
        // A read that fails at once is answered at once, and counted.
        let (source, idp, failures) = self::source(Answer::Refuse);
        let started = Instant::now();
        assert!(matches!(
            source.on_unknown_kid().await,
            OnDemand::Failed { .. }
        ));
        assert!(started.elapsed() < TIMEOUT);
        assert_eq!((idp.reads(), failures.get()), (1, 1));
    }
}
