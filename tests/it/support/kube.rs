//! Reading the Kubernetes examples of `deploy/kubernetes/` for `tests/it/kubernetes.rs`:
//! one directory's manifests as objects by kind, the idemgate container's environment
//! (with the Secret's entries resolved), and the config its ConfigMap mounts.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use idemgate::config::Config;
use serde_json::Value;

pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// Every document of one example's manifests, by kind: one object of each.
pub fn objects(dir: &Path) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    for file in yaml_files(dir) {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        for value in docs {
            let kind = value["kind"].as_str().expect("kind").to_owned();
            assert!(
                out.insert(kind.clone(), value).is_none(),
                "{}: one {kind}",
                dir.display()
            );
        }
    }
    out
}

/// The example's workload: its Deployment or its StatefulSet.
pub fn workload(objects: &HashMap<String, Value>) -> &Value {
    match (objects.get("Deployment"), objects.get("StatefulSet")) {
        (Some(w), None) | (None, Some(w)) => w,
        _ => panic!("one Deployment or one StatefulSet"),
    }
}

pub fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

pub fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {v:?}"))
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn seq<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not a list: {v:?}"))
}

pub fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    seq(&pod(workload)["containers"], "containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// What the downward API gives a container for `fieldRef: status.hostIP` here: an address
/// of the documentation range (RFC 5737), never contacted (`--check` starts no exporter).
pub const HOST_IP: &str = "192.0.2.10";

/// The environment the container gets: plain values, the Secret's entries, and the
/// node's address from the downward API.
pub fn container_env(c: &Value, secret: &Value) -> Vec<(String, String)> {
    let secret_name = str_of(&secret["metadata"]["name"], "Secret name");
    c["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .map(|e| {
                    let name = str_of(&e["name"], "env name").to_owned();
                    let field = &e["valueFrom"]["fieldRef"]["fieldPath"];
                    let value = match e.get("value") {
                        Some(v) => str_of(v, "env value").to_owned(),
                        None if field.as_str() == Some("status.hostIP") => HOST_IP.to_owned(),
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
pub fn mounted_config(workload: &Value, configmap: &Value) -> (String, String) {
    let c = container(workload, "idemgate");
    let command = strings(&c["command"]);
    let path = command
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("--config PATH")
        .clone();
    let cm_name = str_of(&configmap["metadata"]["name"], "ConfigMap name");
    let volume = seq(&pod(workload)["volumes"], "volumes")
        .iter()
        .find(|v| v["configMap"]["name"].as_str() == Some(cm_name))
        .expect("a volume of the ConfigMap");
    let mount = seq(&c["volumeMounts"], "volumeMounts")
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

/// One example, read: its objects, the idemgate container's config text and
/// environment, and the config loaded with that environment.
pub struct Example {
    pub objects: HashMap<String, Value>,
    pub text: String,
    pub env: Vec<(String, String)>,
    pub config: Config,
}

impl Example {
    pub fn load(dir: &Path) -> Example {
        let objects = objects(dir);
        let w = workload(&objects);
        let (_, text) = mounted_config(w, &objects["ConfigMap"]);
        let env = container_env(container(w, "idemgate"), &objects["Secret"]);
        let vars: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let config = Config::from_yaml_str(&text, &|k| vars.get(k).map(|v| (*v).to_owned()))
            .unwrap_or_else(|e| panic!("{}: config loads: {e}", dir.display()));
        Example {
            objects,
            text,
            env,
            config,
        }
    }

    pub fn workload(&self) -> &Value {
        workload(&self.objects)
    }

    pub fn secret_values(&self) -> Vec<&str> {
        self.objects["Secret"]["stringData"]
            .as_object()
            .expect("Secret stringData")
            .values()
            .map(|v| str_of(v, "Secret value"))
            .collect()
    }
}

/// `64Mi` and friends in bytes.
pub fn quantity(q: &str) -> u64 {
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
pub fn pre_stop_sleep(c: &Value) -> u64 {
    let cmd = strings(&c["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(cmd.first().map(String::as_str), Some("sleep"), "{cmd:?}");
    cmd[1].parse().expect("seconds")
}

/// The user and group of the image (the Dockerfile's last `USER uid:gid`).
pub fn image_user() -> (u64, u64) {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
            .expect("Dockerfile");
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let (uid, gid) = user.trim().split_once(':').expect("USER uid:gid");
    (uid.parse().expect("uid"), gid.parse().expect("gid"))
}

/// The idemgate container's mount of a PersistentVolumeClaim, and that claim's spec:
/// the claim object through a pod volume, or a StatefulSet's volumeClaimTemplate.
pub fn claim_mount<'a>(example: &'a Example, c: &'a Value) -> (&'a Value, &'a Value) {
    let workload = example.workload();
    let claim = example.objects.get("PersistentVolumeClaim");
    let volumes = pod(workload)["volumes"].as_array();
    let templates = workload["spec"]["volumeClaimTemplates"].as_array();
    let claimed: Vec<(&Value, &Value)> = seq(&c["volumeMounts"], "volumeMounts")
        .iter()
        .filter_map(|m| {
            let volume = volumes
                .into_iter()
                .flatten()
                .find(|v| v["name"] == m["name"]);
            if let Some(v) = volume {
                let pvc = claim?;
                (v["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"])
                    .then_some((m, &pvc["spec"]))
            } else {
                let template = templates
                    .into_iter()
                    .flatten()
                    .find(|t| t["metadata"]["name"] == m["name"])?;
                Some((m, &template["spec"]))
            }
        })
        .collect();
    assert_eq!(claimed.len(), 1, "idemgate mounts one claim");
    claimed[0]
}
