//! `replay_authorization` (docs/behaviour.md §24): the request that asks, before a
//! replay, whether the retry's credentials are still good. Checked while it is
//! deserialized, so that an error names its path (`routes[0].replay_authorization`),
//! and printed for `--check`.

use std::time::Duration;

use http::uri::PathAndQuery;
use http::{HeaderName, Method, Uri};
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};

use crate::config::types::http::Header;
use crate::config::types::units::Dur;
use crate::config::types::{Form, Shown, Text, given};

/// The check, as a policy has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayAuthorization {
    pub method: Method,
    pub target: AuthorizerTarget,
    /// The headers copied from the retry; `None`: `authorization` and the policy's
    /// `scope_headers`, resolved where it is sent, since a route may change those.
    pub headers: Option<Vec<HeaderName>>,
    /// The bound of the whole check, head and body.
    pub timeout: Duration,
}

/// Where the check is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorizerTarget {
    /// `path`: on the route's own upstream, under its base path.
    Path(PathAndQuery),
    /// `url`: its origin (`scheme://authority/`) and its path and query.
    Url { origin: Uri, path: PathAndQuery },
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

impl ReplayAuthorization {
    /// The headers the check copies from the retry, in order, each once.
    pub fn copied<'a>(&'a self, scope_headers: &'a [HeaderName]) -> Vec<&'a HeaderName> {
        let listed: Box<dyn Iterator<Item = &HeaderName>> = match &self.headers {
            Some(headers) => Box::new(headers.iter()),
            None => Box::new(std::iter::once(&http::header::AUTHORIZATION).chain(scope_headers)),
        };
        let mut names: Vec<&HeaderName> = Vec::new();
        for name in listed {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }
}

/// `replay_authorization` as written.
#[derive(Debug, Clone)]
pub(crate) struct ReplayAuthorizationForm(ReplayAuthorization);

impl Form for ReplayAuthorizationForm {
    type Value = Option<ReplayAuthorization>;
    fn value(self) -> Option<ReplayAuthorization> {
        Some(self.0)
    }
    fn unset(value: &Option<ReplayAuthorization>) -> bool {
        value.is_none()
    }
    fn print<S: Serializer>(value: &Option<ReplayAuthorization>, s: S) -> Result<S::Ok, S::Error> {
        let Some(r) = value else {
            return s.serialize_none();
        };
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("method", r.method.as_str())?;
        match &r.target {
            AuthorizerTarget::Path(path) => {
                map.serialize_entry("path", &Shown::<Text>(&path.as_str().to_owned()))?;
            }
            AuthorizerTarget::Url { origin, path } => {
                let origin = origin.to_string();
                let url = format!("{}{}", origin.trim_end_matches('/'), path.as_str());
                map.serialize_entry("url", &Shown::<Text>(&url))?;
            }
        }
        if let Some(headers) = &r.headers {
            map.serialize_entry("headers", &Shown::<Vec<Header>>(headers))?;
        }
        map.serialize_entry("timeout", &Shown::<Dur>(&r.timeout))?;
        map.end()
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with path or url (and method, headers, timeout)"
)]
struct Fields {
    #[serde(default, deserialize_with = "given")]
    method: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    path: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    url: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    headers: Option<Vec<Header>>,
    #[serde(default, deserialize_with = "given")]
    timeout: Option<Dur>,
}

impl<'de> Deserialize<'de> for ReplayAuthorizationForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = Fields::deserialize(d)?;
        let method = match f.method {
            None => Method::GET,
            Some(text) => Method::from_bytes(text.0.trim().to_ascii_uppercase().as_bytes())
                .map_err(|_| de::Error::custom(format!("invalid HTTP method '{}'", text.0)))?,
        };
        let target = match (f.path, f.url) {
            (Some(path), None) => {
                AuthorizerTarget::Path(parse_path(&path.0).map_err(de::Error::custom)?)
            }
            (None, Some(url)) => parse_url(&url.0).map_err(de::Error::custom)?,
            (None, None) => {
                return Err(de::Error::custom(
                    "needs path (on the same upstream, e.g. /auth/check) or url \
                     (e.g. https://auth.internal/check)",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(de::Error::custom(
                    "has both path and url; write exactly one of them",
                ));
            }
        };
        Ok(ReplayAuthorizationForm(ReplayAuthorization {
            method,
            target,
            headers: f
                .headers
                .map(|headers| headers.into_iter().map(Form::value).collect()),
            timeout: f.timeout.map_or(DEFAULT_TIMEOUT, |d| d.0),
        }))
    }
}

/// An origin-form path and query: it is sent to the upstream under its base path.
fn parse_path(path: &str) -> Result<PathAndQuery, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "path '{path}' must start with '/': it is sent to the upstream"
        ));
    }
    path.parse()
        .map_err(|err| format!("path '{path}' is not a valid path: {err}"))
}

/// An absolute `http` or `https` URL, without credentials.
fn parse_url(text: &str) -> Result<AuthorizerTarget, String> {
    let text = text.trim();
    let uri: Uri = text
        .parse()
        .map_err(|err| format!("invalid url '{text}': {err}; expected https://host/path"))?;
    let scheme = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => "http",
        Some(s) if s.eq_ignore_ascii_case("https") => "https",
        _ => {
            return Err(format!(
                "url '{text}' is not an absolute http or https URL; expected https://host/path"
            ));
        }
    };
    let authority = match uri.authority() {
        Some(authority) if !authority.host().is_empty() => authority,
        _ => return Err(format!("url '{text}' has no host")),
    };
    if authority.as_str().contains('@') {
        return Err("credentials in the url are not supported".to_owned());
    }
    let origin = Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str())
        .path_and_query("/")
        .build()
        .map_err(|err| format!("invalid url '{text}': {err}"))?;
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Ok(AuthorizerTarget::Url { origin, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_urls_are_checked() {
        assert!(parse_path("/auth/check?x=1").is_ok());
        assert!(parse_path("auth/check").is_err());
        assert!(parse_path("/a b").is_err());
        let Ok(AuthorizerTarget::Url { origin, path }) =
            parse_url("HTTPS://auth.internal:8443/check?v=2")
        else {
            panic!("a valid url");
        };
        assert_eq!(origin.to_string(), "https://auth.internal:8443/");
        assert_eq!(path.as_str(), "/check?v=2");
        for bad in [
            "/check",
            "ftp://h/x",
            "http://u:p@h/x",
            "auth.internal/check",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_headers_are_authorization_and_the_scope_headers_once() {
        let r = ReplayAuthorization {
            method: Method::GET,
            target: AuthorizerTarget::Path(PathAndQuery::from_static("/a")),
            headers: None,
            timeout: DEFAULT_TIMEOUT,
        };
        let tenant = HeaderName::from_static("x-tenant");
        let scope = [http::header::AUTHORIZATION, tenant.clone()];
        assert_eq!(
            r.copied(&scope),
            vec![&http::header::AUTHORIZATION, &tenant]
        );
        let listed = ReplayAuthorization {
            headers: Some(vec![tenant.clone()]),
            ..r
        };
        assert_eq!(listed.copied(&scope), vec![&tenant]);
    }
}
