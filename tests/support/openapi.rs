//! Checks recorded Exoscale API exchanges against the official OpenAPI document
//! (`tests/exoscale-openapi.json`, vendored from the reference notes): the operation exists for
//! the method and path, path and query parameters are declared and well-typed, the request body
//! matches the operation's schema (no field the schema lacks), a 2xx
//! status is one the operation declares and its body matches the declared schema. Error answers
//! the simulated API makes (not injected faults) must have one of the documented error shapes.
//!
//! Stricter than the document in one way, on purpose: an object property the schema does not
//! list is an error even where OpenAPI would allow it, in requests (the real API may refuse it)
//! and in answers (the client must not come to depend on a field the real API never sends).

#![allow(dead_code)]

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use karpenter_exoscale::sim::Exchange;

static SPEC: LazyLock<Value> = LazyLock::new(|| {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/exoscale-openapi.json"
    ))
    .expect("the vendored OpenAPI document");
    serde_json::from_str(&text).expect("the OpenAPI document is JSON")
});

struct Operation {
    method: String,
    template: String,
    path: Regex,
    params: Vec<String>,
    pointer: String,
}

static OPERATIONS: LazyLock<Vec<Operation>> = LazyLock::new(|| {
    let mut out = Vec::new();
    for (template, item) in SPEC["paths"].as_object().expect("paths") {
        let mut pattern = String::from("^");
        let mut params = Vec::new();
        let mut rest = template.as_str();
        while let Some(open) = rest.find('{') {
            pattern.push_str(&regex::escape(&rest[..open]));
            let close = rest[open..].find('}').expect("closed parameter") + open;
            params.push(rest[open + 1..close].to_string());
            // A parameter runs to the next '/' (or ':' when an action follows, `{id}:attach`).
            pattern.push_str("([^/:]+)");
            rest = &rest[close + 1..];
        }
        pattern.push_str(&regex::escape(rest));
        pattern.push('$');
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_some() {
                out.push(Operation {
                    method: method.to_uppercase(),
                    template: template.clone(),
                    path: Regex::new(&pattern).expect("path pattern"),
                    params: params.clone(),
                    pointer: format!(
                        "/paths/{}/{method}",
                        template.replace('~', "~0").replace('/', "~1")
                    ),
                });
            }
        }
    }
    out
});

fn resolve(schema: &Value) -> &Value {
    let mut current = schema;
    for _ in 0..32 {
        match current.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                current = SPEC
                    .pointer(r.trim_start_matches('#'))
                    .unwrap_or_else(|| panic!("unresolvable $ref {r}"));
            }
            None => return current,
        }
    }
    current
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Request,
    Response,
}

fn check_value(schema: &Value, value: &Value, at: &str, dir: Direction, errors: &mut Vec<String>) {
    let schema = resolve(schema);
    if value.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            check_value(s, value, at, dir, errors);
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let fits = options.iter().any(|s| {
                let mut e = Vec::new();
                check_value(s, value, at, dir, &mut e);
                e.is_empty()
            });
            if !fits {
                errors.push(format!("{at}: matches none of the {key} alternatives"));
            }
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errors.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    let Some(kind) = schema.get("type").and_then(Value::as_str) else {
        return;
    };
    match kind {
        "object" => {
            let Some(object) = value.as_object() else {
                errors.push(format!("{at}: expected an object, got {value}"));
                return;
            };
            let properties = schema.get("properties").and_then(Value::as_object);
            for (name, v) in object {
                let here = format!("{at}.{name}");
                match properties.and_then(|p| p.get(name)) {
                    Some(property) => {
                        check_value(property, v, &here, dir, errors);
                    }
                    None => match schema.get("additionalProperties") {
                        Some(Value::Bool(true)) => {}
                        Some(extra @ Value::Object(_)) => check_value(extra, v, &here, dir, errors),
                        _ => errors.push(format!("{here}: not in the API's schema")),
                    },
                }
            }
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                // A read-only property is the API's to fill: required in answers only. (Nested
                // request objects reuse whole components, `{"instance": {"id": …}}`, so sending
                // a read-only id there is how the API is used, not an error.)
                let read_only = properties
                    .and_then(|p| p.get(required))
                    .map(resolve)
                    .and_then(|p| p.get("readOnly"))
                    .and_then(Value::as_bool)
                    == Some(true);
                if !(object.contains_key(required) || dir == Direction::Request && read_only) {
                    errors.push(format!("{at}.{required}: required, missing"));
                }
            }
        }
        "array" => {
            let Some(items) = value.as_array() else {
                errors.push(format!("{at}: expected an array, got {value}"));
                return;
            };
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                errors.push(format!("{at}: {} items, at most {max}", items.len()));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check_value(item, v, &format!("{at}[{i}]"), dir, errors);
                }
            }
        }
        "string" => {
            let Some(s) = value.as_str() else {
                errors.push(format!("{at}: expected a string, got {value}"));
                return;
            };
            check_string(schema, s, at, errors);
        }
        "integer" => {
            if !(value.is_i64() || value.is_u64()) {
                errors.push(format!("{at}: expected an integer, got {value}"));
                return;
            }
            check_bounds(schema, value.as_f64().unwrap_or_default(), at, errors);
        }
        "number" => match value.as_f64() {
            Some(n) => check_bounds(schema, n, at, errors),
            None => errors.push(format!("{at}: expected a number, got {value}")),
        },
        "boolean" if !value.is_boolean() => {
            errors.push(format!("{at}: expected a boolean, got {value}"));
        }
        _ => {}
    }
}

fn check_string(schema: &Value, s: &str, at: &str, errors: &mut Vec<String>) {
    let chars = s.chars().count() as u64;
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && chars < min
    {
        errors.push(format!("{at}: {s:?} is shorter than {min}"));
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && chars > max
    {
        errors.push(format!("{at}: {} characters, at most {max}", chars));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && let Ok(re) = Regex::new(pattern)
        && !re.is_match(s)
    {
        errors.push(format!("{at}: {s:?} does not match {pattern}"));
    }
    match schema.get("format").and_then(Value::as_str) {
        Some("uuid") if uuid::Uuid::parse_str(s).is_err() => {
            errors.push(format!("{at}: {s:?} is not a UUID"));
        }
        Some("date-time") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
            errors.push(format!("{at}: {s:?} is not an RFC 3339 date-time"));
        }
        _ => {}
    }
}

fn check_bounds(schema: &Value, n: f64, at: &str, errors: &mut Vec<String>) {
    let exclusive = |key: &str| schema.get(key).and_then(Value::as_bool) == Some(true);
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let low = if exclusive("exclusiveMinimum") {
            n <= min
        } else {
            n < min
        };
        if low {
            errors.push(format!("{at}: {n} is below the minimum {min}"));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let high = if exclusive("exclusiveMaximum") {
            n >= max
        } else {
            n > max
        };
        if high {
            errors.push(format!("{at}: {n} is above the maximum {max}"));
        }
    }
}

/// A parameter value from the URL, typed as its schema says.
fn parameter_value(schema: &Value, raw: &str) -> Value {
    match resolve(schema).get("type").and_then(Value::as_str) {
        Some("integer") => raw
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        Some("number") => raw
            .parse::<f64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        Some("boolean") => raw
            .parse::<bool>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        _ => Value::String(raw.into()),
    }
}

fn parameters<'a>(op: &'a Value, item: &'a Value) -> Vec<&'a Value> {
    item.get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(
            op.get("parameters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten(),
        )
        .map(resolve)
        .collect()
}

fn decode(component: &str) -> String {
    let mut out = Vec::new();
    let bytes = component.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&component[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Everything wrong with one exchange, each message naming the operation and the place.
pub fn problems(ex: &Exchange) -> Vec<String> {
    let path = ex.path.strip_prefix("/v2").unwrap_or(&ex.path);
    let Some((op_meta, captures)) = OPERATIONS.iter().find_map(|o| {
        (o.method == ex.method)
            .then(|| o.path.captures(path))
            .flatten()
            .map(|c| (o, c))
    }) else {
        return vec![format!(
            "{} {}: no such operation in the API",
            ex.method, ex.path
        )];
    };
    let name = format!("{} {}", ex.method, op_meta.template);
    let op = SPEC.pointer(&op_meta.pointer).expect("operation");
    let item = SPEC
        .pointer(op_meta.pointer.rsplit_once('/').expect("pointer").0)
        .expect("path item");
    let params = parameters(op, item);
    let mut errors = Vec::new();

    for (i, param) in op_meta.params.iter().enumerate() {
        let raw = decode(&captures[i + 1]);
        if let Some(p) = params
            .iter()
            .find(|p| p["in"] == "path" && p["name"] == param.as_str())
            && let Some(schema) = p.get("schema")
        {
            check_value(
                schema,
                &parameter_value(schema, &raw),
                &format!("path {{{param}}}"),
                Direction::Request,
                &mut errors,
            );
        }
    }
    for pair in ex
        .query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key);
        match params
            .iter()
            .find(|p| p["in"] == "query" && p["name"] == key.as_str())
        {
            Some(p) => {
                if let Some(schema) = p.get("schema") {
                    check_value(
                        schema,
                        &parameter_value(schema, &decode(raw)),
                        &format!("query {key}"),
                        Direction::Request,
                        &mut errors,
                    );
                }
            }
            None => errors.push(format!("query {key}: not a parameter of the operation")),
        }
    }

    let body_schema = op.pointer("/requestBody/content/application~1json/schema");
    let required = op.pointer("/requestBody/required").and_then(Value::as_bool) == Some(true);
    match (ex.request_body.trim(), body_schema) {
        ("", Some(_)) if required => errors.push("request body: required, none sent".into()),
        ("", _) => {}
        (_, None) => errors.push("request body: the operation takes none".into()),
        (text, Some(schema)) => match serde_json::from_str::<Value>(text) {
            Ok(body) => check_value(schema, &body, "request", Direction::Request, &mut errors),
            Err(e) => errors.push(format!("request body: not JSON ({e})")),
        },
    }

    if !ex.lost {
        let status = ex.status.to_string();
        if (200..300).contains(&ex.status) {
            match op.pointer(&format!("/responses/{status}")) {
                None => errors.push(format!("status {status}: not declared by the operation")),
                Some(response) => {
                    if let (Some(schema), Some(body)) = (
                        response.pointer("/content/application~1json/schema"),
                        ex.response_body.as_ref(),
                    ) {
                        check_value(schema, body, "response", Direction::Response, &mut errors);
                    }
                }
            }
        } else if !ex.injected {
            let documented = ex.response_body.as_ref().is_some_and(|b| {
                let keys: Vec<&String> = b
                    .as_object()
                    .map(|o| o.keys().collect())
                    .unwrap_or_default();
                (keys == ["message"] && b["message"].is_string())
                    || (b["error"].is_string()
                        && b.get("retry_after").is_some_and(Value::is_number))
            });
            if !documented {
                errors.push(format!(
                    "status {status}: the error body {:?} has none of the documented shapes",
                    ex.response_body
                ));
            }
        }
    }
    errors.into_iter().map(|e| format!("{name}: {e}")).collect()
}

/// Problems of every exchange, each listed once with how often it happened.
pub fn all_problems(exchanges: &[Exchange]) -> Vec<String> {
    let mut counted: std::collections::BTreeMap<String, usize> = Default::default();
    for ex in exchanges {
        for p in problems(ex) {
            *counted.entry(p).or_default() += 1;
        }
    }
    counted
        .into_iter()
        .map(|(p, n)| if n > 1 { format!("{p} (x{n})") } else { p })
        .collect()
}
