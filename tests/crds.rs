//! The CRDs: `crds/` equals what the types generate, every upstream property exists in ours with
//! the same rules, and examples and README snippets validate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use karpenter_exoscale::apis::{crd, validation};
use serde_json::Value;

#[path = "support/regenerate.rs"]
mod regenerate;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Upstream CRD YAML, vendored in `tests/upstream-crds` (see its README).
fn upstream_dir() -> PathBuf {
    std::env::var_os("KARPENTER_UPSTREAM_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("tests/upstream-crds"))
}

#[test]
fn committed_crds_match_the_types() {
    let rewrite = regenerate::requested("UPDATE_CRDS");
    let mut stale = Vec::new();
    for (file, definition) in crd::all() {
        let path = repo().join("crds").join(&file);
        let expected = crd::render(&definition);
        if rewrite {
            std::fs::write(&path, &expected).unwrap();
            continue;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        if actual != expected {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "crds/ is stale for {stale:?}; run `UPDATE_CRDS=1 cargo test --test crds`"
    );
}

#[test]
fn helm_chart_ships_the_same_crds() {
    for (file, _) in crd::all() {
        let committed = std::fs::read_to_string(repo().join("crds").join(&file)).unwrap();
        let chart =
            std::fs::read_to_string(repo().join("charts/karpenter-exoscale/crds").join(&file))
                .unwrap_or_default();
        assert_eq!(
            committed, chart,
            "charts/karpenter-exoscale/crds/{file} differs from crds/{file}; copy it over"
        );
    }
}

#[test]
fn crds_command_output_is_the_four_committed_files() {
    let rendered = crd::render_all();
    let mut from_disk = String::new();
    for (file, _) in crd::all() {
        from_disk.push_str(&std::fs::read_to_string(repo().join("crds").join(file)).unwrap());
    }
    assert_eq!(rendered, from_disk);
    assert_eq!(
        rendered.matches("kind: CustomResourceDefinition").count(),
        4
    );
}

/// Flattens a schema into `path -> rules` (everything but descriptions and children).
fn flatten(
    schema: &Value,
    path: String,
    out: &mut BTreeMap<String, serde_json::Map<String, Value>>,
) {
    let Some(map) = schema.as_object() else {
        return;
    };
    let rules = map
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "properties" | "items" | "description" | "additionalProperties"
            )
        })
        .map(|(k, v)| (k.clone(), normalize_number(v)))
        .collect();
    out.insert(path.clone(), rules);
    for (key, child) in map
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        flatten(child, format!("{path}.{key}"), out);
    }
    if let Some(items) = map.get("items") {
        flatten(items, format!("{path}[]"), out);
    }
    if let Some(additional) = map.get("additionalProperties").filter(|v| v.is_object()) {
        flatten(additional, format!("{path}{{}}"), out);
    }
}

fn normalize_number(v: &Value) -> Value {
    match v.as_f64() {
        Some(n) if v.is_number() => serde_json::json!(n),
        _ => v.clone(),
    }
}

fn load_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap()
}

#[test]
fn every_upstream_property_exists_in_ours_with_the_same_rules() {
    let dir = upstream_dir();
    let ours: BTreeMap<String, Value> = crd::all()
        .into_iter()
        .map(|(file, def)| (file, serde_json::to_value(def).unwrap()))
        .collect();
    let mut checked = 0;
    for (file, our_crd) in &ours {
        let upstream = load_yaml(&dir.join(file));
        for key in ["group", "names", "scope"] {
            assert_eq!(
                upstream["spec"][key], our_crd["spec"][key],
                "{file}: spec.{key}"
            );
        }
        let (up_version, our_version) = (
            &upstream["spec"]["versions"][0],
            &our_crd["spec"]["versions"][0],
        );
        for key in [
            "name",
            "served",
            "storage",
            "subresources",
            "additionalPrinterColumns",
        ] {
            assert_eq!(up_version[key], our_version[key], "{file}: version {key}");
        }
        let (mut up_paths, mut our_paths) = (BTreeMap::new(), BTreeMap::new());
        flatten(
            &up_version["schema"]["openAPIV3Schema"],
            String::new(),
            &mut up_paths,
        );
        flatten(
            &our_version["schema"]["openAPIV3Schema"],
            String::new(),
            &mut our_paths,
        );
        for (path, rules) in &up_paths {
            let ours = our_paths
                .get(path)
                .unwrap_or_else(|| panic!("{file}: property {path} is missing"));
            assert_eq!(rules, ours, "{file}: property {path} differs");
            checked += 1;
        }
    }
    assert!(checked > 150, "only {checked} properties compared");
}

/// Every YAML document of a file or a fenced ```yaml block.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn our_kind(doc: &Value) -> bool {
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    api.starts_with("karpenter.sh/") || api.starts_with("karpenter.exoscale.com/")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

#[test]
fn every_example_object_validates() {
    let mut files = Vec::new();
    yaml_files(&repo().join("examples"), &mut files);
    let mut validated = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for doc in documents(&text).iter().filter(|d| our_kind(d)) {
            if let Err(e) = validation::validate_value(doc, None) {
                panic!("{}: {e}", file.display());
            }
            validated += 1;
        }
    }
    assert!(validated >= 6, "only {validated} example objects found");
}

#[test]
fn every_readme_snippet_validates() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut validated = 0;
    for block in readme.split("```yaml").skip(1) {
        let body = block.split("```").next().unwrap();
        for doc in documents(body).iter().filter(|d| our_kind(d)) {
            if let Err(e) = validation::validate_value(doc, None) {
                panic!("README snippet: {e}");
            }
            validated += 1;
        }
    }
    assert!(
        validated >= 2,
        "README has only {validated} NodePool/NodeClass snippets"
    );
}
