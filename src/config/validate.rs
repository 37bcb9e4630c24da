//! Defaults and the checks that involve more than one key.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::checks::at_least_one;
use super::policy::RawRoute;
use super::sections::RawStore;
use super::top::{RawConfig, Sections};
use super::units;
use super::values::{Choice, Raw};
use super::{
    Config, ConfigError, OnUnavailable, Policy, Route, StoreConfig, StoreKind, UpstreamConfig,
    redact_url, url_secret_is_masked,
};
use crate::idempotency::fingerprint::BodyForm;
use crate::idempotency::path::{self, EscapedSlashes};
use crate::idempotency::source::KeySource;

const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/0";
/// A cluster seed carries no database number (Redis Cluster only has database 0).
const DEFAULT_CLUSTER_URL: &str = "redis://127.0.0.1:6379";
/// Where the file store lives unless `store.path` says otherwise (docs/behaviour.md §12).
const DEFAULT_FILE_PATH: &str = "/var/lib/idemgate";
/// Completed records the memory and file stores keep before evicting the oldest.
const DEFAULT_MAX_ENTRIES: usize = 100_000;

pub(super) fn build(raw: RawConfig) -> Result<Config, ConfigError> {
    raw.build(|raw, keys| {
        let idempotency = raw.idempotency.unwrap_or_default();
        idempotency.check_spelling("idempotency")?;
        let idempotency = idempotency.typed();
        check_policy(&idempotency, "idempotency")?;
        let routes = build_routes(
            raw.routes.unwrap_or_default(),
            &idempotency,
            keys.escaped_slashes,
        )?;
        Ok(Sections {
            listen: raw.listen.map_or(DEFAULT_LISTEN, |addr| addr.0),
            upstream: build_upstream(raw.upstream.unwrap_or_default())?,
            store: build_store(raw.store.unwrap_or_default())?,
            idempotency,
            routes,
            admin: raw.admin.unwrap_or_default(),
            log: raw.log.unwrap_or_default().typed(),
        })
    })
}

fn build_upstream(upstream: UpstreamConfig) -> Result<UpstreamConfig, ConfigError> {
    upstream.check()?;
    Ok(upstream)
}

fn build_store(raw: RawStore) -> Result<StoreConfig, ConfigError> {
    let kind = raw.kind.map_or(StoreKind::Memory, |k| k.0);
    let explicit_cluster = raw.cluster.is_some_and(|c| c.0);
    // Each URL keeps the path of the key it came from, for error messages.
    let (url, urls) = (raw.url.map(|url| url.0), raw.urls.map(Raw::typed));
    let urls: Vec<(String, String)> = match (urls, url) {
        (Some(urls), _) if !urls.is_empty() => urls
            .into_iter()
            .enumerate()
            .map(|(i, url)| (format!("store.urls[{i}]"), url))
            .collect(),
        (_, Some(url)) => vec![("store.url".to_owned(), url)],
        _ if explicit_cluster => vec![("store.url".to_owned(), DEFAULT_CLUSTER_URL.to_owned())],
        _ => vec![("store.url".to_owned(), DEFAULT_REDIS_URL.to_owned())],
    };
    let cluster = explicit_cluster || urls.len() > 1;
    // Keys that do not apply to the chosen kind are allowed (docs/behaviour.md §8), so a
    // memory store does not look at its (unused) URLs.
    if kind == StoreKind::Redis {
        for (path, url) in &urls {
            check_redis_url(url, cluster).map_err(|msg| ConfigError::invalid(path, msg))?;
        }
    }
    let max_entries = match raw.max_entries {
        None => DEFAULT_MAX_ENTRIES,
        Some(count) => at_least_one(count, "store.max_entries")?,
    };
    let sentinel = raw
        .sentinel
        .map(|s| super::sentinel::build(s, kind, |url| check_redis_url(url, false)))
        .transpose()?;
    let min_replicas = super::sentinel::min_replicas(raw.min_replicas.map(|c| c.0))?;
    super::sentinel::check(kind, cluster, sentinel.as_ref(), min_replicas)?;
    let path = raw
        .path
        .map_or_else(|| DEFAULT_FILE_PATH.to_owned(), |path| path.0);
    if path.is_empty() {
        return Err(ConfigError::invalid(
            "store.path",
            "must not be empty; give a directory such as /var/lib/idemgate",
        ));
    }
    let encryption = super::encryption::build(raw.encryption)?;
    let max_entries_per_scope = raw
        .max_entries_per_scope
        .map(|count| at_least_one(count, "store.max_entries_per_scope"))
        .transpose()?;
    let store = StoreConfig {
        kind,
        urls: urls.into_iter().map(|(_, url)| url).collect(),
        cluster,
        key_prefix: raw
            .key_prefix
            .map_or_else(|| "idemgate:".to_owned(), |text| text.0),
        timeout: raw.timeout.map_or(Duration::from_secs(1), |d| d.0),
        on_unavailable: raw.on_unavailable.map_or(OnUnavailable::Reject, |o| o.0),
        max_entries,
        path: path.into(),
        fsync: raw.fsync.is_none_or(|f| f.0),
        sentinel,
        min_replicas,
        encryption,
        max_entries_per_scope,
    };
    Ok(only_keys_in_force(store))
}

/// `store` with the keys the chosen kind does not read back at their defaults: they are
/// allowed in the file but not in force, so two files that differ only in them load to
/// the same configuration (a reload does not refuse them as a store change), and
/// `--check`, which prints the keys of the chosen kind alone, loads back to it.
fn only_keys_in_force(store: StoreConfig) -> StoreConfig {
    let redis = StoreConfig {
        urls: vec![DEFAULT_REDIS_URL.to_owned()],
        cluster: false,
        sentinel: None,
        min_replicas: 0,
        ..store.clone()
    };
    match store.kind {
        StoreKind::Memory => StoreConfig {
            path: DEFAULT_FILE_PATH.into(),
            fsync: true,
            ..redis
        },
        StoreKind::File => redis,
        StoreKind::Redis => StoreConfig {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_entries_per_scope: None,
            path: DEFAULT_FILE_PATH.into(),
            fsync: true,
            ..store
        },
    }
}

/// Checks `redis[s]://[user[:password]@]host[:port][/db][?params]` without echoing
/// the password into the message.
fn check_redis_url(url: &str, cluster: bool) -> Result<(), String> {
    let shown = redact_url(url);
    if url_secret_is_masked(url) {
        return Err(format!(
            "'{shown}' has '***' for its password, what --check prints in place of the \
             password; write the password itself, e.g. ${{REDIS_PASSWORD}}"
        ));
    }
    let Some(rest) = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
    else {
        return Err(format!("'{shown}' is not a redis:// or rediss:// URL"));
    };
    let after_userinfo = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let (address, path) = match after_userinfo.find(['/', '?']) {
        Some(at) => after_userinfo.split_at(at),
        None => (after_userinfo, ""),
    };
    let (host, port) = split_host_port(address);
    if host.is_empty() {
        return Err(format!("'{shown}' has no host"));
    }
    if let Some(port) = port
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err(format!("'{shown}' has an invalid port '{port}'"));
    }
    let db = path
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_start_matches('/');
    if db.is_empty() {
        return Ok(());
    }
    if !db.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "'{shown}' has an invalid database '/{db}'; expected a number such as /0"
        ));
    }
    if cluster {
        return Err(format!(
            "'{shown}': cluster URLs carry no database number; remove '/{db}'"
        ));
    }
    Ok(())
}

/// Splits `host:port`, `[v6]:port`, `host` or `[v6]`.
fn split_host_port(address: &str) -> (&str, Option<&str>) {
    if let Some(v6) = address.strip_prefix('[') {
        return match v6.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => ("", None),
        };
    }
    match address.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (address, None),
    }
}

fn build_routes(
    raw: Vec<RawRoute>,
    idempotency: &Policy,
    slashes: EscapedSlashes,
) -> Result<Vec<Route>, ConfigError> {
    let mut routes: Vec<Route> = Vec::with_capacity(raw.len());
    for (index, route) in raw.into_iter().enumerate() {
        let section = format!("routes[{index}]");
        route.check_spelling(&section)?;
        let (path, policy) = route.merge(idempotency);
        check_policy(&policy, &section)?;
        let field = format!("routes[{index}].path");
        let Some(path) = path else {
            return Err(ConfigError::invalid(
                field,
                "missing; every route needs a path prefix such as /charges",
            ));
        };
        let path = normalise_route_path(&path, slashes)
            .map_err(|msg| ConfigError::invalid(&field, msg))?;
        routes.push(Route { path, policy });
    }
    Ok(routes)
}

/// The checks of key sources and fingerprints that involve two keys
/// (docs/behaviour.md §9, §10), on the merged policy, so that a route is refused for a
/// combination it inherits half of too.
fn check_policy(policy: &Policy, section: &str) -> Result<(), ConfigError> {
    check_window(policy, section)?;
    check_fingerprint(policy, section)?;
    check_streaming(policy, section)
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
                    units::format_duration(*window),
                    units::format_duration(policy.ttl)
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

fn normalise_route_path(path: &str, slashes: EscapedSlashes) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("'{path}' must start with '/'"));
    }
    if path.contains(['?', '#']) || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "'{path}' is not a path prefix: routes match on the path alone, without query, \
             fragment or spaces"
        ));
    }
    // Requests match with each segment's `;parameters` removed (docs/behaviour.md §25):
    // a route holding a `;` would match nothing, and guard nothing.
    if path.contains(';') {
        return Err(format!(
            "'{path}' can never match a request: it contains ';', and requests match \
             routes with each segment's ';parameters' removed"
        ));
    }
    // Requests are matched after normalisation: a route written otherwise would match
    // nothing, and a `required: true` on it would guard nothing.
    match path::normalise(path, slashes) {
        Ok(normal) if normal != path => {
            return Err(format!(
                "'{path}' is not in normal form, so no request would ever match it; \
                 its normal form is '{normal}'"
            ));
        }
        Ok(_) => {}
        Err(err) => {
            return Err(format!(
                "'{path}' can never match a request: {err} (escaped_slashes: {})",
                slashes.name()
            ));
        }
    }
    let trimmed = path.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    })
}
