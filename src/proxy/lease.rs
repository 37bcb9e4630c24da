//! A claim's lease, from its acquisition to its end. [`LeaseGuard`] renews it while the
//! exchange works, then completes or releases it; what the store refuses meanwhile is
//! retried by [`in_background`], the one bounded retry-with-jitter loop: a failed
//! recording, a failed release, and the orphans of calls that timed out
//! (docs/behaviour.md §8).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::state::{AppState, MAX_BACKGROUND_RETRIES};
use crate::idempotency::{Completed, Times};
use crate::metrics::Outcome;
use crate::store::{Fenced, Lease, Store, StoreError};

/// The first pause of a background retry, and the most it grows to.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The owner's hold on a key while it forwards and records. Consumed by
/// [`LeaseGuard::complete`] or [`LeaseGuard::release`].
#[derive(Debug)]
pub(crate) struct LeaseGuard<S> {
    state: Arc<AppState<S>>,
    lease: Lease,
    lease_for: Duration,
    /// When the lease ends unless renewed: the last successful renewal plus `lease`.
    expires: Instant,
    /// When to renew next: `lease/3` after the last attempt.
    next_renewal: Instant,
    lost: bool,
}

impl<S: Store> LeaseGuard<S> {
    /// Takes charge of a lease acquired just now.
    pub(crate) fn new(state: &Arc<AppState<S>>, lease: Lease, lease_for: Duration) -> Self {
        let now = Instant::now();
        Self {
            state: Arc::clone(state),
            lease,
            lease_for,
            expires: now + lease_for,
            next_renewal: now + lease_for / 3,
            lost: false,
        }
    }

    /// Awaits `work`, renewing the lease every `lease/3` meanwhile. The renewal runs
    /// beside `work`, which is polled all along: a slow store never holds back the
    /// upstream or its deadline.
    pub(crate) async fn renewing<F: Future>(&mut self, work: F) -> F::Output {
        let mut work = pin!(work);
        loop {
            let renewed = tokio::select! {
                biased;
                out = &mut work => return out,
                renewed = self.renewal() => renewed,
            };
            self.renewed(renewed);
        }
    }

    /// The next renewal, when it is due; never, once the lease is known lost.
    async fn renewal(&self) -> (Instant, Result<Fenced, StoreError>) {
        if self.lost {
            return std::future::pending().await;
        }
        tokio::time::sleep_until(self.next_renewal).await;
        let asked = Instant::now();
        let result = self.state.store.renew(&self.lease, self.lease_for).await;
        (asked, result)
    }

    fn renewed(&mut self, (asked, result): (Instant, Result<Fenced, StoreError>)) {
        self.next_renewal = asked + self.lease_for / 3;
        match result {
            Ok(Fenced::Done) => self.expires = asked + self.lease_for,
            Ok(Fenced::LeaseLost) => self.lost = true,
            // Tried again at the next period; the lease holds until `expires` meanwhile.
            Err(err) => tracing::warn!(error = %err, "lease renewal failed"),
        }
    }

    /// Records the outcome before the answer is sent, ending the lease. A store failure
    /// does not hold the client back: the recording is retried in the background until
    /// the lease would end (docs/behaviour.md §5).
    pub(crate) async fn complete(self, record: Completed, ttl: Duration) -> Outcome {
        let now = self.state.store.clock_ms();
        let record = Arc::new(
            self.state
                .seal(&self.lease.key, stamped(record, &self.lease, now)),
        );
        match self
            .state
            .store
            .complete(&self.lease, Arc::clone(&record), ttl)
            .await
        {
            Ok(Fenced::Done) => Outcome::Forwarded,
            Ok(Fenced::LeaseLost) => {
                lease_lost();
                Outcome::LeaseLost
            }
            Err(err) => {
                tracing::warn!(error = %err, "recording failed; retrying in the background");
                let job = Job::Record {
                    lease: self.lease,
                    record,
                    ttl,
                };
                in_background(&self.state, job, self.expires);
                Outcome::Forwarded
            }
        }
    }

    /// Frees the key so that a retry executes, ending the lease.
    pub(crate) async fn release(self) {
        match self.state.store.release(&self.lease).await {
            Ok(Fenced::Done) => {}
            Ok(Fenced::LeaseLost) => tracing::warn!("claim already lost when releasing it"),
            Err(err) => {
                tracing::warn!(error = %err, "releasing a claim failed; retrying in the background");
                let give_up = Instant::now() + self.lease_for;
                in_background(&self.state, Job::Release(self.lease), give_up);
            }
        }
    }
}

fn lease_lost() {
    tracing::warn!("claim lost before the response was recorded; the response was not stored");
}

/// A store write that must still happen after the request has its answer.
#[derive(Debug)]
pub(crate) enum Job {
    /// Remove our marker if it is still ours: a claim or take-over that timed out may
    /// have been written, a release may have failed. Otherwise the marker would be taken
    /// for a crashed owner's when its lease ends (and become `outcome-unknown`).
    Release(Lease),
    /// Store the outcome the client already has.
    Record {
        lease: Lease,
        record: Arc<Completed>,
        ttl: Duration,
    },
}

/// `record` with the times the admin API reports (docs/behaviour.md §13): its claim's,
/// and `now_ms` on the store's clock (which its expiry is counted on). Stamped once,
/// before the first attempt, so that a repeated attempt writes the same bytes (and finds
/// them landed).
pub(crate) fn stamped(record: Completed, lease: &Lease, now_ms: u64) -> Completed {
    Completed {
        times: Some(Times {
            claimed_ms: lease.claimed_at_ms,
            completed_ms: now_ms.max(lease.claimed_at_ms),
        }),
        ..record
    }
}

enum Attempt {
    Done,
    Again,
}

impl Job {
    async fn attempt<S: Store>(&self, state: &AppState<S>) -> Attempt {
        match self {
            Job::Release(lease) => match state.store.release(lease).await {
                Ok(Fenced::Done) => {
                    state.metrics.orphan_released();
                    Attempt::Done
                }
                // Never written, or already gone.
                Ok(Fenced::LeaseLost) => Attempt::Done,
                Err(err) => {
                    tracing::debug!(error = %err, "background release failed");
                    Attempt::Again
                }
            },
            Job::Record { lease, record, ttl } => {
                state.metrics.record_retry();
                match state.store.complete(lease, Arc::clone(record), *ttl).await {
                    Ok(Fenced::Done) => {
                        state.metrics.late_record();
                        Attempt::Done
                    }
                    // The request was counted when it was answered; this is about the record.
                    Ok(Fenced::LeaseLost) => {
                        state.metrics.record_lost();
                        lease_lost();
                        Attempt::Done
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "recording retry failed");
                        Attempt::Again
                    }
                }
            }
        }
    }

    fn give_up<S>(&self, state: &AppState<S>) {
        match self {
            Job::Release(_) => {
                tracing::warn!("releasing a claim failed until its lease ended");
            }
            Job::Record { .. } => {
                tracing::error!(
                    "recording failed until the lease ended; the key will answer outcome-unknown"
                );
                state.metrics.record_lost();
            }
        }
    }
}

/// Retries `job` on a task of its own (shutdown waits for it), with exponential
/// back-off and jitter, until it is done or `give_up` would pass. At most
/// [`MAX_BACKGROUND_RETRIES`] run at once; past that the job is given up at once.
pub(crate) fn in_background<S: Store>(state: &Arc<AppState<S>>, job: Job, give_up: Instant) {
    let Ok(permit) = Arc::clone(&state.retries).try_acquire_owned() else {
        tracing::warn!(
            limit = MAX_BACKGROUND_RETRIES,
            "too many background retries already; giving this one up"
        );
        job.give_up(state);
        return;
    };
    let state = Arc::clone(state);
    state.tasks.clone().spawn(async move {
        let _permit = permit;
        let mut pause = FIRST_PAUSE;
        loop {
            let wait = jittered(pause);
            if Instant::now() + wait >= give_up {
                job.give_up(&state);
                return;
            }
            tokio::time::sleep(wait).await;
            if let Attempt::Done = job.attempt(&state).await {
                return;
            }
            pause = (pause * 2).min(MAX_PAUSE);
        }
    });
}

/// Between half of `pause` and all of it, so that the retries of many requests that
/// failed together do not reach the store together.
fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::idempotency::{OwnerToken, ScopedKey};
    use crate::store::MemoryStore;

    fn state() -> Arc<AppState<MemoryStore>> {
        let config = Config::from_yaml_str("", &|_| None).expect("empty config is valid");
        Arc::new(AppState::new(
            Arc::new(config),
            Arc::new(MemoryStore::new(16)),
        ))
    }

    fn lease() -> Lease {
        Lease {
            key: ScopedKey::from_bytes([7; 32]),
            token: OwnerToken::random(),
            claimed_at_ms: 0,
            written: crate::store::Written::default(),
        }
    }

    #[test]
    fn pauses_are_jittered_within_half_and_all_of_the_period() {
        for _ in 0..1000 {
            let wait = jittered(Duration::from_millis(200));
            assert!(wait >= Duration::from_millis(100) && wait <= Duration::from_millis(200));
        }
    }

    fn record_job() -> Job {
        Job::Record {
            lease: lease(),
            record: Arc::new(Completed::clear(
                crate::idempotency::Fingerprint::from_bytes([0; 32]),
                http::StatusCode::OK,
                vec![],
                crate::idempotency::StoredBody::Stored(bytes::Bytes::new()),
            )),
            ttl: Duration::from_secs(60),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_recording_whose_marker_is_gone_is_counted_lost_after_one_attempt() {
        let state = state();
        in_background(
            &state,
            record_job(),
            Instant::now() + Duration::from_secs(3),
        );
        state.tasks.close();
        state.tasks.wait().await;
        assert_eq!(state.metrics.records_lost(), 1);
        assert_eq!(state.metrics.record_retries(), 1);
    }

    /// Every call fails, as a store that is down does.
    struct Down;

    impl crate::store::Around for Down {
        async fn around<T: Send>(
            &self,
            _op: crate::metrics::StoreOp,
            _call: impl Future<Output = Result<T, StoreError>> + Send,
        ) -> Result<T, StoreError> {
            Err(StoreError::Protocol("down"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_that_keeps_failing_backs_off_and_gives_up_before_its_deadline() {
        let config = Config::from_yaml_str("", &|_| None).expect("empty config is valid");
        let store = crate::store::Layered::new(Arc::new(MemoryStore::new(16)), Down);
        let state = Arc::new(AppState::new(Arc::new(config), Arc::new(store)));
        let started = Instant::now();
        let give_up = started + Duration::from_secs(3);
        in_background(&state, record_job(), give_up);
        state.tasks.close();
        state.tasks.wait().await;
        assert_eq!(state.metrics.records_lost(), 1, "given up once");
        let attempts = state.metrics.record_retries();
        // 50 ms doubling to 1 s, each between half and all of it: 6 attempts in 3 s when
        // every pause is whole (2.55 s, then 1 s more would pass the deadline), 9 when
        // every pause is half (2.775 s).
        assert!((6..=9).contains(&attempts), "{attempts} attempts");
        assert!(Instant::now() < give_up);
        assert!(Instant::now() - started > Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_global_cap_a_job_is_given_up_without_a_task() {
        let state = state();
        let held = Arc::clone(&state.retries)
            .try_acquire_many_owned(MAX_BACKGROUND_RETRIES as u32)
            .expect("all permits free");
        in_background(
            &state,
            record_job(),
            Instant::now() + Duration::from_secs(3),
        );
        assert!(state.tasks.is_empty(), "no task was started");
        assert_eq!(
            state.metrics.records_lost(),
            1,
            "the record is counted lost"
        );
        drop(held);
    }
}
