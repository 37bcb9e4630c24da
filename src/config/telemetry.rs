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

use super::render::{Mapping, Value};
use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

use super::values::{Choice, HeaderPairs, Null, Pick, Ratio, Text, given, null};

null! {
    refused:;
    default: RawTelemetry,
}
use super::{ConfigError, MASK};

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies, to `endpoint` + `/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC over plain HTTP/2, to `endpoint`.
    Grpc,
}

/// `telemetry`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TelemetryConfig {
    /// The OTLP exporter; `None`: no traces.
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// `http://host:port`, with an optional base path; `https://` is refused, since the
    /// exporter is built without TLS (a collector runs beside idemgate, as an agent).
    pub endpoint: Uri,
    pub protocol: OtlpProtocol,
    /// The `service.name` of the spans' resource.
    pub service_name: String,
    /// The share of traces that start at idemgate which are recorded; a request whose
    /// `traceparent` says sampled (or not) follows its parent.
    pub sample_ratio: f64,
    /// Sent with every export (an API key, a tenant); values are marked sensitive, and
    /// printed `***` by `--check`.
    pub headers: Vec<(HeaderName, HeaderValue)>,
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with otlp")]
pub(super) struct RawTelemetry {
    otlp: Option<RawOtlp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with endpoint, protocol, service_name, sample_ratio, headers"
)]
struct RawOtlp {
    #[serde(default, deserialize_with = "given")]
    endpoint: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    protocol: Option<Pick<OtlpProtocol>>,
    #[serde(default, deserialize_with = "given")]
    service_name: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    sample_ratio: Option<Ratio>,
    #[serde(default, deserialize_with = "given")]
    headers: Option<HeaderPairs>,
}

/// `telemetry` checked: `key` is `telemetry`.
pub(super) fn build(raw: RawTelemetry, key: &str) -> Result<TelemetryConfig, ConfigError> {
    let Some(otlp) = raw.otlp else {
        return Ok(TelemetryConfig::default());
    };
    let at = |name: &str| format!("{key}.otlp.{name}");
    let Some(endpoint) = otlp.endpoint else {
        return Err(ConfigError::invalid(
            at("endpoint"),
            "missing; the collector's URL, such as http://127.0.0.1:4318 (http/protobuf) \
             or http://127.0.0.1:4317 (grpc)",
        ));
    };
    let endpoint = endpoint_url(&endpoint.0).map_err(|message| {
        ConfigError::invalid(at("endpoint"), format!("'{}': {message}", endpoint.0))
    })?;
    let service_name = match otlp.service_name {
        None => "idemgate".to_owned(),
        Some(Text(name)) if name.trim().is_empty() => {
            return Err(ConfigError::invalid(
                at("service_name"),
                "is empty; it names idemgate in the traces (default idemgate)",
            ));
        }
        Some(Text(name)) => name,
    };
    let mut headers = otlp.headers.map(|h| h.0).unwrap_or_default();
    for (name, value) in &mut headers {
        if value.as_bytes() == MASK.as_bytes() {
            return Err(ConfigError::invalid(
                format!("{}.{name}", at("headers")),
                "is '***', what --check prints in place of a header value; write the value \
                 (or ${VAR})",
            ));
        }
        value.set_sensitive(true);
    }
    Ok(TelemetryConfig {
        otlp: Some(OtlpConfig {
            endpoint,
            protocol: otlp.protocol.map_or(OtlpProtocol::HttpProtobuf, |p| p.0),
            service_name,
            sample_ratio: otlp.sample_ratio.map_or(1.0, |r| r.0),
            headers,
        }),
    })
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

/// `telemetry` as `--check` prints it: `otlp` with every key, header values as `***`.
pub(super) fn render(telemetry: &TelemetryConfig) -> Value {
    let mut map = Mapping::new();
    let otlp = match &telemetry.otlp {
        None => Value::Null,
        Some(otlp) => {
            let mut m = Mapping::new();
            m.insert("endpoint".into(), otlp.endpoint.to_string().into());
            m.insert("protocol".into(), otlp.protocol.name().into());
            m.insert("service_name".into(), otlp.service_name.as_str().into());
            m.insert("sample_ratio".into(), otlp.sample_ratio.into());
            let mut headers = Mapping::new();
            for (name, _) in &otlp.headers {
                headers.insert(name.as_str().into(), MASK.into());
            }
            m.insert("headers".into(), headers.into());
            Value::Mapping(m)
        }
    };
    map.insert("otlp".into(), otlp);
    Value::Mapping(map)
}

/// The paths `--check` printed as `***`, for its opening comment.
pub(super) fn masked(telemetry: &TelemetryConfig) -> Vec<String> {
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
