//! The effective configuration as YAML, for `--check`.
//!
//! Everything is printed, defaults included, in SPEC §6 order, so an operator sees
//! what the proxy will actually do; the output parses back to an equal `Config`.

use std::time::Duration;

use http::HeaderName;
use serde_yaml::{Mapping, Value};

use super::units::{self, SizeText};
use super::values::Choice;
use super::{Config, Policy};

pub(super) fn to_yaml(config: &Config) -> String {
    let mut root = Mapping::new();
    put(&mut root, "listen", config.listen.to_string());

    let mut upstream = Mapping::new();
    put(&mut upstream, "url", upstream_url(config));
    put(
        &mut upstream,
        "connect_timeout",
        duration(config.upstream.connect_timeout),
    );
    put(&mut upstream, "timeout", duration(config.upstream.timeout));
    put(&mut root, "upstream", upstream);

    let store = &config.store;
    let mut map = Mapping::new();
    put(&mut map, "kind", store.kind.name());
    match store.redacted_urls().as_slice() {
        [url] => put(&mut map, "url", url.as_str()),
        urls => put(&mut map, "urls", urls.to_vec()),
    }
    put(&mut map, "cluster", store.cluster);
    put(&mut map, "key_prefix", store.key_prefix.as_str());
    put(&mut map, "timeout", duration(store.timeout));
    put(&mut map, "on_unavailable", store.on_unavailable.name());
    put(&mut map, "max_entries", store.max_entries as u64);
    put(&mut root, "store", map);

    put(&mut root, "idempotency", policy(&config.idempotency, None));

    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|route| {
            let mut map = Mapping::new();
            put(&mut map, "path", route.path.as_str());
            if !route.policy.enabled {
                put(&mut map, "enabled", false);
            }
            map.extend(policy(&route.policy, Some(&config.idempotency)));
            Value::Mapping(map)
        })
        .collect();
    put(&mut root, "routes", routes);

    let mut admin = Mapping::new();
    // `null` disables the admin server; omitting the key would re-enable the default.
    let listen = config
        .admin
        .listen
        .map_or(Value::Null, |addr| addr.to_string().into());
    put(&mut admin, "listen", listen);
    put(&mut root, "admin", admin);

    let mut log = Mapping::new();
    put(&mut log, "format", config.log.format.name());
    put(&mut log, "level", config.log.level.as_str());
    put(&mut root, "log", log);

    put(
        &mut root,
        "shutdown_timeout",
        duration(config.shutdown_timeout),
    );

    serde_yaml::to_string(&Value::Mapping(root))
        .unwrap_or_else(|err| format!("# cannot print the configuration: {err}\n"))
}

/// The policy's keys; for a route (`base` given) only those that differ from `base`,
/// since the route inherits the rest.
fn policy(policy: &Policy, base: Option<&Policy>) -> Mapping {
    let mut map = Mapping::new();
    let mut field = |key: &str, differs: bool, value: Value| {
        if base.is_none() || differs {
            map.insert(key.into(), value);
        }
    };
    let b = base.unwrap_or(policy);
    field(
        "header",
        policy.header != b.header,
        title_case(policy.header.as_str()).into(),
    );
    let methods: Vec<&str> = policy.methods.iter().map(|m| m.as_str()).collect();
    field("methods", policy.methods != b.methods, methods.into());
    field(
        "required",
        policy.required != b.required,
        policy.required.into(),
    );
    field("ttl", policy.ttl != b.ttl, duration(policy.ttl));
    field("lease", policy.lease != b.lease, duration(policy.lease));
    field(
        "on_concurrent",
        policy.on_concurrent != b.on_concurrent,
        policy.on_concurrent.name().into(),
    );
    field(
        "wait_timeout",
        policy.wait_timeout != b.wait_timeout,
        duration(policy.wait_timeout),
    );
    field(
        "on_unknown_outcome",
        policy.on_unknown_outcome != b.on_unknown_outcome,
        policy.on_unknown_outcome.name().into(),
    );
    let statuses: Vec<u64> = policy
        .release_statuses
        .iter()
        .map(|s| u64::from(s.as_u16()))
        .collect();
    field(
        "release_statuses",
        policy.release_statuses != b.release_statuses,
        statuses.into(),
    );
    field(
        "scope_headers",
        policy.scope_headers != b.scope_headers,
        headers(&policy.scope_headers),
    );
    field(
        "fingerprint_headers",
        policy.fingerprint_headers != b.fingerprint_headers,
        headers(&policy.fingerprint_headers),
    );
    field(
        "replay_drop_headers",
        policy.replay_drop_headers != b.replay_drop_headers,
        headers(&policy.replay_drop_headers),
    );
    field(
        "max_request_body",
        policy.max_request_body != b.max_request_body,
        size(policy.max_request_body),
    );
    field(
        "max_response_body",
        policy.max_response_body != b.max_response_body,
        size(policy.max_response_body),
    );
    map
}

/// `http://host:port` without the `/` that `Uri` adds for an empty path, as written.
fn upstream_url(config: &Config) -> String {
    let url = &config.upstream.url;
    let authority = url.authority().map_or("", |a| a.as_str());
    let path = url.path().trim_end_matches('/');
    format!("http://{authority}{path}")
}

fn put(map: &mut Mapping, key: &str, value: impl Into<Value>) {
    map.insert(key.into(), value.into());
}

fn duration(d: Duration) -> Value {
    units::format_duration(d).into()
}

fn size(bytes: u64) -> Value {
    match units::format_size(bytes) {
        SizeText::WithUnit(text) => text.into(),
        SizeText::Bytes(n) => n.into(),
    }
}

fn headers(list: &[HeaderName]) -> Value {
    list.iter().map(|h| h.as_str()).collect::<Vec<_>>().into()
}

/// `idempotency-key` -> `Idempotency-Key`: header names are case-insensitive, and this
/// is how SPEC and the IETF draft spell the request header.
fn title_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}
