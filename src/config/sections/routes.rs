//! `routes`: per path prefix, a policy that overrides the keys of `idempotency` it
//! writes (docs/behaviour.md §6, §8); the first match in file order wins.

use serde::ser::{Serialize, Serializer};

use crate::config::error::ConfigError;
use crate::config::sections::policy::{Policy, Printed, WrittenRoute};
use crate::config::types::Choice;
use crate::idempotency::path::{self, EscapedSlashes};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMatch {
    Exact,
    /// ASCII case is ignored, for upstreams that route that way.
    CaseInsensitive,
}

impl Choice for RouteMatch {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("exact", RouteMatch::Exact),
        ("case_insensitive", RouteMatch::CaseInsensitive),
    ];
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Normalised prefix: starts with '/', no trailing '/' (except the root "/").
    pub path: String,
    pub policy: Policy,
    /// What it inherits: `idempotency`, so that `--check` prints only the keys in which
    /// the route differs.
    pub(crate) base: Policy,
}

impl Serialize for Route {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let printed = Printed {
            path: Some(&self.path),
            policy: &self.policy,
            base: Some(&self.base),
        };
        printed.serialize(s)
    }
}

/// The routes as written, each on top of `idempotency`, checked, their paths in normal
/// form under `slashes`.
pub(crate) fn build(
    raw: Vec<WrittenRoute>,
    idempotency: &Policy,
    slashes: EscapedSlashes,
) -> Result<Vec<Route>, ConfigError> {
    let mut routes: Vec<Route> = Vec::with_capacity(raw.len());
    for (index, route) in raw.into_iter().enumerate() {
        let section = format!("routes[{index}]");
        route.check_spelling(&section)?;
        let (path, policy) = route.merge(idempotency);
        policy.check(&section)?;
        let field = format!("routes[{index}].path");
        let Some(path) = path else {
            return Err(ConfigError::invalid(
                field,
                "missing; every route needs a path prefix such as /charges",
            ));
        };
        let path = normalise_route_path(&path, slashes)
            .map_err(|msg| ConfigError::invalid(&field, msg))?;
        routes.push(Route {
            path,
            policy,
            base: idempotency.clone(),
        });
    }
    Ok(routes)
}

/// Whether route prefix `prefix` (normalised) covers request path `path`, comparing
/// whole segments.
pub(crate) fn prefix_matches(prefix: &str, path: &str, mode: RouteMatch) -> bool {
    if prefix == "/" {
        return true;
    }
    let Some(head) = path.get(..prefix.len()) else {
        return false;
    };
    let same = match mode {
        RouteMatch::Exact => head == prefix,
        RouteMatch::CaseInsensitive => head.eq_ignore_ascii_case(prefix),
    };
    let rest = &path[prefix.len()..];
    same && (rest.is_empty() || rest.starts_with('/'))
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
