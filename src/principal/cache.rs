//! Tokens already verified, so that the retries and the traffic of one client do not pay
//! a signature check (an RS256 verify is tens of microseconds) on every request.
//!
//! Keyed by the token itself, compared whole: a hit is a token byte for byte the same as
//! one that verified (a hash of it would cost a SHA-256 of the whole token, most of a
//! hit's cost, on every request). Tokens are kept in this process's memory only, never
//! in a log line, a metric or the store. An entry lives for the token's remaining
//! lifetime (`exp` plus the leeway) but at most [`MAX_AGE`], so a key removed from the
//! set stops verifying its tokens within that time. At most [`MAX_ENTRIES`] entries
//! (at most [`MAX_TOKEN`] bytes each, about 80 MiB in all): when full, the expired ones
//! go, and if that frees nothing, all of them (a burst of new tokens costs one verify
//! each, as without a cache).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Principal;

/// The longest a verified token is taken on trust.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60);

/// The most tokens remembered per verifier.
pub(super) const MAX_ENTRIES: usize = 10_000;

/// A longer token is verified every time: it is not remembered.
pub(super) const MAX_TOKEN: usize = 8 * 1024;

#[derive(Debug, Default)]
pub(super) struct TokenCache {
    entries: Mutex<HashMap<Box<str>, (Principal, Instant)>>,
}

impl TokenCache {
    pub(super) fn get(&self, token: &str, now: Instant) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (principal, until) = entries.get(token)?;
        (now < *until).then(|| principal.clone())
    }

    /// Remembers `token` as `principal` until `exp` (seconds since the epoch) plus
    /// `leeway`, or [`MAX_AGE`], whichever comes first.
    pub(super) fn put(
        &self,
        token: &str,
        principal: Principal,
        exp: Option<u64>,
        leeway: Duration,
        now: Instant,
    ) {
        let mut age = MAX_AGE;
        if let Some(exp) = exp {
            let epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let left = Duration::from_secs(exp)
                .saturating_add(leeway)
                .saturating_sub(epoch);
            age = age.min(left);
        }
        if age.is_zero() || token.len() > MAX_TOKEN {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, (_, until)| now < *until);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(token.into(), (principal, now + age));
    }

    /// Forgets every token, when the keys they were verified with change.
    pub(super) fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_until_the_token_expires_or_max_age() {
        let cache = TokenCache::default();
        let now = Instant::now();
        let p = Principal::of([b"alice".as_slice()]);
        cache.put("t", p.clone(), None, Duration::ZERO, now);
        assert_eq!(cache.get("t", now + MAX_AGE / 2), Some(p.clone()));
        assert_eq!(cache.get("t", now + MAX_AGE), None);
        assert_eq!(cache.get("other", now), None);
        let epoch = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
        cache.put(
            "soon",
            p.clone(),
            Some(epoch.as_secs() + 5),
            Duration::ZERO,
            now,
        );
        assert_eq!(
            cache.get("soon", now + Duration::from_secs(1)),
            Some(p.clone())
        );
        assert_eq!(cache.get("soon", now + Duration::from_secs(7)), None);
        cache.put("gone", p, Some(epoch.as_secs() - 100), Duration::ZERO, now);
        assert_eq!(cache.get("gone", now), None, "an expired token is not kept");
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = TokenCache::default();
        let now = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            cache.put(&i.to_string(), Principal::of([]), None, Duration::ZERO, now);
        }
        assert!(cache.len() <= MAX_ENTRIES);
    }
}
