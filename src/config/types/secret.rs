//! Secrets: what `--check` prints in their place, and how it finds them in URLs.

use serde::Deserialize;
use serde::de::Deserializer;
use serde::ser::{Serialize, Serializer};

use super::{Form, Shown, Text, forms};

/// What `--check` prints in place of a secret. Loading refuses it as the value of a
/// secret, so that printed output never starts a server that takes the mask for the
/// secret (a token of `***` would let anyone who guesses it purge keys).
pub(crate) const MASK: &str = "***";

/// A `scheme://user:pass@host` URL cut around its secret: the password, or a lone
/// user-info part, which some clients read as a password.
pub(crate) struct UrlSecret<'a> {
    /// Up to and including the `:` after the user name, or the `://` of a lone secret.
    pub(crate) before: &'a str,
    pub(crate) secret: &'a str,
    /// From the `@` that ends the user-info on.
    pub(crate) after: &'a str,
}

pub(crate) fn url_secret(url: &str) -> Option<UrlSecret<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    // The last `@` ends the user-info: a password may contain an unescaped `@`, a host
    // or a database path never does.
    let (userinfo, _host) = rest.rsplit_once('@')?;
    let start = scheme.len() + "://".len();
    let start = start + userinfo.find(':').map_or(0, |colon| colon + 1);
    let end = scheme.len() + "://".len() + userinfo.len();
    Some(UrlSecret {
        before: &url[..start],
        secret: &url[start..end],
        after: &url[end..],
    })
}

/// The URL with its secret, if it has one, replaced by `mask`.
pub(crate) fn mask_url(url: &str, mask: &str) -> String {
    match url_secret(url) {
        Some(cut) => format!("{}{mask}{}", cut.before, cut.after),
        None => url.to_owned(),
    }
}

/// Replaces the password (or a lone user-info part) of a URL with `***`.
pub(crate) fn redact_url(url: &str) -> String {
    mask_url(url, MASK)
}

/// Whether the URL's password is the mask, as written or percent-encoded (Redis clients
/// decode it before sending it).
pub(crate) fn url_secret_is_masked(url: &str) -> bool {
    url_secret(url).is_some_and(|cut| cut.secret.replace("%2A", "*").replace("%2a", "*") == MASK)
}

/// The mask as `--check` prints it in place of a secret, quoted: `'***'`.
pub(crate) fn masked<T: ?Sized, S: Serializer>(_: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_saphyr::SingleQuoted(MASK).serialize(s)
}

/// [`masked`] as a value.
pub(crate) struct Mask;

impl Serialize for Mask {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        masked(self, s)
    }
}

/// URLs that may hold a password (`store.urls`, `store.sentinel.urls`): read as
/// strings, printed with the password as `***`.
pub(crate) struct SecretUrls(Vec<String>);

impl<'de> Deserialize<'de> for SecretUrls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(SecretUrls(Vec::<Text>::deserialize(d)?.value()))
    }
}

forms! {
    SecretUrls => Vec<String>, |urls: &Vec<String>, s: S| {
        let redacted: Vec<String> = urls.iter().map(|url| redact_url(url)).collect();
        s.collect_seq(redacted.iter().map(Shown::<Text>))
    };
}
