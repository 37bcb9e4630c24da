//! `telemetry.otlp` (docs/behaviour.md §20): defaults, where spans are posted, the
//! errors that name the key, and `--check` printing header values as secrets.

use super::*;

fn otlp(keys: &str) -> String {
    with_minimal(&format!("telemetry:\n  otlp:\n{keys}"))
}

#[test]
fn no_telemetry_is_no_exporter() {
    assert_eq!(parse_ok(MINIMAL).telemetry, TelemetryConfig::default());
    assert_eq!(
        parse_ok(&with_minimal("telemetry: {}\n")).telemetry.otlp,
        None
    );
    assert_eq!(
        parse_ok(&with_minimal("telemetry:\n  otlp: null\n"))
            .telemetry
            .otlp,
        None
    );
}

#[test]
fn an_endpoint_alone_gets_every_default() {
    let config = parse_ok(&otlp("    endpoint: http://collector:4318\n"));
    let otlp = config.telemetry.otlp.expect("an exporter");
    assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(otlp.service_name, "idemgate");
    assert!((otlp.sample_ratio - 1.0).abs() < f64::EPSILON);
    assert!(otlp.headers.is_empty());
    assert_eq!(otlp.traces_url(), "http://collector:4318/v1/traces");
}

#[test]
fn spans_are_posted_to_v1_traces_under_http_and_to_the_endpoint_under_grpc() {
    let url = |keys: &str| parse_ok(&otlp(keys)).telemetry.otlp.unwrap().traces_url();
    assert_eq!(
        url("    endpoint: http://c:4318/base/\n"),
        "http://c:4318/base/v1/traces"
    );
    assert_eq!(
        url("    endpoint: http://c:4318/v1/traces\n"),
        "http://c:4318/v1/traces"
    );
    assert_eq!(
        url("    endpoint: http://c:4317\n    protocol: grpc\n"),
        "http://c:4317"
    );
}

#[test]
fn every_key_is_read_and_header_values_are_secrets() {
    let env = env_map(&[("TOKEN", "s3cret")]);
    let text = otlp(
        "    endpoint: http://c:4317\n    protocol: grpc\n    service_name: payments\n    \
         sample_ratio: \"0.25\"\n    headers:\n      x-api-key: ${TOKEN}\n",
    );
    let config = Config::from_yaml_str(&text, &env).unwrap();
    let otlp = config.telemetry.otlp.clone().unwrap();
    assert_eq!(otlp.protocol, OtlpProtocol::Grpc);
    assert_eq!(otlp.service_name, "payments");
    assert!((otlp.sample_ratio - 0.25).abs() < f64::EPSILON);
    assert_eq!(otlp.headers[0].0, "x-api-key");
    assert_eq!(otlp.headers[0].1, "s3cret");
    assert!(!format!("{config:?}").contains("s3cret"), "never in Debug");
    let yaml = config.to_yaml();
    assert!(!yaml.contains("s3cret"), "{yaml}");
    assert!(yaml.contains("x-api-key: '***'"), "{yaml}");
    assert!(
        yaml.contains("#   telemetry.otlp.headers.x-api-key\n"),
        "{yaml}"
    );
    // As printed, refused until the value is filled in; filled in, the same file.
    let err = parse(&yaml).unwrap_err().to_string();
    assert!(
        err.starts_with("telemetry.otlp.headers.x-api-key: is '***'"),
        "{err}"
    );
    assert_eq!(parse_ok(&fill_in(&yaml)), with_secrets_filled(config));
}

#[test]
fn check_output_loads_back_to_the_same_configuration() {
    let config = parse_ok(&otlp(
        "    endpoint: http://127.0.0.1:4318\n    sample_ratio: 0.5\n",
    ));
    let yaml = config.to_yaml();
    assert!(yaml.contains("protocol: http/protobuf"), "{yaml}");
    assert_eq!(parse_ok(&yaml), config, "{yaml}");
    let none = parse_ok(MINIMAL);
    assert!(none.to_yaml().contains("telemetry:\n  otlp: null\n"));
}

#[test]
fn bad_values_name_their_key() {
    let cases = [
        ("    protocol: grpc\n", "telemetry.otlp.endpoint", "missing"),
        (
            "    endpoint: https://c:4318\n",
            "telemetry.otlp.endpoint",
            "https is not supported",
        ),
        (
            "    endpoint: ftp://c:4318\n",
            "telemetry.otlp.endpoint",
            "expected http://host:port",
        ),
        (
            "    endpoint: not a url\n",
            "telemetry.otlp.endpoint",
            "not a URL",
        ),
        (
            "    endpoint: http://c:4318/?a=b\n",
            "telemetry.otlp.endpoint",
            "has a query",
        ),
        (
            "    endpoint: http://c\n    protocol: udp\n",
            "telemetry.otlp.protocol",
            "unknown variant 'udp', expected one of http/protobuf, grpc",
        ),
        (
            "    endpoint: http://c\n    sample_ratio: 1.5\n",
            "telemetry.otlp.sample_ratio",
            "expected a number from 0 to 1, found number 1.5",
        ),
        (
            "    endpoint: http://c\n    sample_ratio: often\n",
            "telemetry.otlp.sample_ratio",
            "found string 'often'",
        ),
        (
            "    endpoint: http://c\n    service_name: ' '\n",
            "telemetry.otlp.service_name",
            "is empty",
        ),
        (
            "    endpoint: http://c\n    headers:\n      'bad name': x\n",
            "telemetry.otlp.headers.bad name",
            "invalid HTTP header name",
        ),
        (
            "    endpont: http://c\n",
            "telemetry.otlp.endpont",
            "did you mean 'endpoint'?",
        ),
        ("    endpoint:\n", "telemetry.otlp.endpoint", "has no value"),
    ];
    for (keys, path, says) in cases {
        let message = error_at(&otlp(keys), path);
        assert!(message.contains(says), "{keys}: {message}");
    }
}
