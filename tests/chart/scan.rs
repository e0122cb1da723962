//! A small static scan of `src/` for the Kubernetes API calls the binary makes.
//!
//! It follows `Api` values from where they are built (`Api::<K>::all(..)`, `Api::namespaced(..)`
//! with a `let x: Api<K>` annotation, or a function returning `Api<K>`) to the methods called on
//! them, to the functions they are passed to (`Controller::new`, `watcher`, or helpers in `src/`
//! that take an `Api<K>` parameter), and recognises the few clients that build their own `Api`
//! (event `Recorder`, `apiserver_version`). Anything it cannot follow is reported
//! as an error naming the file and line, so new code is either understood or flagged, never
//! silently ignored.

use std::collections::BTreeMap;
use std::path::Path;

/// Where the `Api` of a call was built.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ApiScope {
    /// `Api::all`: cluster-wide.
    All,
    /// `Api::namespaced(_, ns)`; the namespace when it is a string constant of the file.
    Namespaced(Option<String>),
    /// `Api::default_namespaced` or a client that works in the controller's own namespace.
    OwnNamespace,
}

/// What the call touches: a kind (with an optional subresource) or a non-resource URL.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Touched {
    Kind {
        kind: String,
        subresource: Option<String>,
    },
    Resource {
        group: String,
        resource: String,
    },
    NonResourceUrl(String),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiUse {
    pub touched: Touched,
    pub verb: String,
    pub scope: ApiScope,
    pub at: String,
}

/// A verb with an optional subresource, as a method or helper applies it.
type Action = (String, Option<String>);

/// The RBAC verbs of a `kube::Api` method; None for methods the scan does not know.
fn method_actions(method: &str) -> Option<Vec<Action>> {
    let plain = |v: &str| vec![(v.to_string(), None)];
    let sub = |v: &str, s: &str| vec![(v.to_string(), Some(s.to_string()))];
    Some(match method {
        "get" | "get_opt" | "get_metadata" | "get_metadata_opt" => plain("get"),
        "list" | "list_metadata" => plain("list"),
        "watch" | "watch_metadata" => plain("watch"),
        "create" => plain("create"),
        "patch" | "patch_metadata" => plain("patch"),
        "replace" => plain("update"),
        "delete" => plain("delete"),
        "delete_collection" => plain("deletecollection"),
        "get_status" => sub("get", "status"),
        "patch_status" => sub("patch", "status"),
        "replace_status" => sub("update", "status"),
        "evict" => sub("create", "eviction"),
        _ => return None,
    })
}

/// Functions of kube-runtime that list and watch the `Api` they are given.
const WATCHING_CALLEES: &[&str] = &[
    "Controller::new",
    "watches",
    "owns",
    "watcher",
    "watcher::watcher",
    "metadata_watcher",
    "watcher::metadata_watcher",
    "reflector",
];

fn watch_actions() -> Vec<Action> {
    vec![("list".into(), None), ("watch".into(), None)]
}

/// Comments and the contents of string and char literals become spaces (lines are kept), and
/// `#[cfg(test)]` items are blanked, so the scan sees only code that ships.
pub fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let end = source[i..].find('\n').map_or(bytes.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = source[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
                blank(&mut out, i, end);
                i = end;
            }
            b'r' if (bytes.get(i + 1) == Some(&b'"') || bytes.get(i + 1) == Some(&b'#'))
                && (i == 0 || !is_ident(bytes[i - 1])) =>
            {
                let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
                if bytes.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let body = i + 2 + hashes;
                let end = source[body..]
                    .find(&close)
                    .map_or(bytes.len(), |n| body + n);
                blank(&mut out, body, end);
                i = end + close.len();
            }
            b'"' => {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j.min(bytes.len()));
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}'); otherwise a lifetime.
                let len = if bytes.get(i + 1) == Some(&b'\\') {
                    source[i + 2..].find('\'').map(|n| n + 2)
                } else {
                    source[i + 1..]
                        .char_indices()
                        .nth(1)
                        .filter(|(_, c)| *c == '\'')
                        .map(|(n, _)| n + 1)
                };
                match len {
                    Some(len) => {
                        blank(&mut out, i + 1, i + len);
                        i += len + 1;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    let mut text = String::from_utf8(out).expect("blanking keeps UTF-8 boundaries");
    while let Some(at) = text.find("#[cfg(test)]") {
        let open = text[at..].find(['{', ';']).map(|n| at + n);
        let end = match open {
            Some(open) if text.as_bytes()[open] == b'{' => matching(&text, open) + 1,
            Some(semi) => semi + 1,
            None => text.len(),
        };
        let blanked: String = text[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        text.replace_range(at..end, &blanked);
    }
    text
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The index of the bracket closing the one at `open`.
fn matching(text: &str, open: usize) -> usize {
    let bytes = text.as_bytes();
    let (o, c) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        b'<' => (b'<', b'>'),
        other => panic!("no bracket at {open}: {}", other as char),
    };
    let mut depth = 0;
    for (i, b) in bytes.iter().enumerate().skip(open) {
        if *b == o {
            depth += 1;
        } else if *b == c && !(c == b'>' && i > 0 && bytes[i - 1] == b'-') {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    text.len() - 1
}

/// The next non-space byte index at or after `i`.
fn skip_ws(text: &str, mut i: usize) -> usize {
    let bytes = text.as_bytes();
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The identifier starting at `i`.
fn ident_at(text: &str, i: usize) -> &str {
    let end = text[i..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(text.len(), |n| i + n);
    &text[i..end]
}

/// The path (`a::b::c`) ending just before `end` (exclusive), skipping spaces.
fn path_before(text: &str, end: usize) -> &str {
    let bytes = text.as_bytes();
    let mut start = end;
    while start > 0 && bytes[start - 1].is_ascii_whitespace() {
        start -= 1;
    }
    let stop = start;
    while start > 0 && (is_ident(bytes[start - 1]) || bytes[start - 1] == b':') {
        start -= 1;
    }
    &text[start..stop]
}

/// A function signature found in the file.
struct FnSig {
    name: String,
    /// `(parameter, type argument of Api)` for every `Api` parameter.
    api_params: Vec<(String, String)>,
    returns_api: Option<String>,
    signature: (usize, usize),
    body: Option<(usize, usize)>,
}

fn fn_signatures(text: &str) -> Vec<FnSig> {
    let mut sigs = Vec::new();
    let mut from = 0;
    while let Some(n) = text[from..].find("fn ") {
        let at = from + n;
        from = at + 3;
        if at > 0 && is_ident(text.as_bytes()[at - 1]) {
            continue;
        }
        let name_at = skip_ws(text, at + 3);
        let name = ident_at(text, name_at).to_string();
        if name.is_empty() {
            continue;
        }
        let mut i = name_at + name.len();
        if text.as_bytes().get(i) == Some(&b'<') {
            i = matching(text, i) + 1;
        }
        let Some(open) = text[i..].find('(').map(|n| i + n) else {
            continue;
        };
        let close = matching(text, open);
        let mut api_params = Vec::new();
        for param in split_top_level(&text[open + 1..close]) {
            if let Some((pname, ty)) = param.split_once(':')
                && let Some(kind) = api_type_argument(ty)
            {
                let pname = pname.trim().trim_start_matches("mut ").trim();
                api_params.push((pname.to_string(), kind));
            }
        }
        let rest_end = text[close..]
            .find(['{', ';'])
            .map_or(text.len(), |n| close + n);
        let tail = &text[close + 1..rest_end];
        let returns_api = tail
            .split_once("->")
            .and_then(|(_, ret)| api_type_argument(ret.split("where").next().unwrap_or("")));
        let body = (text.as_bytes().get(rest_end) == Some(&b'{'))
            .then(|| (rest_end, matching(text, rest_end)));
        sigs.push(FnSig {
            name,
            api_params,
            returns_api,
            signature: (at, rest_end),
            body,
        });
    }
    sigs
}

/// Comma-separated items at bracket depth zero.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' | '<' | '[' | '{' => depth += 1,
            ')' | '>' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `K` of a type `Api<K>` / `&Api<K>`.
fn api_type_argument(ty: &str) -> Option<String> {
    let ty = ty.trim().trim_start_matches('&').trim();
    let inner = ty.strip_prefix("Api<")?.strip_suffix('>')?.trim();
    Some(inner.rsplit("::").next().unwrap_or(inner).to_string())
}

/// The scan of one file.
struct FileScan<'a> {
    file: &'a str,
    raw: &'a str,
    text: String,
    helpers: &'a BTreeMap<String, Vec<Action>>,
    uses: Vec<ApiUse>,
    errors: Vec<String>,
}

impl FileScan<'_> {
    fn line(&self, at: usize) -> String {
        format!(
            "{}:{}",
            self.file,
            self.text[..at].matches('\n').count() + 1
        )
    }

    fn error(&mut self, at: usize, what: &str) {
        let line = self.line(at);
        self.errors.push(format!("{line}: {what}"));
    }

    /// The value of `const NAME: &str = "..."` in the file.
    fn const_str(&self, name: &str) -> Option<String> {
        let decl = format!("const {name}: &str = \"");
        let at = self.raw.find(&decl)? + decl.len();
        Some(self.raw[at..].split('"').next()?.to_string())
    }

    fn record(&mut self, kind: Option<&str>, actions: &[Action], scope: &ApiScope, at: usize) {
        let Some(kind) = kind else { return };
        for (verb, subresource) in actions {
            let at = self.line(at);
            self.uses.push(ApiUse {
                touched: Touched::Kind {
                    kind: kind.to_string(),
                    subresource: subresource.clone(),
                },
                verb: verb.clone(),
                scope: scope.clone(),
                at,
            });
        }
    }

    /// What happens to the `Api` value spanning `start..end`: its actions.
    fn follow(&mut self, start: usize, end: usize) -> Vec<Action> {
        let next = skip_ws(&self.text, end + 1);
        let text = self.text.clone();
        if text.as_bytes().get(next) == Some(&b'.') {
            let method_at = skip_ws(&text, next + 1);
            let method = ident_at(&text, method_at).to_string();
            let after = method_at + method.len();
            let call_end = if text.as_bytes().get(after) == Some(&b'(') {
                matching(&text, after)
            } else {
                after
            };
            if method == "clone" {
                return self.follow(start, call_end);
            }
            return match method_actions(&method) {
                Some(actions) => actions,
                None => {
                    self.error(method_at, &format!("unknown Api method `{method}`"));
                    Vec::new()
                }
            };
        }
        // `let name[: Api<K>] = <this>;`
        let before = text[..start].trim_end();
        if let Some(lhs) = before.strip_suffix('=') {
            let let_at = lhs.rfind("let ").unwrap_or(0);
            let binding = lhs[let_at + 4..].trim().trim_start_matches("mut ");
            let name = binding.split(':').next().unwrap_or("").trim().to_string();
            if !name.is_empty() && name.bytes().all(is_ident) && lhs[let_at..].starts_with("let ") {
                return self.follow_variable(&name, end, block_end(&text, start));
            }
        }
        self.passed_to(start)
    }

    /// The actions of the call the value at `start` is an argument of.
    fn passed_to(&mut self, start: usize) -> Vec<Action> {
        let text = self.text.clone();
        let bytes = text.as_bytes();
        let mut depth = 0;
        let mut i = start;
        while i > 0 {
            i -= 1;
            match bytes[i] {
                b')' | b']' | b'}' => depth += 1,
                b'(' | b'[' | b'{' if depth > 0 => depth -= 1,
                b'(' => {
                    let callee = path_before(&text, i);
                    let short = callee.rsplit("::").next().unwrap_or(callee);
                    if WATCHING_CALLEES.contains(&callee) || WATCHING_CALLEES.contains(&short) {
                        return watch_actions();
                    }
                    if let Some(actions) = self.helpers.get(short) {
                        return actions.clone();
                    }
                    self.error(
                        start,
                        &format!("Api passed to `{callee}`, which the scan does not know"),
                    );
                    return Vec::new();
                }
                b'{' | b'[' | b';' => break,
                _ => {}
            }
        }
        self.error(start, "Api value used in a way the scan cannot follow");
        Vec::new()
    }

    /// Actions on variable `name` from `from` to `to` (until it is bound again).
    fn follow_variable(&mut self, name: &str, from: usize, to: usize) -> Vec<Action> {
        let text = self.text.clone();
        let mut actions = Vec::new();
        let mut i = from;
        while let Some(n) = text[i..to].find(name) {
            let at = i + n;
            i = at + name.len();
            let bytes = text.as_bytes();
            let field = at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b'.');
            if field || bytes.get(i).is_some_and(|b| is_ident(*b)) {
                continue;
            }
            if text[..at].trim_end().ends_with("let") || text[..at].trim_end().ends_with("mut") {
                break;
            }
            let start = if at > 0 && bytes[at - 1] == b'&' {
                at - 1
            } else {
                at
            };
            actions.extend(self.follow(start, at + name.len() - 1));
        }
        actions
    }

    fn scope_of(&self, ctor: &str, args: &str) -> ApiScope {
        match ctor {
            "all" => ApiScope::All,
            "default_namespaced" => ApiScope::OwnNamespace,
            _ => {
                let ns = split_top_level(args).get(1).map(|s| s.trim().to_string());
                ApiScope::Namespaced(ns.and_then(|ns| self.const_str(&ns)))
            }
        }
    }
}

/// End of the block enclosing `at`.
fn block_end(text: &str, at: usize) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0;
    let mut i = at;
    while i > 0 {
        i -= 1;
        match bytes[i] {
            b'}' => depth += 1,
            b'{' if depth > 0 => depth -= 1,
            b'{' => return matching(text, i),
            _ => {}
        }
    }
    text.len()
}

const CONSTRUCTORS: &[&str] = &["all", "namespaced", "default_namespaced"];

/// Reads every `.rs` file under `src`, except those in `skip` (paths relative to `src`).
pub fn sources(src: &Path, skip: &[&str]) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(src)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                if !skip.contains(&rel.as_str()) {
                    files.push((
                        format!("src/{rel}"),
                        std::fs::read_to_string(&path).unwrap(),
                    ));
                }
            }
        }
    }
    files.sort();
    files
}

/// Every API use in `files` (name, source), or the places the scan could not follow.
pub fn scan(files: &[(String, String)]) -> Result<Vec<ApiUse>, Vec<String>> {
    let normalised: Vec<(String, String, String)> = files
        .iter()
        .map(|(name, raw)| {
            let text = code_only(raw)
                .replace("kube::api::Api", "Api")
                .replace("kube::Api", "Api");
            (name.clone(), raw.clone(), text)
        })
        .collect();
    // Helpers taking an `Api` parameter, found to a fixed point so helpers may call helpers.
    let mut helpers: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    let mut errors = Vec::new();
    for _ in 0..3 {
        errors.clear();
        let mut next = BTreeMap::new();
        for (name, raw, text) in &normalised {
            for sig in fn_signatures(text) {
                let Some((open, close)) = sig.body else {
                    continue;
                };
                for (param, _) in &sig.api_params {
                    let mut file = FileScan {
                        file: name,
                        raw,
                        text: text.clone(),
                        helpers: &helpers,
                        uses: Vec::new(),
                        errors: Vec::new(),
                    };
                    let actions = file.follow_variable(param, open, close);
                    errors.append(&mut file.errors);
                    next.entry(sig.name.clone())
                        .or_insert_with(Vec::new)
                        .extend(actions);
                }
            }
        }
        helpers = next;
    }

    let mut uses = Vec::new();
    for (name, raw, text) in &normalised {
        let sigs = fn_signatures(text);
        let mut file = FileScan {
            file: name,
            raw,
            text: text.clone(),
            helpers: &helpers,
            uses: Vec::new(),
            errors: Vec::new(),
        };
        // Generic helpers get their kind from the call site; concrete ones are followed there too.
        let returners: BTreeMap<&str, String> = sigs
            .iter()
            .filter_map(|s| Some((s.name.as_str(), s.returns_api.clone()?)))
            .collect();
        let mut returner_scope: BTreeMap<String, ApiScope> = BTreeMap::new();

        let mut i = 0;
        while let Some(n) = text[i..].find("Api") {
            let at = i + n;
            i = at + 3;
            let bytes = text.as_bytes();
            if (at > 0 && is_ident(bytes[at - 1]))
                || bytes.get(at + 3).is_some_and(|b| is_ident(*b))
            {
                continue;
            }
            let rest = &text[at + 3..];
            if rest.starts_with('<') {
                // A type: allowed in signatures and `let x: Api<K>` annotations only.
                let in_signature = sigs
                    .iter()
                    .any(|s| s.signature.0 <= at && at < s.signature.1);
                let in_let = text[..at].trim_end().ends_with(':')
                    && text[..at]
                        .rfind("let ")
                        .is_some_and(|l| !text[l..at].contains(';'));
                if !in_signature && !in_let {
                    file.error(
                        at,
                        "an Api stored where the scan cannot follow it (struct field?)",
                    );
                }
                continue;
            }
            let (kind, ctor_at) = if let Some(turbo) = rest.strip_prefix("::<") {
                let close = turbo.find(">::").map(|n| at + 6 + n);
                let Some(close) = close else {
                    file.error(at, "unrecognised Api::<..> expression");
                    continue;
                };
                (Some(text[at + 6..close].trim().to_string()), close + 3)
            } else if rest.starts_with("::") {
                (None, at + 5)
            } else {
                continue;
            };
            let ctor = ident_at(text, ctor_at).to_string();
            if !CONSTRUCTORS.contains(&ctor.as_str()) {
                file.error(at, &format!("unrecognised Api constructor `{ctor}`"));
                continue;
            }
            let open = ctor_at + ctor.len();
            if bytes.get(open) != Some(&b'(') {
                file.error(at, "Api constructor without arguments");
                continue;
            }
            let close = matching(text, open);
            let scope = file.scope_of(&ctor, &text[open + 1..close]);
            let enclosing = sigs
                .iter()
                .filter(|s| s.body.is_some_and(|(o, c)| o < at && at < c))
                .min_by_key(|s| s.body.map(|(o, c)| c - o));
            let kind = kind
                .or_else(|| {
                    let before = text[..at].trim_end().strip_suffix('=')?;
                    let annotation = &before[before.rfind("Api<")?..];
                    api_type_argument(annotation)
                })
                .map(|k| k.rsplit("::").next().unwrap_or(&k).to_string());
            if let Some(sig) = enclosing.filter(|s| s.returns_api.is_some()) {
                // Built to be returned: the callers of the function are the uses.
                if kind.is_none() || kind == sig.returns_api {
                    returner_scope.insert(sig.name.clone(), scope);
                    continue;
                }
            }
            let Some(kind) = kind else {
                file.error(
                    at,
                    "cannot tell the kind of this Api; annotate it or use Api::<K>",
                );
                continue;
            };
            let actions = file.follow(at, close);
            file.record(Some(&kind), &actions, &scope, at);
        }

        for (fname, kind) in &returners {
            let scope = returner_scope.get(*fname).cloned().unwrap_or(ApiScope::All);
            let call = format!("{fname}(");
            let mut j = 0;
            while let Some(n) = text[j..].find(&call) {
                let at = j + n;
                j = at + call.len();
                if at > 0 && is_ident(text.as_bytes()[at - 1])
                    || text[..at].trim_end().ends_with("fn")
                {
                    continue;
                }
                let close = matching(text, at + fname.len());
                let actions = file.follow(at, close);
                file.record(Some(kind), &actions, &scope, at);
            }
        }

        // Clients that build their own Api inside a library.
        let markers: &[(&str, &str, &str, &[&str], ApiScope)] = &[(
            "Recorder::new(",
            "events.k8s.io",
            "events",
            &["create", "patch"],
            ApiScope::All,
        )];
        for (marker, group, resource, verbs, scope) in markers {
            for (at, _) in text.match_indices(marker) {
                for verb in *verbs {
                    let at = file.line(at);
                    file.uses.push(ApiUse {
                        touched: Touched::Resource {
                            group: group.to_string(),
                            resource: resource.to_string(),
                        },
                        verb: verb.to_string(),
                        scope: scope.clone(),
                        at,
                    });
                }
            }
        }
        for (at, _) in text.match_indices(".apiserver_version()") {
            let at = file.line(at);
            file.uses.push(ApiUse {
                touched: Touched::NonResourceUrl("/version".into()),
                verb: "get".into(),
                scope: ApiScope::All,
                at,
            });
        }
        for raw_call in [
            ".request::<",
            ".request_text(",
            ".request_events(",
            "Discovery::new",
        ] {
            for (at, _) in text.match_indices(raw_call) {
                file.error(
                    at,
                    &format!("raw API access `{raw_call}`: teach tests/chart/scan.rs"),
                );
            }
        }
        uses.append(&mut file.uses);
        errors.append(&mut file.errors);
    }
    if errors.is_empty() {
        Ok(uses)
    } else {
        Err(errors)
    }
}
