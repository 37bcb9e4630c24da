//! `scope_principal` (docs/behaviour.md §17): its raw form, checked while it is
//! deserialized so that every error names its path
//! (`routes[0].scope_principal.jwt.jwks_file`), and its printing for `--check`.
//!
//! A `jwks_file` is read and parsed here, when the configuration loads: a file that
//! cannot be is a configuration error at start, under `--check` and on a reload alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{Uri, header};
use serde::Deserialize;
use serde::de::{self, Deserializer};

use serde::ser::{SerializeMap, Serializer};

use crate::config::types::http::Header;
use crate::config::types::secret::MASK;
use crate::config::types::secret::Mask;
use crate::config::types::units::{Dur, Flag};
use crate::config::types::{Form, Shown, Text, given};
use crate::principal::{BasicPrincipal, JwtKeys, JwtSource, ScopePrincipal, Secret, parse_jwks};

/// `scope_principal` as written: exactly one of its three sources.
pub(crate) struct ScopePrincipalForm(ScopePrincipal);

impl Form for ScopePrincipalForm {
    type Value = Option<ScopePrincipal>;
    fn value(self) -> Option<ScopePrincipal> {
        Some(self.0)
    }
    fn unset(source: &Option<ScopePrincipal>) -> bool {
        source.is_none()
    }
    /// As written, the secret as `***`.
    fn print<S: Serializer>(source: &Option<ScopePrincipal>, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match source {
            None => return map.end(),
            Some(ScopePrincipal::Jwt(jwt)) => map.serialize_entry("jwt", &Jwt(jwt))?,
            Some(ScopePrincipal::TrustedHeader(name)) => {
                map.serialize_entry("trusted_header", &Shown::<Header>(name))?;
            }
            Some(ScopePrincipal::Basic(_)) => map.serialize_entry("basic", &true)?,
        }
        map.end()
    }
}

/// `scope_principal.jwt` as `--check` prints it.
struct Jwt<'a>(&'a JwtSource);

impl serde::Serialize for Jwt<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let jwt = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("header", &Shown::<Header>(&jwt.header))?;
        map.serialize_entry("claims", &Shown::<Vec<Text>>(&jwt.claims))?;
        match &jwt.keys {
            JwtKeys::File { path, .. } => {
                let path = path.to_string_lossy().into_owned();
                map.serialize_entry("jwks_file", &Shown::<Text>(&path))?;
            }
            JwtKeys::Url(uri) => {
                map.serialize_entry("jwks_url", &Shown::<Text>(&uri.to_string()))?;
            }
            JwtKeys::Secret(_) => map.serialize_entry("hs256_secret", &Mask)?,
        }
        map.serialize_entry("jwks_refresh", &Shown::<Dur>(&jwt.refresh))?;
        map.serialize_entry("jwks_timeout", &Shown::<Dur>(&jwt.timeout))?;
        if let Some(issuer) = &jwt.issuer {
            map.serialize_entry("issuer", &Shown::<Text>(issuer))?;
        }
        if let Some(audience) = &jwt.audience {
            map.serialize_entry("audience", &Shown::<Text>(audience))?;
        }
        map.serialize_entry("leeway", &Shown::<Dur>(&jwt.leeway))?;
        map.end()
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "one of jwt: {...}, trusted_header: NAME, basic: true"
)]
struct Fields {
    #[serde(default, deserialize_with = "given")]
    jwt: Option<JwtForm>,
    #[serde(default, deserialize_with = "given")]
    trusted_header: Option<Header>,
    #[serde(default, deserialize_with = "given")]
    basic: Option<Flag>,
}

impl<'de> Deserialize<'de> for ScopePrincipalForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let fields = Fields::deserialize(d)?;
        let basic = fields.basic.is_some_and(|flag| flag.0);
        let source = match (fields.jwt, fields.trusted_header, basic) {
            (Some(jwt), None, false) => ScopePrincipal::Jwt(Arc::new(jwt.0)),
            (None, Some(name), false) => ScopePrincipal::TrustedHeader(name.0),
            // The password is part of the principal until a policy's
            // `replay_authorization` checks it (docs/behaviour.md §25).
            (None, None, true) => ScopePrincipal::Basic(BasicPrincipal::UserAndPassword),
            _ => {
                return Err(de::Error::custom(
                    "write exactly one of jwt: {...}, trusted_header: NAME or basic: true",
                ));
            }
        };
        Ok(ScopePrincipalForm(source))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of jwt keys")]
struct JwtFields {
    #[serde(default, deserialize_with = "given")]
    header: Option<Header>,
    #[serde(default, deserialize_with = "given")]
    claims: Option<Vec<Text>>,
    #[serde(default, deserialize_with = "given")]
    jwks_file: Option<JwksFile>,
    #[serde(default, deserialize_with = "given")]
    jwks_url: Option<JwksUrl>,
    #[serde(default, deserialize_with = "given")]
    hs256_secret: Option<SecretText>,
    #[serde(default, deserialize_with = "given")]
    jwks_refresh: Option<Dur>,
    #[serde(default, deserialize_with = "given")]
    jwks_timeout: Option<Dur>,
    #[serde(default, deserialize_with = "given")]
    issuer: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    audience: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    leeway: Option<Dur>,
}

/// `scope_principal.jwt`, with its defaults filled in.
struct JwtForm(JwtSource);

/// How often a key set is read again by default.
const DEFAULT_REFRESH: Duration = Duration::from_secs(5 * 60);

/// The longest a read of a key set takes by default (docs/behaviour.md §25).
const DEFAULT_JWKS_TIMEOUT: Duration = Duration::from_secs(5);

/// The clock skew allowed on `exp` and `nbf` by default.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

impl<'de> Deserialize<'de> for JwtForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = JwtFields::deserialize(d)?;
        let keys = match (f.jwks_file, f.jwks_url, f.hs256_secret) {
            (Some(file), None, None) => file.0,
            (None, Some(url), None) => JwtKeys::Url(url.0),
            (None, None, Some(secret)) => JwtKeys::Secret(secret.0),
            _ => {
                return Err(de::Error::custom(
                    "write exactly one key source: jwks_file, jwks_url or hs256_secret",
                ));
            }
        };
        let claims = match f.claims {
            None => vec!["iss".to_owned(), "sub".to_owned()],
            Some(claims) if claims.is_empty() => {
                return Err(de::Error::custom(
                    "claims must not be empty: they are what tells callers apart",
                ));
            }
            Some(claims) => claims.into_iter().map(Form::value).collect(),
        };
        Ok(JwtForm(JwtSource {
            header: f.header.map_or(header::AUTHORIZATION, |h| h.0),
            claims,
            keys,
            refresh: f.jwks_refresh.map_or(DEFAULT_REFRESH, |d| d.0),
            timeout: f.jwks_timeout.map_or(DEFAULT_JWKS_TIMEOUT, |d| d.0),
            issuer: f.issuer.map(|t| t.0),
            audience: f.audience.map(|t| t.0),
            leeway: f.leeway.map_or(DEFAULT_LEEWAY, |d| d.0),
        }))
    }
}

/// `jwks_file`: read and parsed as it is deserialized.
struct JwksFile(JwtKeys);

impl<'de> Deserialize<'de> for JwksFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let path = PathBuf::from(Text::deserialize(d)?.0);
        let shown = path.display();
        let bytes = std::fs::read(&path)
            .map_err(|err| de::Error::custom(format!("cannot read '{shown}': {err}")))?;
        let set =
            parse_jwks(&bytes).map_err(|err| de::Error::custom(format!("'{shown}' {err}")))?;
        Ok(JwksFile(JwtKeys::File {
            set: Arc::new(set),
            path,
        }))
    }
}

/// `jwks_url`: an `http://` or `https://` URL with a host.
struct JwksUrl(Uri);

impl<'de> Deserialize<'de> for JwksUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text::deserialize(d)?.0;
        let uri: Uri = text
            .trim()
            .parse()
            .map_err(|err| de::Error::custom(format!("invalid URL '{text}': {err}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(de::Error::custom(format!(
                "'{text}' is not an http:// or https:// URL with a host"
            )));
        }
        Ok(JwksUrl(uri))
    }
}

/// `hs256_secret`: its bytes as written (after `${VAR}`), not decoded.
struct SecretText(Secret);

impl<'de> Deserialize<'de> for SecretText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text::deserialize(d)?.0;
        if text.is_empty() {
            return Err(de::Error::custom("must not be empty"));
        }
        if text == MASK {
            return Err(de::Error::custom(
                "is '***', what --check prints in place of the secret; write the secret \
                 itself, e.g. ${JWT_SECRET}",
            ));
        }
        Ok(SecretText(Secret::new(text.into_bytes())))
    }
}
