//! The state machine for a claim that found an existing record (docs/behaviour.md §4).
//!
//! ```text
//! COMPLETED, same fingerprint            -> Replay (or NotReplayable if the body was too large)
//! COMPLETED streamed whole, same up-front -> Compare: read the body, then `compared`
//! COMPLETED or IN_FLIGHT, other fp        -> KeyReused
//! IN_FLIGHT, same fp, lease live          -> InFlight (reject) | Wait
//! IN_FLIGHT, same fp, lease ended         -> TakeOver: RecordUnknown (record) | Forward (release)
//! ```
//!
//! A streamed request (docs/behaviour.md §19) claims with its up-front fingerprint,
//! hashed under a label of its own: it never equals a buffered request's, so the rows
//! above compare the two kinds correctly without knowing them apart. Only a completed
//! streamed record whose body was hashed whole needs the request's body: `Compare`.

use std::sync::Arc;
use std::time::Duration;

use super::{Completed, Fingerprint, InFlight, Record};

/// `on_concurrent` (docs/behaviour.md §4): what a duplicate does while the request that
/// holds its key is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConcurrent {
    /// `409 in-flight` at once, with `Retry-After`.
    Reject,
    /// Block until the owner records or releases, then replay (or take the claim over);
    /// `409` after `wait_timeout`.
    Wait,
}

/// `on_unknown_outcome` (docs/behaviour.md §4): what becomes of a request whose outcome
/// is unknown (the upstream timed out or reset after it was sent, or the owner's lease
/// ended without an outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknownOutcome {
    /// Record the problem `outcome-unknown` as the outcome: retries replay it, and the
    /// request, which may have run, is not run again.
    Record,
    /// Release the claim: a retry executes again.
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send the stored response again, marked `Idempotent-Replayed: true`.
    Replay(Arc<Completed>),
    /// Answer with a problem; the store is left unchanged.
    Reject(Rejection),
    /// A completed streamed record with the same up-front fingerprint: read the
    /// request's body to its end, hashing it, then [`compared`] decides.
    Compare(Arc<Completed>),
    /// `on_concurrent: wait`: block until the owner completes or releases, or at most
    /// until its lease ends (a crashed owner never says it is done). `retry_after` is
    /// what a duplicate that waited in vain is told, as of this read.
    Wait {
        lease_left: Duration,
        retry_after: Duration,
    },
    /// The owner's lease ended without an outcome: replace its marker (compare-and-set on
    /// `stale`) and then do `then`.
    TakeOver {
        stale: InFlight,
        then: AfterTakeOver,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterTakeOver {
    /// `on_unknown_outcome: record`: store `outcome-unknown` as the key's outcome.
    RecordUnknown,
    /// `on_unknown_outcome: release`: this request executes.
    Forward,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    KeyReused,
    InFlight { retry_after: Duration },
    NotReplayable,
}

/// Decides what a request with `fingerprint` does about `existing`, at `now_ms` on the
/// store's clock. `streamed`: `fingerprint` is the up-front fingerprint of a request
/// whose body is not read yet.
pub fn decide(
    existing: &Record,
    fingerprint: &Fingerprint,
    streamed: bool,
    now_ms: u64,
    on_concurrent: OnConcurrent,
    on_unknown: OnUnknownOutcome,
) -> Decision {
    match existing {
        Record::Completed(c)
            if streamed
                && c.streamed
                    .is_some_and(|s| s.whole && s.upfront == *fingerprint) =>
        {
            Decision::Compare(Arc::clone(c))
        }
        Record::Completed(c) if c.fingerprint != *fingerprint => {
            Decision::Reject(Rejection::KeyReused)
        }
        Record::Completed(c) if c.replayable() => Decision::Replay(Arc::clone(c)),
        Record::Completed(_) => Decision::Reject(Rejection::NotReplayable),
        Record::InFlight(m) if m.fingerprint != *fingerprint => {
            Decision::Reject(Rejection::KeyReused)
        }
        Record::InFlight(m) if now_ms >= m.lease_deadline_ms => Decision::TakeOver {
            stale: m.clone(),
            then: match on_unknown {
                OnUnknownOutcome::Record => AfterTakeOver::RecordUnknown,
                OnUnknownOutcome::Release => AfterTakeOver::Forward,
            },
        },
        Record::InFlight(m) => {
            let retry_after = retry_after(m, now_ms);
            match on_concurrent {
                OnConcurrent::Reject => Decision::Reject(Rejection::InFlight { retry_after }),
                OnConcurrent::Wait => Decision::Wait {
                    lease_left: Duration::from_millis(m.lease_deadline_ms - now_ms),
                    retry_after,
                },
            }
        }
    }
}

/// What a streamed request does about the record of [`Decision::Compare`], now that
/// its body was hashed to the end into `full`: replay it (`Ok`), or refuse it.
pub fn compared(completed: &Completed, full: &Fingerprint) -> Result<(), Rejection> {
    if completed.fingerprint != *full {
        Err(Rejection::KeyReused)
    } else if completed.replayable() {
        Ok(())
    } else {
        Err(Rejection::NotReplayable)
    }
}

/// The `Retry-After` of `409 in-flight` while `holder` holds the key, at `now_ms` on the
/// store's clock (docs/behaviour.md §25, §18): the smaller of the time left on its lease
/// and the time it has already run, rounded up to whole seconds and at least one.
///
/// A request that has run 200 ms is likely to end soon: its duplicate comes back in a
/// second, not at the end of a lease sized for the slowest request. One that has run
/// long is waited on about as long again, so a slow holder is not polled every second.
/// Never past the lease's end: by then the holder has finished (the retry replays),
/// renewed (another 409 says how long again), or crashed (the retry takes the key
/// over). Rounding down would send a client back a moment early, for one more 409.
/// A format 1 marker has no claim time: its lease left alone counts.
pub fn retry_after(holder: &InFlight, now_ms: u64) -> Duration {
    let lease_left = holder.lease_deadline_ms.saturating_sub(now_ms);
    // A claim time ahead of `now_ms` (another replica's clock) counts as just begun.
    let wait_ms = holder.claimed_at_ms.map_or(lease_left, |claimed| {
        lease_left.min(now_ms.saturating_sub(claimed))
    });
    Duration::from_secs(wait_ms.div_ceil(1_000).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::OwnerToken;
    use crate::idempotency::StoredBody;
    use bytes::Bytes;
    use http::StatusCode;

    const FP: Fingerprint = Fingerprint::from_bytes([1; 32]);
    const OTHER: Fingerprint = Fingerprint::from_bytes([2; 32]);

    fn completed(body: StoredBody) -> Record {
        Record::Completed(Arc::new(Completed::clear(FP, StatusCode::OK, vec![], body)))
    }

    fn marker(deadline: u64) -> Record {
        Record::InFlight(InFlight {
            fingerprint: FP,
            token: OwnerToken::from_bytes([5; 16]),
            lease_deadline_ms: deadline,
            claimed_at_ms: None,
            streamed: false,
        })
    }

    fn d(
        rec: &Record,
        fp: &Fingerprint,
        now: u64,
        c: OnConcurrent,
        u: OnUnknownOutcome,
    ) -> Decision {
        decide(rec, fp, false, now, c, u)
    }

    use OnConcurrent::{Reject as R, Wait as W};
    use OnUnknownOutcome::{Record as Rec, Release as Rel};

    #[test]
    fn completed_same_fingerprint_replays() {
        let rec = completed(StoredBody::Stored(Bytes::from_static(b"x")));
        assert!(
            matches!(d(&rec, &FP, 0, R, Rec), Decision::Replay(c) if c.clear_response().map(|r| &r.body) == Some(&StoredBody::Stored(Bytes::from_static(b"x"))))
        );
    }

    #[test]
    fn completed_too_large_is_not_replayable() {
        assert_eq!(
            d(&completed(StoredBody::TooLarge), &FP, 0, W, Rel),
            Decision::Reject(Rejection::NotReplayable)
        );
    }

    #[test]
    fn other_fingerprint_is_key_reused_in_every_state() {
        for rec in [completed(StoredBody::TooLarge), marker(10), marker(0)] {
            for (c, u) in [(R, Rec), (W, Rel)] {
                assert_eq!(
                    d(&rec, &OTHER, 5, c, u),
                    Decision::Reject(Rejection::KeyReused)
                );
            }
        }
    }

    #[test]
    fn live_marker_rejects_or_waits() {
        assert_eq!(
            d(&marker(10_000), &FP, 1_000, R, Rec),
            Decision::Reject(Rejection::InFlight {
                retry_after: Duration::from_secs(9)
            })
        );
        assert_eq!(
            d(&marker(10_000), &FP, 9_999, R, Rel),
            Decision::Reject(Rejection::InFlight {
                retry_after: Duration::from_secs(1)
            })
        );
        assert_eq!(
            d(&marker(10_000), &FP, 1_000, W, Rec),
            Decision::Wait {
                lease_left: Duration::from_secs(9),
                retry_after: Duration::from_secs(9)
            }
        );
    }

    /// A marker claimed at `claimed` (unix ms) whose lease ends at `deadline`.
    fn held(claimed: Option<u64>, deadline: u64) -> InFlight {
        InFlight {
            fingerprint: FP,
            token: OwnerToken::from_bytes([5; 16]),
            lease_deadline_ms: deadline,
            claimed_at_ms: claimed,
            streamed: false,
        }
    }

    /// The smaller of the lease left and the holder's run, rounded up to whole seconds,
    /// never below one: a fast holder's duplicate comes back soon, a slow one's later,
    /// and none after a crashed holder's lease has ended.
    #[test]
    fn retry_after_grows_with_the_holders_run_up_to_the_lease_left() {
        let s = Duration::from_secs;
        const NOW: u64 = 1_700_000_000_000;
        for ((ran, left), after) in [
            // Ran 0.2 s of a 10 s lease: 1, not 10.
            ((200, 9_800), s(1)),
            ((3_500, 6_000), s(4)),
            // Ran 20 s (renewed twice): the 2.1 s left on the lease.
            ((20_000, 2_100), s(3)),
            ((0, 10_000), s(1)),
            ((1_000, 9_000), s(1)),
            ((1_001, 9_000), s(2)),
            ((5_000, 5_000), s(5)),
            ((9_000, 1), s(1)),
            ((86_400_000, 86_400_000), s(86_400)),
        ] {
            let holder = held(Some(NOW - ran), NOW + left);
            assert_eq!(
                retry_after(&holder, NOW),
                after,
                "ran {ran} ms, {left} ms left"
            );
        }
        // A claim time ahead of the reader's clock (another replica's) has just begun.
        assert_eq!(
            retry_after(&held(Some(NOW + 5_000), NOW + 10_000), NOW),
            s(1)
        );
    }

    /// A format 1 marker has no claim time: the lease left, rounded up, as before.
    #[test]
    fn retry_after_without_a_claim_time_is_the_lease_left_rounded_up() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (left, after) in [
            (0, s(1)),
            (1, s(1)),
            (999, s(1)),
            (1_000, s(1)),
            (1_001, s(2)),
            (4_999, s(5)),
            (5_000, s(5)),
            (86_400_000, s(86_400)),
        ] {
            assert_eq!(
                retry_after(&held(None, 20_000 + left), 20_000),
                after,
                "{:?}",
                ms(left)
            );
        }
    }

    /// `decide` answers a live marker with that `Retry-After`, and a waiting duplicate
    /// carries it too, for when its wait ends in vain.
    #[test]
    fn a_live_marker_is_refused_or_waited_on_with_its_retry_after() {
        let s = Duration::from_secs;
        let rec = Record::InFlight(held(Some(1_000), 11_000));
        let retry = |now| match d(&rec, &FP, now, R, Rec) {
            Decision::Reject(Rejection::InFlight { retry_after }) => retry_after,
            other => panic!("expected in-flight, got {other:?}"),
        };
        assert_eq!(retry(1_000), s(1), "just claimed");
        assert_eq!(retry(1_200), s(1));
        assert_eq!(retry(4_500), s(4));
        assert_eq!(retry(8_500), s(3), "2.5 s of the lease left");
        assert_eq!(
            d(&rec, &FP, 4_500, W, Rec),
            Decision::Wait {
                lease_left: Duration::from_millis(6_500),
                retry_after: s(4)
            }
        );
    }

    #[test]
    fn expired_marker_follows_on_unknown_outcome() {
        let Record::InFlight(stale) = marker(10_000) else {
            unreachable!("a marker")
        };
        assert_eq!(
            d(&marker(10_000), &FP, 10_000, R, Rec),
            Decision::TakeOver {
                stale: stale.clone(),
                then: AfterTakeOver::RecordUnknown
            }
        );
        assert_eq!(
            d(&marker(10_000), &FP, 20_000, W, Rel),
            Decision::TakeOver {
                stale,
                then: AfterTakeOver::Forward
            }
        );
    }

    /// A streamed request is compared with a streamed record by its up-front
    /// fingerprint first, then, when the record's body was hashed whole, by its own body
    /// (`Compare`, then `compared`); a record whose body was not hashed whole replays on
    /// the up-front fingerprint alone.
    #[test]
    fn streamed_requests_compare_their_body_only_with_a_whole_record() {
        use crate::idempotency::Streamed;
        const UP: Fingerprint = Fingerprint::from_bytes([3; 32]);
        const FULL: Fingerprint = Fingerprint::from_bytes([4; 32]);
        let record = |fingerprint, whole| {
            Arc::new(Completed {
                streamed: Some(Streamed { upfront: UP, whole }),
                ..Completed::clear(fingerprint, StatusCode::OK, vec![], StoredBody::TooLarge)
            })
        };
        let whole = record(FULL, true);
        let rec = Record::Completed(Arc::clone(&whole));
        assert_eq!(
            decide(&rec, &UP, true, 0, R, Rec),
            Decision::Compare(Arc::clone(&whole))
        );
        assert_eq!(
            decide(&rec, &OTHER, true, 0, R, Rec),
            Decision::Reject(Rejection::KeyReused),
            "another up-front fingerprint is refused before any body is read"
        );
        assert_eq!(
            decide(&rec, &UP, false, 0, R, Rec),
            Decision::Reject(Rejection::KeyReused),
            "a buffered request never meets a streamed record's fingerprint"
        );
        assert_eq!(compared(&whole, &OTHER), Err(Rejection::KeyReused));
        assert_eq!(compared(&whole, &FULL), Err(Rejection::NotReplayable));
        let kept = Arc::new(Completed {
            kept: Completed::clear(
                FULL,
                StatusCode::OK,
                vec![],
                StoredBody::Stored(Bytes::new()),
            )
            .kept,
            ..(*whole).clone()
        });
        assert_eq!(compared(&kept, &FULL), Ok(()));
        // Answered before the body was read whole: the up-front fingerprint is the record's.
        let early = record(UP, false);
        assert_eq!(
            decide(&Record::Completed(early), &UP, true, 0, R, Rec),
            Decision::Reject(Rejection::NotReplayable)
        );
        // In flight: the up-front fingerprint decides, whatever the body.
        let marker = Record::InFlight(InFlight {
            fingerprint: UP,
            token: OwnerToken::from_bytes([5; 16]),
            lease_deadline_ms: 10_000,
            claimed_at_ms: Some(0),
            streamed: true,
        });
        assert!(matches!(
            decide(&marker, &UP, true, 0, R, Rec),
            Decision::Reject(Rejection::InFlight { .. })
        ));
        assert_eq!(
            decide(&marker, &UP, true, 0, W, Rec),
            Decision::Wait {
                lease_left: Duration::from_secs(10),
                retry_after: Duration::from_secs(1)
            }
        );
    }

    /// The serde names are the configuration's words (docs/behaviour.md §6), both ways.
    #[test]
    fn the_policy_enums_are_named_as_the_configuration_spells_them() {
        let names = [
            ("\"reject\"", OnConcurrent::Reject),
            ("\"wait\"", OnConcurrent::Wait),
        ];
        for (name, value) in names {
            assert_eq!(serde_json::from_str::<OnConcurrent>(name).ok(), Some(value));
            assert_eq!(serde_json::to_string(&value).ok().as_deref(), Some(name));
        }
        let names = [
            ("\"record\"", OnUnknownOutcome::Record),
            ("\"release\"", OnUnknownOutcome::Release),
        ];
        for (name, value) in names {
            assert_eq!(
                serde_json::from_str::<OnUnknownOutcome>(name).ok(),
                Some(value)
            );
            assert_eq!(serde_json::to_string(&value).ok().as_deref(), Some(name));
        }
        assert!(serde_json::from_str::<OnConcurrent>("\"Wait\"").is_err());
    }
}
