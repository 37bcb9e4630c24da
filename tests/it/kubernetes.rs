//! The Kubernetes sidecar examples of `deploy/kubernetes/` (issue 15): the Redis variant
//! in that directory and the file-store variant in `file-store/` below it. Every
//! manifest is valid against the Kubernetes schemas; each ConfigMap's configuration
//! passes `idemgate --check` with exactly the environment the container gets, its
//! credentials coming from the Secret only; and each Deployment, Service and config agree
//! on ports, paths and shutdown timing. The file-store variant also keeps its one store
//! to one pod.

use crate::support;

use crate::support::kube;

use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate::config::StoreKind;
use kube::{
    Example, claim_mount, container, image_user, pod, pre_stop_sleep, quantity, seq, str_of,
    strings, yaml_files,
};
use serde_json::Value;
use support::bin::{TempConfig, idemgate, run};

/// The oldest and the newest Kubernetes whose schemas `kubernetes-validate` ships that
/// the examples must work on.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

/// The environment variable, set from the Secret, that `admin.token` reads.
const TOKEN_VAR: &str = "IDEMGATE_ADMIN_TOKEN";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn redis_variant() -> PathBuf {
    root()
}

fn file_variant() -> PathBuf {
    root().join("file-store")
}

/// Every example: `deploy/kubernetes/` and each directory below it, so that a new
/// variant is validated and checked without being named here.
fn examples() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.insert(0, root());
    for dir in &dirs {
        assert!(
            !yaml_files(dir).is_empty(),
            "{}: no manifest",
            dir.display()
        );
    }
    assert!(dirs.contains(&file_variant()), "{dirs:?}");
    dirs
}

#[test]
fn every_manifest_passes_the_kubernetes_schemas() {
    let files: Vec<PathBuf> = examples().iter().flat_map(|d| yaml_files(d)).collect();
    for version in KUBERNETES_VERSIONS {
        let out = std::process::Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(&files)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "kubernetes-validate: {e}; scripts/test.sh installs it into target/tools-venv"
                )
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
async fn every_configmap_config_passes_check_with_the_environment_the_container_gets() {
    for dir in examples() {
        let example = Example::load(&dir);
        // A file store's path is the mounted volume, which does not exist here: a fresh
        // directory stands in for it (an empty claim), so --check tests that it is
        // writable the way it would in the pod.
        let volume = tempfile::tempdir().expect("temp dir");
        let text = if example.config.store.kind == StoreKind::File {
            let line = format!("path: {}", example.config.store.path.display());
            assert_eq!(example.text.matches(&line).count(), 1, "{line}");
            example
                .text
                .replace(&line, &format!("path: {}", volume.path().display()))
        } else {
            example.text.clone()
        };
        let file = TempConfig::new(&text);
        // Only the container's environment: a ${VAR} it lacks must fail here too.
        let out = run(idemgate()
            .env_clear()
            .envs(example.env.iter().map(|(k, v)| (k, v)))
            .arg("--config")
            .arg(file.path())
            .arg("--check"))
        .await;
        let at = dir.display();
        assert_eq!(
            out.code(),
            Some(0),
            "{at}: idemgate --check: {}",
            out.stderr
        );
        // The token is shown as set, never printed; nor is any other Secret value.
        assert!(
            out.stdout.lines().any(|l| l == "  token: '***'"),
            "{at}: {}",
            out.stdout
        );
        for value in example.secret_values() {
            assert!(
                !out.stdout.contains(value) && !out.stderr.contains(value),
                "{at}: --check printed a Secret value"
            );
        }
        assert_eq!(
            std::fs::read_dir(volume.path()).expect("volume").count(),
            0,
            "{at}: --check leaves nothing in the store's directory"
        );
    }
}

/// What both variants keep: the admin token comes from the Secret only; idemgate fronts the app, which listens on loopback; probes on the admin port; non-root,
/// read-only root, no privileges, resources requested; the Service targets idemgate;
/// idemgate drains before the app stops.
fn assert_sidecar_in_front_of_the_app_and_locked_down(example: &Example) {
    let (objects, config, text) = (&example.objects, &example.config, &example.text);
    let (workload, service, secret) = (example.workload(), &objects["Service"], &objects["Secret"]);
    let idemgate = container(workload, "idemgate");
    let app = container(workload, "app");

    // The admin token comes from the Secret, through the environment, and only from it.
    let raw: Value = serde_saphyr::from_str(text).expect("config YAML");
    assert_eq!(
        raw["admin"]["token"].as_str(),
        Some(format!("${{{TOKEN_VAR}}}").as_str()),
        "admin.token is the Secret's, through ${{{TOKEN_VAR}}}"
    );
    let token = str_of(&secret["stringData"][TOKEN_VAR], "the Secret's token");
    assert!(!text.contains(token), "no literal token in the config");
    let token_env = seq(&idemgate["env"], "env")
        .iter()
        .find(|e| e["name"].as_str() == Some(TOKEN_VAR))
        .expect("the token's env entry");
    assert!(
        token_env.get("value").is_none(),
        "the token is not an env value"
    );
    assert_eq!(
        token_env["valueFrom"]["secretKeyRef"]["key"].as_str(),
        Some(TOKEN_VAR)
    );
    assert_eq!(
        config.admin.token.as_ref().map(|t| t.expose()),
        Some(token),
        "/keys on a non-loopback admin listener answers 403 without a token"
    );

    // idemgate's ports are the ones its config listens on, on all interfaces; the app
    // listens on loopback only, where upstream.url points.
    let port = |name: &str| {
        seq(&idemgate["ports"], "ports")
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

    // Probes: liveness (and startup, if any) on /healthz, readiness on /readyz, on the
    // admin port.
    let mut probes = vec![("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")];
    if idemgate.get("startupProbe").is_some() {
        probes.push(("startupProbe", "/healthz"));
    }
    for (probe, path) in probes {
        let get = &idemgate[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some("admin"), "{probe}");
    }

    // Non-root (the image's user), read-only root, no privileges, resources requested.
    let pod = pod(workload);
    let sc = &pod["securityContext"];
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));
    let (uid, gid) = image_user();
    assert_eq!(sc["runAsUser"].as_u64(), Some(uid), "the image's user");
    assert_eq!(sc["runAsGroup"].as_u64(), Some(gid), "the image's group");
    for c in [idemgate, app] {
        let name = &c["name"];
        let sc = &c["securityContext"];
        assert_eq!(
            sc["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{name:?}"
        );
        assert_eq!(
            sc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{name:?}"
        );
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{name:?}");
        for r in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][r].is_string(),
                "{name:?} requests {r}"
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
    // `workers: auto` follows a CPU limit; without one it would follow the node's CPUs.
    if idemgate["resources"]["limits"]["cpu"].is_null() {
        assert!(
            matches!(config.workers, idemgate::config::Workers::Count(_)),
            "no CPU limit: the config must name its workers, not {:?}",
            config.workers
        );
    }

    // The Service selects these pods and targets idemgate's port, never the app's.
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&labels[k.as_str()], v);
    }
    let targets: Vec<&Value> = seq(&service["spec"]["ports"], "ports")
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

#[test]
fn the_redis_variant_puts_idemgate_in_front_of_the_app_and_keeps_it_locked_down() {
    let example = Example::load(&redis_variant());
    assert_sidecar_in_front_of_the_app_and_locked_down(&example);
    assert_eq!(
        example.config.store.kind,
        StoreKind::Redis,
        "replicas share one store"
    );
    assert!(
        example.text.contains("${REDIS_URL}") && !example.text.contains("redis://"),
        "the Redis URL and its password come from the Secret only"
    );
    // Traces go to the collector agent on the pod's own node (docs/behaviour.md §20).
    let otlp = example
        .config
        .telemetry
        .otlp
        .as_ref()
        .expect("the example exports traces");
    assert!(example.text.contains("endpoint: http://${NODE_IP}:4318"));
    assert_eq!(
        otlp.traces_url(),
        format!("http://{}:4318/v1/traces", support::kube::HOST_IP)
    );
    assert_eq!(otlp.protocol, idemgate::config::OtlpProtocol::HttpProtobuf);
    assert!((0.0..=1.0).contains(&otlp.sample_ratio));
}

#[test]
fn the_file_variant_keeps_its_one_store_to_one_pod() {
    let example = Example::load(&file_variant());
    assert_sidecar_in_front_of_the_app_and_locked_down(&example);
    let (config, workload) = (&example.config, example.workload());
    assert_eq!(config.store.kind, StoreKind::File);
    assert!(
        config.store.fsync,
        "fsync: keys survive the node's power loss"
    );

    // The store's directory is the claim, mounted read-write; the claim attaches to one
    // node at a time.
    let idemgate = container(workload, "idemgate");
    let (mount, claim) = claim_mount(&example, idemgate);
    assert_eq!(
        Path::new(str_of(&mount["mountPath"], "mountPath")),
        config.store.path,
        "store.path is the claim's mount"
    );
    assert_ne!(
        mount["readOnly"].as_bool(),
        Some(true),
        "the store is written"
    );
    let modes = strings(&claim["accessModes"]);
    assert!(
        !modes.is_empty()
            && modes
                .iter()
                .all(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod"),
        "{modes:?}"
    );

    // One pod: a retry on another pod would not find its key. An update stops the old
    // pod (releasing the store's lock) before starting the new one.
    assert_eq!(
        workload["spec"]["replicas"].as_u64(),
        Some(1),
        "replicas: 1"
    );
    if workload["kind"].as_str() == Some("Deployment") {
        assert_eq!(
            workload["spec"]["strategy"]["type"].as_str(),
            Some("Recreate"),
            "a rolling update would start the new pod beside the old one"
        );
    }

    // The volume is writable by the image's group; the root file system stays read-only
    // (checked with the rest above), so the store writes only on the volume.
    let (_, gid) = image_user();
    assert_eq!(
        pod(workload)["securityContext"]["fsGroup"].as_u64(),
        Some(gid),
        "fsGroup: the image's group"
    );
}
