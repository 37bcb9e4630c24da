//! The Kubernetes sidecar example of `deploy/kubernetes/` (issue 15): every manifest is
//! valid against the Kubernetes schemas, the ConfigMap's configuration passes
//! `idemgate --check` with exactly the environment the container gets, and the
//! Deployment, Service and config agree on ports, paths and shutdown timing.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate::config::{Config, StoreKind};
use serde_yaml::Value;
use support::bin::{TempConfig, idemgate, run};

/// The oldest and the newest Kubernetes whose schemas `kubernetes-validate` ships that
/// the example must work on.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

/// Every document of every manifest, by kind.
fn objects() -> HashMap<String, Value> {
    let mut out = HashMap::new();
    for file in manifests() {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).expect("YAML");
            let kind = value["kind"].as_str().expect("kind").to_owned();
            assert!(out.insert(kind.clone(), value).is_none(), "one {kind}");
        }
    }
    out
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {v:?}"))
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

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The environment the container gets: plain values and the Secret's entries.
fn container_env(c: &Value, secret: &Value) -> Vec<(String, String)> {
    let secret_name = str_of(&secret["metadata"]["name"], "Secret name");
    c["env"]
        .as_sequence()
        .map(|env| {
            env.iter()
                .map(|e| {
                    let name = str_of(&e["name"], "env name").to_owned();
                    let value = match e.get("value") {
                        Some(v) => str_of(v, "env value").to_owned(),
                        None => {
                            let r = &e["valueFrom"]["secretKeyRef"];
                            assert_eq!(str_of(&r["name"], "secretKeyRef.name"), secret_name);
                            let key = str_of(&r["key"], "secretKeyRef.key");
                            str_of(&secret["stringData"][key], "Secret entry").to_owned()
                        }
                    };
                    (name, value)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The ConfigMap's file that the idemgate container's command reads, and its text.
fn mounted_config(deployment: &Value, configmap: &Value) -> (String, String) {
    let c = container(deployment, "idemgate");
    let command = strings(&c["command"]);
    let path = command
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("--config PATH")
        .clone();
    let cm_name = str_of(&configmap["metadata"]["name"], "ConfigMap name");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["configMap"]["name"].as_str() == Some(cm_name))
        .expect("a volume of the ConfigMap");
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the ConfigMap volume is mounted");
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let key = path
        .strip_prefix(&format!("{}/", str_of(&mount["mountPath"], "mountPath")))
        .expect("--config PATH is in the ConfigMap's mount");
    let text = str_of(&configmap["data"][key], "ConfigMap entry").to_owned();
    (path, text)
}

/// `64Mi` and friends in bytes.
fn quantity(q: &str) -> u64 {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = digits.parse().expect("quantity digits");
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("unit {other}"),
    }
}

/// `["sleep", "N"]` of a preStop hook, in seconds.
fn pre_stop_sleep(c: &Value) -> u64 {
    let cmd = strings(&c["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(cmd.first().map(String::as_str), Some("sleep"), "{cmd:?}");
    cmd[1].parse().expect("seconds")
}

#[test]
fn every_manifest_passes_the_kubernetes_schemas() {
    for version in KUBERNETES_VERSIONS {
        let out = std::process::Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(manifests())
            .output()
            .unwrap_or_else(|e| {
                panic!("kubernetes-validate: {e}; scripts/test.sh installs it (pip install kubernetes-validate)")
            });
        assert!(
            out.status.success(),
            "Kubernetes {version}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn the_configmap_config_passes_check_with_the_environment_the_container_gets() {
    let objects = objects();
    let deployment = &objects["Deployment"];
    let (_, text) = mounted_config(deployment, &objects["ConfigMap"]);
    let env = container_env(container(deployment, "idemgate"), &objects["Secret"]);
    let file = TempConfig::new(&text);
    // Only the container's environment: a ${VAR} it lacks must fail here too.
    let out = run(idemgate()
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("--config")
        .arg(file.path())
        .arg("--check"))
    .await;
    assert_eq!(out.code(), Some(0), "idemgate --check: {}", out.stderr);
    assert!(
        out.stdout.lines().any(|l| l == "  kind: redis"),
        "{}",
        out.stdout
    );
}

#[test]
fn the_deployment_puts_idemgate_in_front_of_the_app_and_keeps_it_locked_down() {
    let objects = objects();
    let (deployment, service, secret) = (
        &objects["Deployment"],
        &objects["Service"],
        &objects["Secret"],
    );
    let (_, text) = mounted_config(deployment, &objects["ConfigMap"]);
    let idemgate = container(deployment, "idemgate");
    let app = container(deployment, "app");
    let env: HashMap<String, String> = container_env(idemgate, secret).into_iter().collect();
    let config = Config::from_yaml_str(&text, &|k| env.get(k).cloned()).expect("config loads");
    assert_eq!(
        config.store.kind,
        StoreKind::Redis,
        "replicas share one store"
    );
    assert!(
        text.contains("${REDIS_URL}") && !text.contains("redis://"),
        "the Redis URL and its password come from the Secret only"
    );

    // idemgate's ports are the ones its config listens on, on all interfaces; the app
    // listens on loopback only, where upstream.url points.
    let port = |name: &str| {
        idemgate["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port {name}"))
    };
    let admin = config.admin.listen.expect("admin listener");
    assert!(config.listen.ip().is_unspecified() && admin.ip().is_unspecified());
    assert_eq!(port("http"), u64::from(config.listen.port()));
    assert_eq!(port("admin"), u64::from(admin.port()));
    let app_listen = strings(&app["command"])
        .iter()
        .skip_while(|a| *a != "--listen")
        .nth(1)
        .expect("app --listen")
        .clone();
    let upstream = &config.upstream.url;
    assert_eq!(
        format!(
            "{}:{}",
            upstream.host().expect("host"),
            upstream.port_u16().expect("port")
        ),
        app_listen
    );
    assert!(
        app_listen.starts_with("127.0.0.1:"),
        "the app is reachable only through idemgate"
    );

    // Probes: liveness on /healthz, readiness on /readyz, both on the admin port.
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &idemgate[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some("admin"), "{probe}");
    }

    // Non-root (the image's user), read-only root, no privileges, resources requested.
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
            .expect("Dockerfile");
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    assert_eq!(
        format!(
            "{}:{}",
            pod["securityContext"]["runAsUser"]
                .as_u64()
                .expect("runAsUser"),
            pod["securityContext"]["runAsGroup"]
                .as_u64()
                .expect("runAsGroup")
        ),
        user.trim()
    );
    for c in [idemgate, app] {
        let sc = &c["securityContext"];
        assert_eq!(
            sc["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{:?}",
            c["name"]
        );
        assert_eq!(
            sc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{:?}",
            c["name"]
        );
        assert_eq!(
            strings(&sc["capabilities"]["drop"]),
            ["ALL"],
            "{:?}",
            c["name"]
        );
        for r in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][r].is_string(),
                "{:?} requests {r}",
                c["name"]
            );
        }
    }
    let limit = quantity(str_of(
        &idemgate["resources"]["limits"]["memory"],
        "memory limit",
    ));
    assert!(
        limit >= 2 * config.max_buffered_bytes,
        "max_buffered_bytes ({}) must stay well under the memory limit ({limit})",
        config.max_buffered_bytes
    );

    // The Service selects these pods and targets idemgate's port, never the app's.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_mapping().expect("selector") {
        assert_eq!(&labels[k.as_str().expect("label")], v);
    }
    let targets: Vec<&Value> = service["spec"]["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .map(|p| &p["targetPort"])
        .collect();
    assert_eq!(targets, [&Value::from("http")]);

    // Stopping: idemgate drains for at most shutdown_timeout after its preStop pause, the
    // app outlives that, and the grace period covers both.
    let drained = Duration::from_secs(pre_stop_sleep(idemgate)) + config.shutdown_timeout;
    let app_stops = Duration::from_secs(pre_stop_sleep(app));
    let grace = Duration::from_secs(
        pod["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("grace"),
    );
    assert!(
        drained < app_stops,
        "the app stops before idemgate has drained"
    );
    assert!(
        app_stops < grace,
        "the grace period ends before the app is told to stop"
    );
}
