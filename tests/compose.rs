//! No Docker engine runs on the development machines, so the compose demo is checked
//! by reading it: it must agree with `config/docker.yaml` and with the Dockerfile.

use std::path::Path;

use idemgate::config::{Config, StoreKind};
use serde_yaml::Value;

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
    v.as_sequence()
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
    let compose: Value = serde_yaml::from_str(&read("docker-compose.yml")).expect("compose parses");
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
            service(&compose, name)["healthcheck"]["test"].is_sequence(),
            "{name} has no healthcheck"
        );
    }
    for dep in ["redis", "backend"] {
        assert_eq!(
            idemgate["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy")
        );
    }
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

/// SPEC §12 in a container: the file store's directory outlives the container.
#[test]
fn the_image_declares_the_file_stores_directory_as_a_volume() {
    let dockerfile = read("Dockerfile");
    let file: serde_yaml::Value =
        serde_yaml::from_str(&read("config/file.yaml")).expect("config/file.yaml is YAML");
    let path = file["store"]["path"].as_str().expect("store.path");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("VOLUME {path}")),
        "the Dockerfile declares VOLUME {path}"
    );
    assert!(dockerfile.contains(&format!("chown 10001 {path}")));
}
