//! Defaults and the checks that involve more than one key.

use std::net::{Ipv4Addr, SocketAddr};

use super::policy::RawRoute;
use super::top::{RawConfig, Sections};
use super::units;
use super::values::{Choice, Raw};
use super::{Config, ConfigError, Policy, Route, UpstreamConfig};
use crate::idempotency::fingerprint::BodyForm;
use crate::idempotency::path::{self, EscapedSlashes};
use crate::idempotency::source::KeySource;

const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);

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
            store: raw.store.unwrap_or_default().build()?,
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
