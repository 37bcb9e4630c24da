//! `telemetry`: where idemgate sends its traces (docs/behaviour.md §20). Unset, or
//! without `otlp`, there is no exporter and requests do no span work at all.
//!
//! ```yaml
//! telemetry:
//!   otlp:
//!     endpoint: http://127.0.0.1:4318   # the collector; http/protobuf adds /v1/traces
//!     protocol: http/protobuf            # http/protobuf | grpc
//!     service_name: idemgate
//!     sample_ratio: 1.0                  # of the traces that start here
//!     headers: {}                        # sent with every export; values are secrets
//! ```

use http::{HeaderName, HeaderValue, Uri};
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
use crate::config::types::http::HeaderPairs;
use crate::config::types::secret::MASK;
use crate::config::types::secret::Mask;
use crate::config::types::units::Ratio;
use crate::config::types::{As, Choice, Form, Pick, Text, forms, shown, text};

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies, to `endpoint` + `/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC over plain HTTP/2, to `endpoint`.
    Grpc,
}

impl Choice for OtlpProtocol {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("http/protobuf", OtlpProtocol::HttpProtobuf),
        ("grpc", OtlpProtocol::Grpc),
    ];
}

/// `telemetry`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping with otlp")]
pub struct TelemetryConfig {
    /// The OTLP exporter; `None` (or `null`): no traces.
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp`, checked.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with endpoint, protocol, service_name, sample_ratio, headers"
)]
pub struct OtlpConfig {
    /// `http://host:port`, with an optional base path; `https://` is refused, since the
    /// exporter is built without TLS (a collector runs beside idemgate, as an agent).
    /// No default: `Uri::default()` is "not given", refused by
    /// [`TelemetryConfig::check`].
    #[serde(with = "As::<Endpoint>")]
    pub endpoint: Uri,
    #[serde(with = "As::<Pick<OtlpProtocol>>")]
    pub protocol: OtlpProtocol,
    /// The `service.name` of the spans' resource.
    #[serde(with = "As::<ServiceName>")]
    pub service_name: String,
    /// The share of traces that start at idemgate which are recorded; a request whose
    /// `traceparent` says sampled (or not) follows its parent.
    #[serde(with = "As::<Ratio>")]
    pub sample_ratio: f64,
    /// Sent with every export (an API key, a tenant); values are marked sensitive, and
    /// printed `***` by `--check`.
    #[serde(with = "As::<Headers>")]
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: Uri::default(),
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: "idemgate".to_owned(),
            sample_ratio: 1.0,
            headers: Vec::new(),
        }
    }
}

impl OtlpConfig {
    /// Where spans are posted: for `http/protobuf`, the endpoint's path with
    /// `/v1/traces` added, as `OTEL_EXPORTER_OTLP_ENDPOINT` is read (unless it already
    /// ends so); for `grpc`, the endpoint itself.
    pub fn traces_url(&self) -> String {
        let base = self.endpoint.to_string();
        let base = base.trim_end_matches('/');
        match self.protocol {
            OtlpProtocol::Grpc => base.to_owned(),
            OtlpProtocol::HttpProtobuf if base.ends_with("/v1/traces") => base.to_owned(),
            OtlpProtocol::HttpProtobuf => format!("{base}/v1/traces"),
        }
    }
}

impl TelemetryConfig {
    /// `otlp` needs its `endpoint`, the one key without a default.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        match &self.otlp {
            Some(otlp) if otlp.endpoint == Uri::default() => Err(ConfigError::invalid(
                "telemetry.otlp.endpoint",
                "missing; the collector's URL, such as http://127.0.0.1:4318 (http/protobuf) \
                 or http://127.0.0.1:4317 (grpc)",
            )),
            _ => Ok(()),
        }
    }
}

/// `endpoint`: an `http://` URL.
struct Endpoint(Uri);

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(text) = Text::deserialize(d)?;
        endpoint_url(&text)
            .map(Endpoint)
            .map_err(|message| de::Error::custom(format!("'{text}': {message}")))
    }
}

/// `service_name`: not empty.
struct ServiceName(String);

impl<'de> Deserialize<'de> for ServiceName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(name) = Text::deserialize(d)?;
        if name.trim().is_empty() {
            return Err(de::Error::custom(
                "is empty; it names idemgate in the traces (default idemgate)",
            ));
        }
        Ok(ServiceName(name))
    }
}

/// A header value that is a secret: `***`, what `--check` prints in its place, is
/// refused.
struct SecretValue(String);

impl<'de> Deserialize<'de> for SecretValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(value) = Text::deserialize(d)?;
        if value == MASK {
            return Err(de::Error::custom(
                "is '***', what --check prints in place of a header value; write the value \
                 (or ${VAR})",
            ));
        }
        Ok(SecretValue(value))
    }
}

impl From<SecretValue> for String {
    fn from(value: SecretValue) -> String {
        value.0
    }
}

/// `headers`, every value marked sensitive.
struct Headers(Vec<(HeaderName, HeaderValue)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut headers = HeaderPairs::<SecretValue>::deserialize(d)?.value();
        for (_, value) in &mut headers {
            value.set_sensitive(true);
        }
        Ok(Headers(headers))
    }
}

/// Header names, each value printed `***`.
fn masked_headers<S: Serializer>(
    headers: &Vec<(HeaderName, HeaderValue)>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(headers.len()))?;
    for (name, _) in headers {
        map.serialize_entry(name.as_str(), &Mask)?;
    }
    map.end()
}

forms! {
    Endpoint => Uri, shown;
    ServiceName => String, |name: &String, s: S| text(name, s);
    Headers => Vec<(HeaderName, HeaderValue)>, masked_headers;
}

/// An `http://host:port[/path]` URL, without query or fragment.
fn endpoint_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .trim()
        .parse()
        .map_err(|err| format!("not a URL ({err}); expected http://host:port"))?;
    match uri.scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("http") => {}
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => {
            return Err(
                "https is not supported: the exporter speaks plain HTTP, to a \
                        collector beside idemgate (http://host:port)"
                    .to_owned(),
            );
        }
        _ => return Err("expected http://host:port".to_owned()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("has no host; expected http://host:port".to_owned());
    }
    if uri.query().is_some() {
        return Err("has a query; expected http://host:port".to_owned());
    }
    Ok(uri)
}

/// The paths `--check` printed as `***`, for its opening comment.
pub(crate) fn masked(telemetry: &TelemetryConfig) -> Vec<String> {
    telemetry
        .otlp
        .iter()
        .flat_map(|otlp| {
            otlp.headers
                .iter()
                .map(|(name, _)| format!("telemetry.otlp.headers.{name}"))
        })
        .collect()
}
