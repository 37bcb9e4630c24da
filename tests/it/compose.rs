//! The compose demo, checked without a Docker engine: these tests read it. It must agree
//! with `config/docker.yaml` and with the Dockerfile, and its health checks must work with
//! what the images have (they are run here against live services). The demo itself runs
//! under `scripts/compose-test.sh`, which `.ci/run` calls where a Docker engine answers.

#![allow(dead_code, unreachable_pub)]

use crate::support;

use crate::support::{docker, toy_backend};

use std::path::Path;
use std::time::Duration;

use idemgate::config::{Config, StoreKind};
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose["services"]
        .get(name)
        .unwrap_or_else(|| panic!("service {name} missing"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `host:port` of a `redis://` or `http://` URL.
fn authority(url: &str) -> (String, u16) {
    let rest = url.split_once("://").expect("scheme").1;
    let authority = rest.split('/').next().expect("authority");
    let authority = authority.rsplit('@').next().expect("host");
    let (host, port) = authority.rsplit_once(':').expect("port");
    (host.to_owned(), port.parse().expect("numeric port"))
}

#[test]
fn compose_agrees_with_the_docker_config() {
    let compose: Value =
        serde_saphyr::from_str(&read("docker-compose.yml")).expect("compose parses");
    let config =
        Config::from_yaml_str(&read("config/docker.yaml"), &|_| None).expect("docker.yaml parses");

    // The proxy mounts exactly this file at the path its command reads.
    let idemgate = service(&compose, "idemgate");
    let command = strings(&idemgate["command"]);
    let config_path = command
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("--config PATH")
        .clone();
    let mounts = strings(&idemgate["volumes"]);
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with("./config/docker.yaml:") && m.contains(&config_path)),
        "{mounts:?}"
    );

    // Its upstream is the backend service, on the port the backend listens on.
    let (host, port) = authority(&config.upstream.url.to_string());
    assert_eq!(host, "backend");
    let backend = strings(&service(&compose, "backend")["command"]);
    let listen = backend
        .iter()
        .skip_while(|a| *a != "--listen")
        .nth(1)
        .expect("backend --listen");
    assert_eq!(listen, &format!("0.0.0.0:{port}"));

    // Its store is the redis service, configured not to evict.
    assert_eq!(config.store.kind, StoreKind::Redis);
    let (host, port) = authority(&config.store.urls[0]);
    assert_eq!((host.as_str(), port), ("redis", 6379));
    let redis = strings(&service(&compose, "redis")["command"]);
    assert!(
        redis
            .windows(2)
            .any(|w| w == ["--maxmemory-policy", "noeviction"]),
        "{redis:?}"
    );
    assert!(
        redis.windows(2).any(|w| w == ["--appendonly", "yes"]),
        "{redis:?}"
    );

    // Published ports are the ones idemgate listens on, inside the container on all interfaces.
    let ports = strings(&idemgate["ports"]);
    let published: Vec<&str> = ports
        .iter()
        .map(|p| p.split('#').next().unwrap_or(p).trim())
        .collect();
    assert_eq!(config.listen.to_string(), "0.0.0.0:8080");
    assert!(published.contains(&"8080:8080"), "{published:?}");
    let admin = config.admin.listen.expect("admin enabled");
    assert_eq!(admin.to_string(), "0.0.0.0:9901");
    assert!(published.contains(&"9901:9901"), "{published:?}");

    // Every service has a health check, and idemgate waits for healthy dependencies.
    for name in ["redis", "backend", "idemgate"] {
        assert!(
            service(&compose, name)["healthcheck"]["test"].is_array(),
            "{name} has no healthcheck"
        );
    }
    for dep in ["redis", "backend"] {
        assert_eq!(
            idemgate["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy")
        );
    }

    // `docker compose stop` waits longer than idemgate drains before it kills it.
    let grace = idemgate["stop_grace_period"]
        .as_str()
        .and_then(|g| g.strip_suffix('s'))
        .and_then(|g| g.parse::<u64>().ok())
        .expect("idemgate's stop_grace_period, in seconds");
    assert!(
        Duration::from_secs(grace) > config.shutdown_timeout,
        "stop_grace_period {grace}s does not outlast shutdown_timeout {:?}",
        config.shutdown_timeout
    );
}

#[test]
fn the_image_runs_as_a_non_root_user_and_ships_both_binaries() {
    let dockerfile = read("Dockerfile");
    let stages = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(stages >= 2, "multi-stage build");
    let user = dockerfile
        .lines()
        .rev()
        .find(|l| l.starts_with("USER "))
        .expect("USER line");
    assert!(!user.contains("root") && user.trim() != "USER 0", "{user}");
    assert!(dockerfile.contains("--bin idemgate") && dockerfile.contains("--example toy_backend"));
    // The default command reads the same config compose mounts.
    assert!(dockerfile.contains("/etc/idemgate/docker.yaml"));
}

/// The services that docker-compose.yml builds from the Dockerfile.
fn built_here(compose: &Value) -> Vec<(String, &Value)> {
    compose["services"]
        .as_object()
        .expect("services")
        .iter()
        .filter(|(_, svc)| svc["build"].as_str() == Some("."))
        .map(|(name, svc)| (name.clone(), svc))
        .collect()
}

#[test]
fn the_services_built_here_run_read_only_as_non_root_without_capabilities() {
    let compose: Value =
        serde_saphyr::from_str(&read("docker-compose.yml")).expect("compose parses");
    let built = built_here(&compose);
    assert_eq!(built.len(), 2, "backend and idemgate");
    for (name, svc) in built {
        assert_eq!(svc["read_only"].as_bool(), Some(true), "{name}: read_only");
        assert!(
            strings(&svc["tmpfs"]).contains(&"/tmp".to_owned()),
            "{name}: tmpfs /tmp"
        );
        assert_eq!(strings(&svc["cap_drop"]), ["ALL"], "{name}: cap_drop");
        assert!(
            strings(&svc["security_opt"]).contains(&"no-new-privileges:true".to_owned()),
            "{name}: no-new-privileges"
        );
        // The image's non-root USER applies; compose must not override it.
        assert!(
            svc.get("user").is_none(),
            "{name} overrides the image's user"
        );
    }
}

/// The bash builtins a health check may use: the Debian base has bash (an Essential
/// package, in every Debian image), and nothing else may be assumed of it (no curl, no
/// wget: `apt-cache show curl wget` says optional and standard, not in -slim images).
const BASH_BUILTINS: [&str; 7] = ["exec", "printf", "read", "[", "test", "echo", "true"];

/// What the images compose pulls ship, for their health checks.
const PULLED_IMAGES_HAVE: [(&str, &str); 1] = [("redis", "redis-cli")];

/// The first word of each command of a shell script (split at `&&`, `||`, `;` and `|`;
/// a redirection such as `>&3` stays inside its command).
fn commands(script: &str) -> Vec<String> {
    script
        .split("&&")
        .flat_map(|c| c.split("||"))
        .flat_map(|c| c.split([';', '|']))
        .filter_map(|c| c.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn health_checks_call_only_what_their_images_have() {
    let compose: Value =
        serde_saphyr::from_str(&read("docker-compose.yml")).expect("compose parses");
    let stages = docker::stages(&read("Dockerfile"));
    let last = stages.last().expect("final stage");
    assert!(
        last.image.starts_with("debian:") && last.image.ends_with("-slim"),
        "the health checks below rely on a Debian base, not {}",
        last.image
    );
    // The programs the Dockerfile puts into the image, by file name.
    let copied: Vec<String> = last
        .all("COPY")
        .map(docker::Copy::parse)
        .filter(|c| c.from.is_some() && c.dest.starts_with("/usr/local/bin"))
        .flat_map(|c| c.sources)
        .filter_map(|s| s.rsplit('/').next().map(str::to_owned))
        .collect();
    assert!(copied.contains(&"idemgate".to_owned()), "{copied:?}");

    for (name, svc) in compose["services"].as_object().expect("services") {
        let name = name.as_str();
        if svc.get("healthcheck").is_none() {
            // Only a service nobody waits on to be healthy may go without one.
            let awaited = compose["services"]
                .as_object()
                .expect("services")
                .values()
                .any(|other| {
                    other["depends_on"][name]["condition"].as_str() == Some("service_healthy")
                });
            assert!(!awaited, "{name} is waited on but has no health check");
            continue;
        }
        let test = strings(&svc["healthcheck"]["test"]);
        assert_eq!(
            test.first().map(String::as_str),
            Some("CMD"),
            "{name}: exec form"
        );
        let program = &test[1];
        if svc["build"].as_str() == Some(".") {
            if program == "bash" {
                assert_eq!(test[2], "-c", "{name}");
                for command in commands(&test[3]) {
                    assert!(
                        BASH_BUILTINS.contains(&command.as_str()),
                        "{name}: the health check runs {command}, which the image may lack"
                    );
                }
            } else {
                assert!(
                    copied.contains(program),
                    "{name}: {program} is not in the image"
                );
            }
        } else {
            let image = svc["image"].as_str().expect("image");
            let repo = image.split(':').next().unwrap_or(image);
            assert!(
                PULLED_IMAGES_HAVE.contains(&(repo, program.as_str())),
                "{name}: nothing says {image} has {program}"
            );
        }
    }
}

/// Runs a compose health check (`CMD bash -c SCRIPT`) with local bash, aimed at `port`
/// and `path` instead of the ones it names; `$$` is compose's escape for `$`.
async fn run_health_check(test: &[String], from: (&str, &str), to: (u16, &str)) -> bool {
    let script = test[3]
        .replace("$$", "$")
        .replace(&format!("/{}", from.0), &format!("/{}", to.0))
        .replace(from.1, to.1);
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .status(),
    )
    .await
    .expect("the health check ended")
    .expect("run bash");
    status.success()
}

#[tokio::test]
async fn health_checks_pass_against_live_services_and_fail_otherwise() {
    let compose: Value =
        serde_saphyr::from_str(&read("docker-compose.yml")).expect("compose parses");
    let backend_check = strings(&service(&compose, "backend")["healthcheck"]["test"]);
    let idemgate_check = strings(&service(&compose, "idemgate")["healthcheck"]["test"]);
    assert!(backend_check[3].contains("127.0.0.1/9000") && backend_check[3].contains("/healthz"));
    assert!(idemgate_check[3].contains("127.0.0.1/9901") && idemgate_check[3].contains("/readyz"));

    // The toy backend, in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend_port = listener.local_addr().expect("addr").port();
    let backend = tokio::spawn(toy_backend::serve(listener, std::future::pending()));
    // idemgate's admin listener, in this process, on the memory store (always ready).
    let upstream = support::Upstream::start().await;
    let proxy = support::Proxy::start(support::BASIC, &upstream).await;
    let admin_port = proxy.admin().await.addr().port();

    assert!(
        run_health_check(
            &backend_check,
            ("9000", "/healthz"),
            (backend_port, "/healthz")
        )
        .await
    );
    assert!(
        run_health_check(
            &idemgate_check,
            ("9901", "/readyz"),
            (admin_port, "/readyz")
        )
        .await
    );
    // Anything but 200 fails the check, and so does a closed port.
    assert!(!run_health_check(&idemgate_check, ("9901", "/readyz"), (admin_port, "/nope")).await);
    let closed = support::bin::free_port();
    assert!(!run_health_check(&backend_check, ("9000", "/healthz"), (closed, "/healthz")).await);

    backend.abort();
    proxy.stop().await;
}

/// The file store in a container: its directory outlives the container
/// (docs/behaviour.md §12).
#[test]
fn the_image_declares_the_file_stores_directory_as_a_volume() {
    let dockerfile = read("Dockerfile");
    let file: serde_json::Value =
        serde_saphyr::from_str(&read("config/file.yaml")).expect("config/file.yaml is YAML");
    let path = file["store"]["path"].as_str().expect("store.path");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("VOLUME {path}")),
        "the Dockerfile declares VOLUME {path}"
    );
    // Owned by the image's user, so that a fresh volume there is writable.
    assert!(dockerfile.contains(&format!("--chown=10001:10001 {path} {path}")));
}

/// The demo's OpenTelemetry Collector (docs/behaviour.md §20): a pinned image, reading the
/// config the compose file mounts, which receives OTLP where config/docker.yaml sends it
/// and prints traces with the `debug` exporter.
#[test]
fn the_collector_receives_idemgates_spans_where_docker_yaml_sends_them() {
    let compose: Value =
        serde_saphyr::from_str(&read("docker-compose.yml")).expect("compose parses");
    let collector = service(&compose, "otel-collector");
    let image = collector["image"].as_str().expect("image");
    let (repo, tag) = image.split_once(':').expect("a tag");
    assert_eq!(repo, "otel/opentelemetry-collector");
    assert!(
        tag.split('.').count() == 3 && tag.split('.').all(|n| n.parse::<u32>().is_ok()),
        "pinned by version, not {tag}"
    );

    // It reads the file mounted at the path its --config names.
    let config_path = strings(&collector["command"])
        .iter()
        .find_map(|a| a.strip_prefix("--config=").map(str::to_owned))
        .expect("--config=PATH");
    let mounts = strings(&collector["volumes"]);
    let mounted = mounts
        .iter()
        .find_map(|m| {
            let (from, rest) = m.split_once(':')?;
            (rest.split(':').next() == Some(config_path.as_str())).then(|| from.to_owned())
        })
        .expect("the config is mounted");
    let otel: Value =
        serde_saphyr::from_str(&read(mounted.trim_start_matches("./"))).expect("collector config");

    // Traces: OTLP in, debug out.
    let traces = &otel["service"]["pipelines"]["traces"];
    assert!(
        strings(&traces["receivers"]).contains(&"otlp".to_owned()),
        "{traces:?}"
    );
    assert!(
        strings(&traces["exporters"]).contains(&"debug".to_owned()),
        "{traces:?}"
    );
    assert!(
        otel["exporters"]["debug"].is_object(),
        "the debug exporter is defined"
    );
    for processor in strings(&traces["processors"]) {
        assert!(
            otel["processors"].get(processor.as_str()).is_some(),
            "{processor}"
        );
    }

    // idemgate sends where the collector listens, by the service's name.
    let config =
        Config::from_yaml_str(&read("config/docker.yaml"), &|_| None).expect("docker.yaml parses");
    let otlp = config.telemetry.otlp.expect("docker.yaml exports traces");
    let (host, port) = authority(&otlp.endpoint.to_string());
    assert_eq!(host, "otel-collector");
    let protocol = match otlp.protocol {
        idemgate::config::OtlpProtocol::HttpProtobuf => "http",
        idemgate::config::OtlpProtocol::Grpc => "grpc",
    };
    let listens = otel["receivers"]["otlp"]["protocols"][protocol]["endpoint"]
        .as_str()
        .expect("the receiver's endpoint");
    assert_eq!(listens, format!("0.0.0.0:{port}"));
    // idemgate starts after it, without waiting for health it cannot report.
    assert_eq!(
        service(&compose, "idemgate")["depends_on"]["otel-collector"]["condition"].as_str(),
        Some("service_started")
    );
}
