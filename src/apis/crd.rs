//! CustomResourceDefinitions generated from the types, rendered as the YAML kept in `crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::{ExoscaleNodeClass, NodeClaim, NodeOverlay, NodePool};

/// File name in `crds/` and the CRD itself, for every CRD this project serves.
pub fn all() -> Vec<(String, CustomResourceDefinition)> {
    [
        NodePool::crd(),
        NodeClaim::crd(),
        NodeOverlay::crd(),
        ExoscaleNodeClass::crd(),
    ]
    .into_iter()
    .map(|crd| {
        let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
        (file, normalize(crd))
    })
    .collect()
}

/// The generated CRDs as one multi-document YAML stream (what `karpenter-exoscale crds` prints).
pub fn render_all() -> String {
    all()
        .iter()
        .map(|(_, crd)| render(crd))
        .collect::<Vec<_>>()
        .join("")
}

/// One CRD as a YAML document with a leading `---`.
pub fn render(crd: &CustomResourceDefinition) -> String {
    let mut value = serde_json::to_value(crd).expect("a CRD always serialises");
    integral_bounds(&mut value);
    let yaml = serde_yaml_ng::to_string(&value).expect("a CRD always serialises");
    format!("---\n{yaml}")
}

/// `JSONSchemaProps` holds bounds as floats; write `100`, not `100.0`, as upstream does.
fn integral_bounds(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for bound in ["minimum", "maximum"] {
                let integral = map
                    .get(bound)
                    .and_then(Value::as_f64)
                    .filter(|n| n.fract() == 0.0);
                if let Some(n) = integral {
                    map.insert(bound.into(), json!(n as i64));
                }
            }
            map.values_mut().for_each(integral_bounds);
        }
        Value::Array(items) => items.iter_mut().for_each(integral_bounds),
        _ => {}
    }
}

/// Post-processing the derive cannot express: our Option fields are never serialised as null,
/// so `nullable` is dropped to keep the schema identical to upstream's.
/// kube-derive empties the branches of int-or-string `anyOf`s; upstream keeps their types. The
/// root also gets the `apiVersion`/`kind`/`metadata` properties and `listKind` upstream has.
fn normalize(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crd.spec.names.list_kind = Some(format!("{}List", crd.spec.names.kind));
    let mut value = serde_json::to_value(&crd).expect("a CRD always serialises");
    for version in value["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let root = &mut version["schema"]["openAPIV3Schema"];
        normalize_schema(root);
        let root = root.as_object_mut().expect("root schema is an object");
        root.remove("title");
        let properties = root["properties"]
            .as_object_mut()
            .expect("root has properties");
        properties.insert(
            "apiVersion".into(),
            json!({"type": "string",
            "description": "Versioned schema of this representation of an object."}),
        );
        properties.insert(
            "kind".into(),
            json!({"type": "string",
            "description": "REST resource this object represents."}),
        );
        properties.insert("metadata".into(), json!({"type": "object"}));
    }
    serde_json::from_value(value).expect("normalised CRD still deserialises")
}

fn normalize_schema(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                map.insert(
                    "anyOf".into(),
                    json!([{"type": "integer"}, {"type": "string"}]),
                );
            }
            map.values_mut().for_each(normalize_schema);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_schema),
        _ => {}
    }
}

/// The `openAPIV3Schema` of a generated CRD as JSON.
pub fn schema_of(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema).expect("schema serialises")
}
