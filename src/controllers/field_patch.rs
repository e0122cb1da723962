//! Writes that are conditional on exactly the fields they change: a JSON patch (RFC 6902) in
//! which every replacement and removal is preceded by a `test` of the value it was computed
//! from, and the object's uid is tested first.
//!
//! A merge patch replaces a list whole (taints, finalizers, owner references), so our Node
//! writes carried the resourceVersion they were computed from, and every kubelet status update
//! in between had them refused with 409: 880–1 840 refused registrations in a 1 000-node
//! launch, each a wasted request to a loaded API server and a retry. Here only a change to one
//! of the fields being written refuses the write. The API server answers a patch it cannot
//! apply (a failed `test`, a member gone) with a bare 422; it is reported as the 409 every
//! caller already handles (re-read, recompute).

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{Error, Result};

/// A field a write may change, by its path from the object's root.
#[derive(Clone, Copy, Debug)]
pub enum Field {
    /// A map written key by key (labels, annotations): a change to another key, by anyone,
    /// does not refuse the write.
    Keys(&'static [&'static str]),
    /// A value written whole.
    Whole(&'static [&'static str]),
    /// A list written item by item, as a set (taints, finalizers, owner references): an item
    /// is removed where it was read, after a test that it is still there, and an item added
    /// is appended, untested (JSON patch cannot test that a list lacks an item: should another
    /// writer have appended the same one, the list holds it twice, or the API server's
    /// validation refuses a duplicate taint). Another writer's items, added or removed
    /// meanwhile, are kept; a list another writer reordered around an item being removed
    /// refuses the write.
    Items(&'static [&'static str]),
}

/// The operations that turn `current`'s `fields` into `desired`'s, each replacement and
/// removal preceded by a test of what it replaces (`null` for an absent member, which the API
/// server's JSON patch accepts as absent). Empty when the fields are equal.
pub fn field_ops(current: &Value, desired: &Value, fields: &[Field]) -> Vec<Value> {
    let mut ops = Vec::new();
    for field in fields {
        match *field {
            Field::Keys(path) => keys_ops(&mut ops, current, desired, path),
            Field::Whole(path) => whole_ops(&mut ops, current, path, at(desired, path)),
            Field::Items(path) => items_ops(&mut ops, current, desired, path),
        }
    }
    ops
}

fn keys_ops(ops: &mut Vec<Value>, current: &Value, desired: &Value, path: &[&str]) {
    let (now, wanted) = (at(current, path), at(desired, path));
    if now == wanted {
        return;
    }
    let (Some(Value::Object(now)), Some(Value::Object(wanted))) = (now, wanted) else {
        // A map that appears or goes: written whole.
        return whole_ops(ops, current, path, wanted);
    };
    let base = pointer(path);
    for (key, value) in wanted {
        let old = now.get(key);
        if old != Some(value) {
            let member = format!("{base}/{}", escape(key));
            ops.push(json!({"op": "test", "path": member, "value": old}));
            ops.push(json!({"op": "add", "path": member, "value": value}));
        }
    }
    for (key, old) in now {
        if !wanted.contains_key(key) {
            let member = format!("{base}/{}", escape(key));
            ops.push(json!({"op": "test", "path": member, "value": old}));
            ops.push(json!({"op": "remove", "path": member}));
        }
    }
}

fn items_ops(ops: &mut Vec<Value>, current: &Value, desired: &Value, path: &[&str]) {
    let (now, wanted) = (at(current, path), at(desired, path));
    let Some(Value::Array(now)) = now else {
        // No list yet: written whole, tested absent.
        return whole_ops(ops, current, path, wanted);
    };
    let empty = Vec::new();
    let wanted = match wanted {
        Some(Value::Array(wanted)) => wanted,
        _ => &empty,
    };
    let base = pointer(path);
    // Last first: a removal leaves the indices of the items before it as they were read.
    for (index, item) in now.iter().enumerate().rev() {
        if !wanted.contains(item) {
            let member = format!("{base}/{index}");
            ops.push(json!({"op": "test", "path": member, "value": item}));
            ops.push(json!({"op": "remove", "path": member}));
        }
    }
    for item in wanted {
        if !now.contains(item) {
            ops.push(json!({"op": "add", "path": format!("{base}/-"), "value": item}));
        }
    }
}

fn whole_ops(ops: &mut Vec<Value>, current: &Value, path: &[&str], wanted: Option<&Value>) {
    let now = at(current, path);
    let wanted = wanted.filter(|v| !v.is_null());
    if now.filter(|v| !v.is_null()) == wanted {
        return;
    }
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    if !parent.is_empty() && at(current, parent).is_none_or(Value::is_null) {
        let Some(wanted) = wanted else { return };
        let parent_pointer = pointer(parent);
        if ops
            .iter()
            .any(|op| op["op"] == "add" && op["path"] == parent_pointer.as_str())
        {
            // An earlier field of this patch added the parent (tested absent), holding only
            // what it wrote: this member is absent there.
            ops.push(json!({"op": "add", "path": pointer(path), "value": wanted}));
            return;
        }
        // `add` needs the parent: add it, holding just this member.
        let mut holder = serde_json::Map::new();
        holder.insert((*last).to_string(), wanted.clone());
        return whole_ops(ops, current, parent, Some(&Value::Object(holder)));
    }
    let member = pointer(path);
    ops.push(json!({"op": "test", "path": member, "value": now}));
    match wanted {
        Some(value) => ops.push(json!({"op": "add", "path": member, "value": value})),
        None => ops.push(json!({"op": "remove", "path": member})),
    }
}

fn at<'a>(root: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(root, |value, key| value.get(key))
}

fn pointer(path: &[&str]) -> String {
    path.iter().map(|key| format!("/{}", escape(key))).collect()
}

/// A JSON pointer token (RFC 6901): `~` and `/` escaped.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Writes `desired`'s `fields` over the object `current` was read as, conditional on those
/// fields only; None when they are already equal (nothing is sent).
pub async fn patch_fields<K>(
    api: &Api<K>,
    current: &K,
    desired: &K,
    fields: &[Field],
) -> Result<Option<K>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let ops = field_ops(
        &serde_json::to_value(current).map_err(invalid)?,
        &serde_json::to_value(desired).map_err(invalid)?,
        fields,
    );
    if ops.is_empty() {
        return Ok(None);
    }
    let meta = current.meta();
    let name = meta.name.clone().unwrap_or_default();
    let ops = with_uid_test(ops, meta.uid.as_deref());
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(invalid)?;
    match api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(status)) if failed_test(&status) => Err(conflict(&name, &status)),
        Err(error) => Err(error.into()),
    }
}

/// `ops` preceded by a test of the object's uid: a write computed from one object never lands
/// on another recreated under its name (the resourceVersion condition guaranteed that too).
fn with_uid_test(mut ops: Vec<Value>, uid: Option<&str>) -> Vec<Value> {
    if let Some(uid) = uid {
        ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/uid", "value": uid}),
        );
    }
    ops
}

/// The message of the API server's 422 for a JSON patch it could not apply to the object (a
/// failed `test`, a member to remove that is gone): fixed, without the library's reason, and
/// without causes. A patched object that fails validation is a 422 too, but names the object
/// ("Node \"x\" is invalid: …") and lists its causes.
const UNAPPLICABLE_PATCH: &str = "the server rejected our request due to an error in our request";

/// The API server's answer to a JSON patch that no longer applies to the object as it is.
fn failed_test(status: &kube::core::Status) -> bool {
    status.code == 422
        && status.message == UNAPPLICABLE_PATCH
        && status
            .details
            .as_ref()
            .is_none_or(|d| d.causes.is_empty() && d.name.is_empty())
}

fn conflict(name: &str, status: &kube::core::Status) -> Error {
    Error::Kube(kube::Error::Api(
        kube::core::Status::failure(
            &format!(
                "{name} changed since it was read: {}",
                crate::operator::events::truncate(&status.message, 300)
            ),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}

fn invalid(error: serde_json::Error) -> Error {
    Error::Invalid(format!("building a JSON patch: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABELS: Field = Field::Keys(&["metadata", "labels"]);
    const TAINTS: Field = Field::Items(&["spec", "taints"]);
    const FINALIZERS: Field = Field::Items(&["metadata", "finalizers"]);
    const WHOLE_TAINTS: Field = Field::Whole(&["spec", "taints"]);

    /// Applies `ops` by the API server's JSON patch rules (gopkg.in/evanphx/json-patch.v4):
    /// `test` needs the parent, and against `null` passes for an absent member (not for an
    /// index past a list's end); `add` needs the parent and replaces a present member; `remove`
    /// needs the member. Err names the failed operation. (The json-patch crate differs on the
    /// `null` rule; `tests/cluster.rs` runs the real one.)
    fn apply(doc: &Value, ops: Vec<Value>) -> std::result::Result<Value, String> {
        // Every op must also parse as the crate's type, which is what is sent.
        let _: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
        let mut doc = doc.clone();
        for op in ops {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            match op["op"].as_str().unwrap() {
                "test" => {
                    // The parent must exist, and a list index be within it.
                    let found = match doc.pointer(parent) {
                        Some(Value::Object(holder)) => holder.get(&last).unwrap_or(&Value::Null),
                        Some(Value::Array(list)) => last
                            .parse::<usize>()
                            .ok()
                            .and_then(|i| list.get(i))
                            .ok_or(format!("error in test for path {path}: invalid index"))?,
                        _ => return Err(format!("test {path}: missing path")),
                    };
                    if *found != op["value"] {
                        return Err(format!("testing value {path} failed"));
                    }
                }
                "add" => match doc.pointer_mut(parent) {
                    Some(Value::Object(holder)) => {
                        holder.insert(last, op["value"].clone());
                    }
                    Some(Value::Array(list)) if last == "-" => list.push(op["value"].clone()),
                    _ => return Err(format!("add {path}: no parent")),
                },
                "remove" => {
                    let removed = match doc.pointer_mut(parent) {
                        Some(Value::Object(holder)) => holder.remove(&last),
                        Some(Value::Array(list)) => last
                            .parse::<usize>()
                            .ok()
                            .filter(|i| *i < list.len())
                            .map(|i| list.remove(i)),
                        _ => None,
                    };
                    removed.ok_or(format!("remove {path}: missing"))?;
                }
                other => panic!("unexpected op {other}"),
            }
        }
        Ok(doc)
    }

    fn node(labels: Value, taints: Value) -> Value {
        json!({
            "metadata": {"name": "n", "labels": labels},
            "spec": {"providerID": "exoscale://i", "taints": taints},
            "status": {"conditions": []},
        })
    }

    #[test]
    fn changes_only_the_fields_named_and_tests_each_first() {
        let read = node(
            json!({"a": "1", "gone": "x"}),
            json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]),
        );
        let mut desired = node(
            json!({"a": "2", "karpenter.sh/registered": "true"}),
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        );
        desired["status"]["conditions"] = json!([{"type": "ignored"}]);
        let ops = field_ops(&read, &desired, &[LABELS, TAINTS]);
        assert!(
            ops.iter().all(
                |op| op["path"].as_str().unwrap().starts_with("/metadata/labels")
                    || op["path"].as_str().unwrap().starts_with("/spec/taints/")
            ),
            "status is not a field named: {ops:?}"
        );
        assert!(
            ops.iter()
                .any(|op| op["path"] == "/metadata/labels/karpenter.sh~1registered")
        );
        // The kubelet updated its status and added a label of its own since we read it.
        let mut now = read.clone();
        now["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        now["metadata"]["labels"]["kubelet"] = json!("own");
        let written = apply(&now, ops).expect("a status update does not refuse the write");
        assert_eq!(
            written["metadata"]["labels"],
            json!({"a": "2", "karpenter.sh/registered": "true", "kubelet": "own"})
        );
        assert_eq!(written["spec"]["taints"], desired["spec"]["taints"]);
        assert_eq!(written["status"], now["status"], "status untouched");
    }

    #[test]
    fn a_change_to_a_field_being_written_refuses_the_write() {
        let read = node(json!({}), json!([{"key": "a", "effect": "NoSchedule"}]));
        let desired = node(json!({}), json!([]));
        let ops = field_ops(&read, &desired, &[WHOLE_TAINTS]);
        let mut now = read.clone();
        now["spec"]["taints"] =
            json!([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]);
        let refused =
            apply(&now, ops.clone()).expect_err("another writer's taint is never dropped");
        assert!(refused.contains("testing value /spec/taints"), "{refused}");
        assert_eq!(apply(&read, ops).unwrap()["spec"]["taints"], json!([]));
        // The same for one label: ours was computed from "1"; someone set "3".
        let read = node(json!({"a": "1"}), json!(null));
        let ops = field_ops(&read, &node(json!({"a": "2"}), json!(null)), &[LABELS]);
        let now = node(json!({"a": "3"}), json!(null));
        assert!(apply(&now, ops).is_err());
    }

    #[test]
    fn list_items_are_removed_where_read_and_appended_keeping_other_writers_items() {
        let unregistered = json!({"key": "karpenter.sh/unregistered", "effect": "NoExecute"});
        let not_ready = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let startup = json!({"key": "startup", "effect": "NoSchedule"});
        let read = node(json!({}), json!([unregistered, not_ready]));
        let desired = node(json!({}), json!([not_ready, startup]));
        let ops = field_ops(&read, &desired, &[TAINTS]);
        assert_eq!(
            apply(&read, ops.clone()).unwrap()["spec"]["taints"],
            json!([not_ready, startup])
        );
        // The node lifecycle controller removed not-ready meanwhile: its removal stands.
        let now = node(json!({}), json!([unregistered]));
        assert_eq!(
            apply(&now, ops.clone()).unwrap()["spec"]["taints"],
            json!([startup])
        );
        // Another writer appended a taint: it is kept.
        let other = json!({"key": "other", "effect": "NoSchedule"});
        let now = node(json!({}), json!([unregistered, not_ready, other]));
        assert_eq!(
            apply(&now, ops.clone()).unwrap()["spec"]["taints"],
            json!([not_ready, other, startup])
        );
        // A taint inserted before the one being removed moves it: refused, never misremoved.
        let now = node(json!({}), json!([other, unregistered, not_ready]));
        let refused = apply(&now, ops).expect_err("the item is no longer where it was read");
        assert!(
            refused.contains("testing value /spec/taints/0"),
            "{refused}"
        );
        // Two removals: the later index first, so the earlier stays where it was read.
        let read = node(json!({}), json!([unregistered, not_ready, startup]));
        let ops = field_ops(&read, &node(json!({}), json!([not_ready])), &[TAINTS]);
        assert_eq!(
            apply(&read, ops).unwrap()["spec"]["taints"],
            json!([not_ready])
        );
    }

    #[test]
    fn an_absent_member_is_tested_as_absent_and_added_with_its_parent() {
        let read = json!({"metadata": {"name": "n"}});
        let mut desired = read.clone();
        desired["metadata"]["finalizers"] = json!(["karpenter.sh/termination"]);
        desired["metadata"]["labels"] = json!({"k": "v"});
        desired["spec"] = json!({"taints": [{"key": "t", "effect": "NoSchedule"}]});
        let ops = field_ops(&read, &desired, &[LABELS, FINALIZERS, TAINTS]);
        let written = apply(&read, ops.clone()).unwrap();
        for path in ["/metadata/finalizers", "/metadata/labels", "/spec/taints"] {
            assert_eq!(written.pointer(path), desired.pointer(path), "{path}");
        }
        // Someone added finalizers first: the absent test fails.
        let mut now = read.clone();
        now["metadata"]["finalizers"] = json!(["other"]);
        assert!(apply(&now, ops).is_err());
    }

    #[test]
    fn equal_fields_send_nothing_and_removed_lists_are_removed() {
        let read = node(
            json!({"a": "1"}),
            json!([{"key": "t", "effect": "NoSchedule"}]),
        );
        assert!(field_ops(&read, &read, &[LABELS, TAINTS, FINALIZERS]).is_empty());
        let mut desired = read.clone();
        desired["spec"].as_object_mut().unwrap().remove("taints");
        let written = apply(&read, field_ops(&read, &desired, &[WHOLE_TAINTS])).unwrap();
        assert_eq!(written["spec"].get("taints"), None);
        let written = apply(&read, field_ops(&read, &desired, &[TAINTS])).unwrap();
        assert_eq!(
            written["spec"]["taints"],
            json!([]),
            "item by item: each removed"
        );
    }

    #[test]
    fn keys_are_escaped_as_json_pointer_tokens() {
        assert_eq!(escape("karpenter.sh/nodepool"), "karpenter.sh~1nodepool");
        assert_eq!(escape("a~b/c"), "a~0b~1c");
        assert_eq!(
            pointer(&["metadata", "labels", "x/y"]),
            "/metadata/labels/x~1y"
        );
    }

    #[test]
    fn a_patch_that_no_longer_applies_is_a_conflict_and_an_invalid_object_is_not() {
        // The bodies kube-apiserver 1.35 sends: a JSON patch it cannot apply, then a patched
        // object that fails validation.
        let unapplicable: kube::core::Status = serde_json::from_value(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server rejected our request due to an error in our request",
            "reason": "Invalid", "details": {}, "code": 422,
        }))
        .unwrap();
        assert!(failed_test(&unapplicable));
        assert!(conflict("n", &unapplicable).is_conflict());
        let invalid: kube::core::Status = serde_json::from_value(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Node \"n\" is invalid: spec.taints[1]: Duplicate value: \"t:NoSchedule\"",
            "reason": "Invalid",
            "details": {"name": "n", "kind": "Node", "causes": [{
                "reason": "FieldValueDuplicate", "field": "spec.taints[1]",
                "message": "Duplicate value: \"t:NoSchedule\"",
            }]},
            "code": 422,
        }))
        .unwrap();
        assert!(!failed_test(&invalid));
    }

    #[test]
    fn a_write_tests_the_uid_first_and_a_parent_added_once_holds_every_member() {
        let ops = with_uid_test(
            vec![json!({"op": "add", "path": "/a", "value": 1})],
            Some("u"),
        );
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/uid", "value": "u"})
        );
        // Two fields under a parent the object lacks: the second goes into the parent the
        // first added, instead of testing it absent against this patch's own add.
        let read = json!({"metadata": {"name": "n"}});
        let mut desired = read.clone();
        desired["spec"] = json!({"taints": [{"key": "t"}], "podCIDR": "10.0.0.0/24"});
        let fields = [TAINTS, Field::Whole(&["spec", "podCIDR"])];
        let written = apply(&read, field_ops(&read, &desired, &fields)).unwrap();
        assert_eq!(written["spec"], desired["spec"]);
    }
}
