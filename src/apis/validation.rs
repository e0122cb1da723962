//! Validation of objects against the generated CRD schemas, as an apiserver would do it:
//! defaults, then OpenAPI rules (types, enums, patterns, bounds, required and unknown fields),
//! then CEL rules (`x-kubernetes-validations`, through kube-cel). Used by `simulate`, by the
//! controllers before acting on an object, and by the tests.

use std::collections::{BTreeSet, HashMap};
use std::sync::{LazyLock, Mutex};

use kube::core::cel::{CompiledSchema, Validator, apply_defaults, compile_schema};
use regex::Regex;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use super::crd;

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path such as `spec.template.spec.requirements[0].key` (empty for the whole object).
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("object has no apiVersion/kind")]
    MissingTypeMeta,
    #[error("{0} is not a kind this project serves")]
    UnknownKind(String),
    #[error("{kind} {name:?} is invalid: {}", join(.errors))]
    Invalid {
        kind: String,
        name: String,
        errors: Vec<FieldError>,
    },
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ValidationError {
    /// The field errors, empty for errors about the object as a whole.
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            ValidationError::Invalid { errors, .. } => errors,
            _ => &[],
        }
    }
}

struct KindSchema {
    schema: Value,
    compiled: CompiledSchema,
}

struct Registry {
    by_kind: HashMap<(String, String), KindSchema>,
    cel: Validator,
}

// The registry is built once: compiling the CEL rules of four CRDs is not free.
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    let mut by_kind = HashMap::new();
    for (_, crd) in crd::all() {
        for version in &crd.spec.versions {
            let schema = serde_json::to_value(
                version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref()),
            )
            .expect("schema serialises");
            let compiled = compile_schema(&schema);
            let api_version = format!("{}/{}", crd.spec.group, version.name);
            by_kind.insert(
                (api_version, crd.spec.names.kind.clone()),
                KindSchema { schema, compiled },
            );
        }
    }
    Mutex::new(Registry {
        by_kind,
        cel: Validator::new(),
    })
});

/// Validates an object of one of our kinds (create, or update when `old` is given) and returns it
/// with schema defaults applied.
pub fn validate_value(value: &Value, old: Option<&Value>) -> Result<Value, ValidationError> {
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    let kind = value.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (api_version, kind) else {
        return Err(ValidationError::MissingTypeMeta);
    };
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let registry = REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let entry = registry
        .by_kind
        .get(&(api_version.to_string(), kind.to_string()))
        .ok_or_else(|| ValidationError::UnknownKind(format!("{api_version}/{kind}")))?;

    let defaulted = apply_defaults(&entry.schema, value);
    let mut errors = Vec::new();
    check_openapi(&entry.schema, &defaulted, "", &mut errors);
    if errors.is_empty() {
        // CEL rules assume a structurally valid object, as on an apiserver.
        let old = old.map(|o| apply_defaults(&entry.schema, o));
        if let Err(cel_errors) =
            registry
                .cel
                .validate_compiled(&entry.compiled, &defaulted, old.as_ref())
        {
            errors.extend(cel_errors.iter().map(|e| FieldError {
                path: e.field_path.clone(),
                message: e.message.clone(),
            }));
        }
    }
    if errors.is_empty() {
        Ok(defaulted)
    } else {
        Err(ValidationError::Invalid {
            kind: kind.to_string(),
            name,
            errors,
        })
    }
}

/// Validates an object and deserialises it into its Rust type.
pub fn parse<K: DeserializeOwned>(value: &Value) -> Result<K, ValidationError> {
    let defaulted = validate_value(value, None)?;
    deserialize_with_path(&defaulted).map_err(|error| ValidationError::Invalid {
        kind: value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        name: value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        errors: vec![error],
    })
}

/// Deserialises JSON into `K`, naming the field that failed.
pub fn deserialize_with_path<K: DeserializeOwned>(value: &Value) -> Result<K, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| FieldError {
        path: e.path().to_string().trim_start_matches('.').to_string(),
        message: e.inner().to_string(),
    })
}

fn regex_matches(pattern: &str, text: &str) -> bool {
    static CACHE: LazyLock<Mutex<HashMap<String, Option<Regex>>>> = LazyLock::new(Default::default);
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let compiled = cache
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok());
    // A pattern Rust's engine cannot compile is treated as passing; CEL and runtime checks remain.
    compiled.as_ref().is_none_or(|re| re.is_match(text))
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// The OpenAPI v3 subset CRD structural schemas use.
fn check_openapi(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let mut fail = |message: String| {
        errors.push(FieldError {
            path: path.to_string(),
            message,
        })
    };
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        match value {
            Value::Number(n) if n.is_i64() || n.is_u64() => {}
            Value::String(s) => {
                if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                    && !regex_matches(pattern, s)
                {
                    fail(format!("invalid quantity {s:?}"));
                }
            }
            other => fail(format!(
                "must be an integer or a string, got {}",
                describe(other)
            )),
        }
        return;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Value::Object(map) = value else {
                return fail(format!("must be an object, got {}", describe(value)));
            };
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(key) = required.as_str()
                    && !map.contains_key(key)
                {
                    errors.push(FieldError {
                        path: child(path, key),
                        message: "required field is missing".into(),
                    });
                }
            }
            if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
                && map.len() as u64 > max
            {
                errors.push(FieldError {
                    path: path.into(),
                    message: format!("must have at most {max} entries"),
                });
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve =
                schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            for (key, item) in map {
                let item_path = child(path, key);
                if let Some(sub) = properties.and_then(|p| p.get(key)) {
                    check_openapi(sub, item, &item_path, errors);
                } else if let Some(sub) = additional.filter(|a| a.is_object()) {
                    check_openapi(sub, item, &item_path, errors);
                } else if properties.is_some() && !preserve {
                    errors.push(FieldError {
                        path: item_path,
                        message: "unknown field".into(),
                    });
                }
            }
        }
        Some("array") => {
            let Value::Array(items) = value else {
                return fail(format!("must be a list, got {}", describe(value)));
            };
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                fail(format!(
                    "must have at most {max} items, has {}",
                    items.len()
                ));
            }
            if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
                let unique: BTreeSet<String> = items.iter().map(Value::to_string).collect();
                if unique.len() != items.len() {
                    fail("must not contain duplicates".into());
                }
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_openapi(item_schema, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Some("string") => {
            let Value::String(s) = value else {
                return fail(format!("must be a string, got {}", describe(value)));
            };
            if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
                && !allowed.iter().any(|a| a.as_str() == Some(s))
            {
                let names: Vec<String> = allowed.iter().map(describe).collect();
                return fail(format!(
                    "unsupported value {s:?}: must be one of {}",
                    names.join(", ")
                ));
            }
            let len = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                fail(format!("must be at most {max} characters"));
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                fail(format!("must be at least {min} characters"));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                && !regex_matches(pattern, s)
            {
                fail(format!("invalid value {s:?}: must match {pattern}"));
            }
        }
        Some(kind @ ("integer" | "number")) => {
            let number = value
                .as_f64()
                .filter(|_| kind == "number" || value.is_i64() || value.is_u64());
            let Some(n) = number else {
                return fail(format!("must be an {kind}, got {}", describe(value)));
            };
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && n < min
            {
                fail(format!("must be greater than or equal to {min}, got {n}"));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && n > max
            {
                fail(format!("must be less than or equal to {max}, got {n}"));
            }
        }
        Some("boolean") if !value.is_boolean() => {
            fail(format!("must be a boolean, got {}", describe(value)))
        }
        _ => {}
    }
}
