//! `idempotency` and every route's policy (docs/behaviour.md §6, §9, §10, §17-§19):
//! each key declared once, in `policy_keys!` below, which generates the policy, its two
//! written forms, their merging and the printing; the checks across its keys; and what
//! a policy does with a request (its key, scope and fingerprint).

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use serde::Deserialize;

use serde::ser::{Serialize, SerializeMap, Serializer};

mod key_format;
mod key_from;
pub(crate) mod reconcile;
pub(crate) mod replay_authorization;
mod scope_principal;

use self::key_format::KeyFormatForm;
use self::key_from::KeyFrom;
use self::reconcile::{Reconcile, ReconcileForm};
use self::replay_authorization::{ReplayAuthorization, ReplayAuthorizationForm};
use self::scope_principal::ScopePrincipalForm;
use crate::config::error::ConfigError;
use crate::config::types::http::{
    CookieName, Header, HeaderPairs, Headers, Methods, Pointer, Status,
};
use crate::config::types::units::{Dur, Flag, Lease, Size};
use crate::config::types::{Choice, Form, Pick, Shown, Text, given};
use crate::config::{OnConcurrent, OnUnknownOutcome};
use crate::idempotency::fingerprint::{BodyForm, FingerprintRules};
use crate::idempotency::format::KeyFormat;
use crate::idempotency::key::ByPrincipal;
use crate::idempotency::pointer::JsonPointer;
use crate::idempotency::source::{self, Found, KeySource, Offered};
use crate::idempotency::{IdempotencyKey, KeyError, Scope, ScopeId, ScopedKey};
use crate::principal::{BasicPrincipal, Principal, ScopePrincipal};

/// Generates [`Policy`], its `Default`, [`WrittenPolicy`], [`WrittenRoute`], their merging and
/// the printing of the keys from one declaration per key:
///
/// ```text
/// /// doc comment
/// key: Type = default, from Form;
/// ```
///
/// `Form` reads the key (in `idempotency` and in every route, where it overrides the
/// top-level value) and prints it for `--check`. Keys under `route_only` belong to
/// routes alone (`idempotency` refuses them). The order of the keys is that of the
/// configuration file's description (docs/behaviour.md §6), of the error messages that
/// list the keys, and of `--check`.
///
/// (`#[serde(flatten)]` could share the fields of the two written forms, but it disables
/// `deny_unknown_fields` and loses error paths.)
macro_rules! policy_keys {
    (
        route_only {$(
            $(#[$route_doc:meta])*
            $route_key:ident: $route_ty:ty = $route_default:expr, from $route_raw:ty;
        )*}
        inherited {$(
            $(#[$doc:meta])*
            $key:ident: $ty:ty = $default:expr, from $raw:ty;
        )*}
    ) => {
        /// An `idempotency` policy: the top-level section, or a route's merged copy of it.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Policy {
            $($(#[$route_doc])* pub $route_key: $route_ty,)*
            $($(#[$doc])* pub $key: $ty,)*
        }

        impl Default for Policy {
            /// The defaults of the `idempotency` section (docs/behaviour.md §6).
            fn default() -> Self {
                Policy {
                    $($route_key: $route_default,)*
                    $($key: $default,)*
                }
            }
        }

        /// The top-level `idempotency` section as written.
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a mapping of idempotency keys")]
        pub(crate) struct WrittenPolicy {
            #[serde(default, deserialize_with = "given")]
            header: Option<Header>,
            $(#[serde(default, deserialize_with = "given")] $key: Option<$raw>,)*
        }

        /// A `routes[]` entry as written: its path prefix and its policy keys.
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a mapping of idempotency keys")]
        pub(crate) struct WrittenRoute {
            #[serde(default, deserialize_with = "given")]
            path: Option<Text>,
            $(#[serde(default, deserialize_with = "given")] $route_key: Option<$route_raw>,)*
            #[serde(default, deserialize_with = "given")]
            header: Option<Header>,
            $(#[serde(default, deserialize_with = "given")] $key: Option<$raw>,)*
        }

        impl WrittenPolicy {
            /// The defaults, with the keys written here replaced.
            pub(crate) fn policy(self) -> Policy {
                let mut policy = Policy::default();
                if let Some(header) = self.header {
                    policy.key_from = vec![KeySource::Header(header.value())];
                }
                $(if let Some(value) = self.$key {
                    policy.$key = value.value();
                })*
                policy.settled()
            }
        }

        impl WrittenRoute {
            /// The route's path prefix (`None` if missing) and its effective policy:
            /// `base` with the keys written here replaced.
            pub(crate) fn merge(self, base: &Policy) -> (Option<String>, Policy) {
                let mut policy = base.clone();
                $(if let Some(value) = self.$route_key {
                    policy.$route_key = value.value();
                })*
                if let Some(header) = self.header {
                    policy.key_from = vec![KeySource::Header(header.value())];
                }
                $(if let Some(value) = self.$key {
                    policy.$key = value.value();
                })*
                (self.path.map(|path| path.0), policy.settled())
            }
        }

        impl Policy {
            /// The keys `--check` prints: every key of `idempotency` (`base` none), or
            /// those in which a route differs from `base`, since it inherits the rest.
            /// Sources that are one header are printed in the short form, `header: X`,
            /// as the default is written (docs/behaviour.md §6); an unset key is left
            /// out (`null` is refused, as for any key, and a route cannot unset what it
            /// inherits, so this loses nothing).
            pub(crate) fn print<M: SerializeMap>(
                &self,
                base: Option<&Policy>,
                map: &mut M,
            ) -> Result<(), M::Error> {
                if let Some(base) = base {
                    $(if self.$route_key != base.$route_key {
                        map.serialize_entry(
                            stringify!($route_key),
                            &Shown::<$route_raw>(&self.$route_key),
                        )?;
                    })*
                }
                let header = match self.key_from.as_slice() {
                    [KeySource::Header(name)] => Some(name),
                    _ => None,
                };
                $(if base.is_none_or(|base| self.$key != base.$key)
                    && !<$raw as Form>::unset(&self.$key)
                {
                    match header {
                        Some(name) if stringify!($key) == "key_from" => {
                            map.serialize_entry("header", &Shown::<Header>(name))?;
                        }
                        _ => map.serialize_entry(stringify!($key), &Shown::<$raw>(&self.$key))?,
                    }
                })*
                Ok(())
            }
        }
    };
}

policy_keys! {
    route_only {
        /// `false` passes every request of the route through unguarded, as if it
        /// listed no method.
        enabled: bool = true, from Flag;
    }
    inherited {
        /// Where the key comes from, in order (docs/behaviour.md §9); `header: X` is
        /// written for `key_from: [{header: X}]`.
        key_from: Vec<KeySource> = vec![KeySource::Header(HeaderName::from_static(
            "idempotency-key",
        ))],
            from KeyFrom;
        /// The guarded methods: non-empty, upper-case; other methods pass through.
        methods: Vec<Method> = vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
            from Methods;
        /// Whether a guarded request without a key is refused (`400 missing-key`)
        /// rather than passed through.
        required: bool = false, from Flag;
        /// What every key a source finds must look like (docs/behaviour.md §18), so that
        /// a client's malformed key is refused rather than guarded: `any`, a UUID form,
        /// or a regex, compiled once when the configuration loads.
        key_format: KeyFormat = KeyFormat::Any, from KeyFormatForm;
        /// How long a completed record is replayed.
        ttl: Duration = Duration::from_secs(24 * 60 * 60), from Dur;
        /// How long an in-flight marker outlives its last renewal: the longest a
        /// crashed proxy blocks retries of its key.
        lease: Duration = Duration::from_secs(10), from Lease;
        /// What a duplicate of a request still in flight gets.
        on_concurrent: OnConcurrent = OnConcurrent::Reject,
            from Pick<OnConcurrent>;
        /// How long `on_concurrent: wait` waits before answering `409`.
        wait_timeout: Duration = Duration::from_secs(10), from Dur;
        /// What becomes of a claim whose request may or may not have reached the
        /// upstream (timeout or reset after sending, or an expired lease).
        on_unknown_outcome: OnUnknownOutcome = OnUnknownOutcome::Record,
            from Pick<OnUnknownOutcome>;
        /// How to ask the upstream whether a request whose outcome is unknown executed,
        /// before `outcome-unknown` is recorded (docs/behaviour.md §18): an upstream that
        /// can look a charge up by its key settles most timeouts itself. Unset: never
        /// asked.
        reconcile: Option<Reconcile> = None, from ReconcileForm;
        /// Upstream statuses that mean "refused before doing work": the claim is
        /// released instead of recorded, so a retry executes. `401` and `403` among
        /// them: recording refusals would let made-up credentials fill the store
        /// (docs/behaviour.md §25).
        release_statuses: Vec<StatusCode> = vec![
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
        ],
            from Vec<Status>;
        /// Request headers whose values scope the key, so that two clients never see
        /// each other's responses.
        scope_headers: Vec<HeaderName> = vec![header::AUTHORIZATION],
            from Headers;
        /// Cookies whose values scope the key too, for APIs that authenticate by cookie.
        scope_cookies: Vec<String> = Vec::new(), from Vec<CookieName>;
        /// Who the caller is, verified (docs/behaviour.md §17): when set, it scopes the
        /// key in place of `authorization` and of the header it reads, so that a
        /// refreshed token keeps the scope.
        scope_principal: Option<ScopePrincipal> = None,
            from ScopePrincipalForm;
        /// Whether a guarded request without a credential is refused
        /// (`401 missing-credentials`) rather than scoped as anonymous.
        require_principal: bool = false, from Flag;
        /// The request that asks, before every replay, whether the retry's credentials
        /// still pass (docs/behaviour.md §24): a replay never reaches the upstream that
        /// checks them. Unset: replays are not checked.
        replay_authorization: Option<ReplayAuthorization> = None,
            from ReplayAuthorizationForm;
        /// Request headers that enter the fingerprint besides method, path and body.
        fingerprint_headers: Vec<HeaderName> = vec![header::CONTENT_TYPE],
            from Headers;
        /// Whether the query string enters the fingerprint; `false` hashes method and
        /// path alone (the upstream still gets the query as sent).
        fingerprint_query: bool = true, from Flag;
        /// How the body enters the fingerprint: its bytes, or its canonical JSON form
        /// (RFC 8785) when it parses as JSON.
        fingerprint_body: BodyForm = BodyForm::Raw, from Pick<BodyForm>;
        /// JSON Pointers to members or elements of a JSON body left out of the
        /// fingerprint (`fingerprint_body: json` only).
        fingerprint_ignore: Vec<JsonPointer> = Vec::new(), from Vec<Pointer>;
        /// Upstream response headers that are not stored, hence never replayed.
        replay_drop_headers: Vec<HeaderName> = vec![header::SET_COOKIE, header::DATE],
            from Headers;
        /// Upstream response headers the first client gets but that are never stored,
        /// hence never replayed (docs/behaviour.md §17), on top of `replay_drop_headers`
        /// (which a list replaces): e.g. `[set-cookie]` kept out of the store whatever
        /// `replay_drop_headers` says.
        record_exclude_headers: Vec<HeaderName> = Vec::new(), from Headers;
        /// Headers added to a replay of a recorded status of 500 or more, which cannot
        /// change: SDKs that read them stop retrying it.
        replay_error_headers: Vec<(HeaderName, HeaderValue)> = vec![(
            HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static("false"),
        )],
            from HeaderPairs;
        /// Larger guarded request bodies are refused (`413`) before anything is stored,
        /// unless `stream_request_body` streams them.
        max_request_body: u64 = 1 << 20, from Size;
        /// Whether a guarded body larger than `max_request_body` is streamed to the
        /// upstream while it is hashed, instead of refused (docs/behaviour.md §19).
        stream_request_body: bool = false, from Flag;
        /// Larger streamed request bodies are refused (`413`).
        max_streamed_body: u64 = 1 << 30, from Size;
        /// Larger response bodies are not stored; a retry gets `409 not-replayable`.
        max_response_body: u64 = 4 << 20, from Size;
    }
}

/// A policy as `--check` prints it: `idempotency`, or a route (its `path`, and the
/// keys in which it differs from `base`).
pub(crate) struct Printed<'a> {
    pub(crate) path: Option<&'a str>,
    pub(crate) policy: &'a Policy,
    pub(crate) base: Option<&'a Policy>,
}

impl Serialize for Printed<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        if let Some(path) = self.path {
            map.serialize_entry("path", &Shown::<Text>(&path.to_owned()))?;
        }
        self.policy.print(self.base, &mut map)?;
        map.end()
    }
}

/// The two spellings of a section's key sources (docs/behaviour.md §9): `header: X` is
/// shorthand for `key_from: [{header: X}]`, and a section writes one of them.
fn one_spelling<H, K>(
    header: &Option<H>,
    key_from: &Option<K>,
    section: &str,
) -> Result<(), ConfigError> {
    if header.is_some() && key_from.is_some() {
        return Err(ConfigError::invalid(
            format!("{section}.key_from"),
            format!(
                "set together with {section}.header; header: X is shorthand for \
                 key_from: [{{header: X}}], so write one of them"
            ),
        ));
    }
    Ok(())
}

impl WrittenPolicy {
    pub(crate) fn check_spelling(&self, section: &str) -> Result<(), ConfigError> {
        one_spelling(&self.header, &self.key_from, section)
    }
}

impl WrittenRoute {
    pub(crate) fn check_spelling(&self, section: &str) -> Result<(), ConfigError> {
        one_spelling(&self.header, &self.key_from, section)
    }
}

impl Policy {
    /// What a key decides of another once both are merged: a Basic principal is the
    /// user name alone where `replay_authorization` checks the password before any
    /// replay, and the user name and a hash of the password otherwise
    /// (docs/behaviour.md §25).
    fn settled(mut self) -> Self {
        let checked = self.replay_authorization.is_some();
        if let Some(ScopePrincipal::Basic(made_of)) = &mut self.scope_principal {
            *made_of = if checked {
                BasicPrincipal::UserAlone
            } else {
                BasicPrincipal::UserAndPassword
            };
        }
        self
    }

    /// The key of a request under this policy: the first of its sources that is
    /// present (docs/behaviour.md §9), which must have the policy's `key_format`
    /// (docs/behaviour.md §18). A `fingerprint` key is the request's own, never the
    /// client's, so it has no format to check.
    pub fn find_key<'s>(&'s self, request: Offered<'_>) -> Result<Found<'s>, KeyError> {
        let found = source::find(&self.key_from, request)?;
        if let Found::Key(_, key) = &found {
            self.key_format.check(key)?;
        }
        Ok(found)
    }

    /// How long a key's record is kept: `ttl`, or the window of a `fingerprint` key.
    pub fn record_ttl(&self, source: &KeySource) -> Duration {
        match source {
            KeySource::Fingerprint(window) => *window,
            _ => self.ttl,
        }
    }

    /// The record address of `key`, given by `source`, in a request with `headers`
    /// and, under `scope_principal`, the verified `principal` (`None`: anonymous)
    /// (docs/behaviour.md §3, §9, §17): the one function the proxy and `idemgate key`
    /// address records with.
    pub fn address(
        &self,
        headers: &HeaderMap,
        principal: Option<&Principal>,
        source: &KeySource,
        key: &IdempotencyKey,
    ) -> ScopedKey {
        ScopedKey::scoped_in_parts(headers, self.scope(principal), source.label_parts(), key)
    }

    /// The scope a request with `headers` (and `principal`) is in, for
    /// `store.max_entries_per_scope` (docs/behaviour.md §17): the same scope values as
    /// [`Policy::address`] hashes.
    pub fn scope_id(&self, headers: &HeaderMap, principal: Option<&Principal>) -> ScopeId {
        self.scope(principal).id(headers)
    }

    /// Whether a request with `headers` (and `principal`) carries a scope value that
    /// tells its client apart ([`Scope::identifies`]); without one, a `fingerprint` key
    /// is not used.
    pub fn identifies(&self, headers: &HeaderMap, principal: Option<&Principal>) -> bool {
        self.scope(principal).identifies(headers)
    }

    fn scope<'a>(&'a self, principal: Option<&'a Principal>) -> Scope<'a> {
        Scope {
            headers: &self.scope_headers,
            cookies: &self.scope_cookies,
            // Without a principal, scoped as if unset unless the credential's header is
            // `Authorization` (docs/behaviour.md §25).
            principal: self
                .scope_principal
                .as_ref()
                .filter(|source| principal.is_some() || source.scopes_the_anonymous())
                .map(|source| ByPrincipal {
                    replaces: source.header(),
                    principal: principal.map(Principal::as_bytes),
                }),
        }
    }

    /// Whether every request gets the same record address under `self` as under
    /// `other`: the inputs of [`Policy::address`] (the key sources, by label, the
    /// scope headers and cookies, in order, as they are hashed, and the principal's
    /// source) are the same. A
    /// `fingerprint` window changes how long a record is kept, not where.
    pub fn same_addresses(&self, other: &Policy) -> bool {
        let principals = match (&self.scope_principal, &other.scope_principal) {
            (Some(a), Some(b)) => a.same_principals(b),
            (a, b) => a.is_none() && b.is_none(),
        };
        principals
            && self.scope_headers == other.scope_headers
            && self.scope_cookies == other.scope_cookies
            && self
                .key_from
                .iter()
                .map(KeySource::label_parts)
                .eq(other.key_from.iter().map(KeySource::label_parts))
    }

    /// Whether a guarded request whose key was `found` in its head may stream a body
    /// larger than `max_request_body` (docs/behaviour.md §19): not when the key or the
    /// fingerprint needs the body's JSON, which only a buffered body shows.
    pub fn streams(&self, found: &Found<'_>) -> bool {
        self.stream_request_body
            && self.fingerprint_body == BodyForm::Raw
            && matches!(found, Found::Key(..))
    }

    /// Why a body over `max_request_body` is refused under this policy despite
    /// `stream_request_body` (docs/behaviour.md §19), for `--check` to say; `None` when
    /// it is off, or every request with a body over the limit can stream.
    pub fn stream_limits(&self) -> Option<String> {
        if !self.stream_request_body {
            return None;
        }
        let mut needs_body: Vec<String> = self
            .key_from
            .iter()
            .filter(|source| source.needs_body())
            .map(KeySource::describe)
            .collect();
        if self.fingerprint_body == BodyForm::Json {
            needs_body.push("fingerprint_body: json".to_owned());
        }
        (!needs_body.is_empty()).then(|| needs_body.join(", "))
    }

    /// What the fingerprint of a request under this policy covers.
    pub fn fingerprint_rules(&self) -> FingerprintRules<'_> {
        FingerprintRules {
            headers: &self.fingerprint_headers,
            query: self.fingerprint_query,
            body: self.fingerprint_body,
            ignore: &self.fingerprint_ignore,
        }
    }
}

/// The checks of key sources and fingerprints that involve two keys
/// (docs/behaviour.md §9, §10), on the merged policy, so that a route is refused for a
/// combination it inherits half of too.
impl Policy {
    pub(crate) fn check(&self, section: &str) -> Result<(), ConfigError> {
        check_window(self, section)?;
        check_fingerprint(self, section)?;
        check_streaming(self, section)
    }
}

/// A streamed body is one over `max_request_body` and at most `max_streamed_body`
/// (docs/behaviour.md §19): a smaller `max_streamed_body` would leave no body to stream.
fn check_streaming(policy: &Policy, section: &str) -> Result<(), ConfigError> {
    if policy.stream_request_body && policy.max_streamed_body < policy.max_request_body {
        return Err(ConfigError::invalid(
            format!("{section}.max_streamed_body"),
            format!(
                "{} is smaller than max_request_body ({}); a streamed body is one larger \
                 than max_request_body",
                policy.max_streamed_body, policy.max_request_body
            ),
        ));
    }
    Ok(())
}

/// A `fingerprint` source keeps its records for its window instead of `ttl`, and no
/// longer (docs/behaviour.md §9).
fn check_window(policy: &Policy, section: &str) -> Result<(), ConfigError> {
    for (index, source) in policy.key_from.iter().enumerate() {
        if let KeySource::Fingerprint(window) = source
            && *window > policy.ttl
        {
            return Err(ConfigError::invalid(
                format!("{section}.key_from[{index}].fingerprint"),
                format!(
                    "window {} is longer than ttl {}; the window must be no longer than ttl",
                    crate::config::types::units::format_duration(*window),
                    crate::config::types::units::format_duration(policy.ttl)
                ),
            ));
        }
    }
    Ok(())
}

/// `fingerprint_ignore` points into JSON, which `fingerprint_body: raw` never reads
/// (docs/behaviour.md §10).
fn check_fingerprint(policy: &Policy, section: &str) -> Result<(), ConfigError> {
    if policy.fingerprint_body == BodyForm::Raw && !policy.fingerprint_ignore.is_empty() {
        return Err(ConfigError::invalid(
            format!("{section}.fingerprint_ignore"),
            "needs fingerprint_body: json; with raw the body is hashed byte for byte and \
             no pointer can leave a part of it out",
        ));
    }
    Ok(())
}

impl Choice for OnConcurrent {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("reject", OnConcurrent::Reject),
        ("wait", OnConcurrent::Wait),
    ];
}

impl Choice for OnUnknownOutcome {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("record", OnUnknownOutcome::Record),
        ("release", OnUnknownOutcome::Release),
    ];
}

impl Choice for BodyForm {
    const CHOICES: &'static [(&'static str, Self)] =
        &[("raw", BodyForm::Raw), ("json", BodyForm::Json)];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route that writes no key is exactly `idempotency` and prints only its path;
    /// `idempotency` prints every inherited key and no route-only one.
    #[test]
    fn a_route_without_keys_inherits_everything() {
        let base = Policy {
            ttl: Duration::from_secs(60),
            ..Policy::default()
        };
        let (path, policy) = WrittenRoute::default().merge(&base);
        assert_eq!(path, None);
        assert_eq!(policy, base);
        let printed = |policy, base| {
            let printed = Printed {
                path: None,
                policy,
                base,
            };
            serde_saphyr::to_string(&printed).expect("prints")
        };
        assert_eq!(printed(&policy, Some(&base)), "{}\n");
        let top = printed(&base, None);
        assert!(
            top.contains("\nttl: 1m\n") && !top.contains("enabled"),
            "{top}"
        );
    }

    /// Under `scope_principal` the principal replaces `Authorization` and the header it
    /// was read from, listed or not; other scope headers still apply; without it, the
    /// address is what it always was.
    #[test]
    fn a_principal_replaces_the_credential_headers_in_the_address() {
        use crate::principal::Principal;
        let tenant = HeaderName::from_static("x-tenant");
        let user = HeaderName::from_static("x-user");
        let plain = Policy {
            scope_headers: vec![header::AUTHORIZATION, user.clone(), tenant.clone()],
            ..Policy::default()
        };
        let policy = Policy {
            scope_principal: Some(ScopePrincipal::TrustedHeader(user.clone())),
            ..plain.clone()
        };
        let source = &policy.key_from[0];
        let key = crate::idempotency::key::parse_value(b"k").expect("key");
        let headers = |auth: &'static str, tenant_id: &'static str| {
            let mut map = HeaderMap::new();
            map.insert(header::AUTHORIZATION, HeaderValue::from_static(auth));
            map.insert(user.clone(), HeaderValue::from_static("alice"));
            map.insert(tenant.clone(), HeaderValue::from_static(tenant_id));
            map
        };
        let alice = Principal::of([b"alice".as_slice()]);
        let bob = Principal::of([b"bob".as_slice()]);
        let at = |h: &HeaderMap, p: Option<&Principal>| policy.address(h, p, source, &key);
        let (a, b) = (headers("Bearer t1", "t"), headers("Bearer t2", "t"));
        assert_eq!(
            at(&a, Some(&alice)),
            at(&b, Some(&alice)),
            "a refresh keeps it"
        );
        assert_ne!(at(&a, Some(&alice)), at(&a, Some(&bob)));
        assert_ne!(
            at(&a, Some(&alice)),
            at(&a, None),
            "anonymous is a scope of its own"
        );
        assert_ne!(
            at(&a, Some(&alice)),
            at(&headers("Bearer t1", "u"), Some(&alice))
        );
        // Without scope_principal, the raw headers scope as before.
        assert_ne!(
            plain.address(&a, None, source, &key),
            plain.address(&b, None, source, &key)
        );
        assert_eq!(
            plain.address(&a, None, source, &key),
            ScopedKey::new(&a, &plain.scope_headers, &key)
        );
        assert!(!plain.same_addresses(&policy));
        assert!(policy.identifies(&HeaderMap::new(), Some(&alice)));
        assert!(!policy.identifies(&HeaderMap::new(), None));
    }
}
