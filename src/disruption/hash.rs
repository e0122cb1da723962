//! The NodePool template hash written to `karpenter.sh/nodepool-hash`, bit-for-bit the value
//! upstream computes (`hashstructure` v2 with its default FNV-1 64-bit hasher, `FormatV2`, slices as sets, zero values and
//! nil pointers skipped), so NodeClaims launched by the Go provider do not all drift on switch-over.
//!
//! Hashed: template labels and annotations, taints, startup taints, nodeClassRef,
//! terminationGracePeriod and expireAfter. Not hashed: requirements (drift checks them
//! separately), budgets, limits, weight and everything outside the template.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::apis::common::{NodeClassReference, Taint, TaintEffect};
use crate::apis::duration::parse_nillable_duration;
use crate::apis::nodepool::NodeClaimTemplate;

use super::DisruptionError;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1 (multiply, then xor): `hash/fnv.New64`, hashstructure's default.
fn fnv(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(FNV_OFFSET, |h, b| h.wrapping_mul(FNV_PRIME) ^ u64::from(*b))
}

fn hash_str(s: &str) -> u64 {
    fnv(s.as_bytes())
}

fn hash_i64(v: i64) -> u64 {
    fnv(&v.to_le_bytes())
}

/// `hashUpdateOrdered`: a real hash of the two values in order.
fn ordered(a: u64, b: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&a.to_le_bytes());
    buf[8..].copy_from_slice(&b.to_le_bytes());
    fnv(&buf)
}

/// `hashFinishUnordered`: hardens an XOR accumulation.
fn finish(a: u64) -> u64 {
    fnv(&a.to_le_bytes())
}

/// A Go struct being hashed: its type name, then each non-zero field folded in declaration order.
struct StructHash(u64);

impl StructHash {
    fn new(type_name: &str) -> Self {
        StructHash(hash_str(type_name))
    }
    /// Adds a field; `None` is a zero value, which `IgnoreZeroValue` skips entirely.
    fn field(mut self, name: &str, value: Option<u64>) -> Self {
        if let Some(v) = value {
            self.0 = finish(self.0 ^ ordered(hash_str(name), v));
        }
        self
    }
}

fn hash_string_field(s: &str) -> Option<u64> {
    (!s.is_empty()).then(|| hash_str(s))
}

fn hash_map(map: &BTreeMap<String, String>) -> Option<u64> {
    if map.is_empty() {
        return None;
    }
    let xor = map
        .iter()
        .fold(0u64, |h, (k, v)| h ^ ordered(hash_str(k), hash_str(v)));
    Some(finish(xor))
}

/// `SlicesAsSets` without a `set` tag: a plain XOR of the elements, not finished.
fn hash_set(items: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut any = false;
    let h = items.into_iter().fold(0u64, |h, v| {
        any = true;
        h ^ v
    });
    any.then_some(h)
}

fn effect_str(e: TaintEffect) -> &'static str {
    match e {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// `time.Time.MarshalBinary` of a UTC instant (version 1, offset -1 = UTC).
fn hash_time(t: &Time) -> u64 {
    const UNIX_TO_GO_ZERO: i64 = 62_135_596_800;
    let secs = t.0.as_second() + UNIX_TO_GO_ZERO;
    let nanos = t.0.subsec_nanosecond() as u32;
    let mut buf = Vec::with_capacity(15);
    buf.push(1u8);
    buf.extend_from_slice(&secs.to_be_bytes());
    buf.extend_from_slice(&nanos.to_be_bytes());
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    let time_value = fnv(&buf);
    // metav1.Time embeds time.Time: a struct "Time" with one field "Time".
    StructHash::new("Time").field("Time", Some(time_value)).0
}

fn hash_taint(t: &Taint) -> u64 {
    StructHash::new("Taint")
        .field("Key", hash_string_field(&t.key))
        .field("Value", t.value.as_deref().and_then(hash_string_field))
        .field("Effect", Some(hash_str(effect_str(t.effect))))
        .field("TimeAdded", t.time_added.as_ref().map(hash_time))
        .0
}

fn hash_node_class_ref(r: &NodeClassReference) -> u64 {
    StructHash::new("NodeClassReference")
        .field("Kind", hash_string_field(&r.kind))
        .field("Name", hash_string_field(&r.name))
        .field("Group", hash_string_field(&r.group))
        .0
}

fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Upstream's template hash as the decimal string stored in the annotation.
pub fn nodepool_hash(template: &NodeClaimTemplate) -> Result<String, DisruptionError> {
    let spec = &template.spec;
    let meta = template.metadata.clone().unwrap_or_default();
    let meta_hash = {
        let labels = hash_map(&meta.labels);
        let annotations = hash_map(&meta.annotations);
        (labels.is_some() || annotations.is_some()).then(|| {
            StructHash::new("ObjectMeta")
                .field("Labels", labels)
                .field("Annotations", annotations)
                .0
        })
    };
    let tgp = match &spec.termination_grace_period {
        Some(v) => {
            let d = crate::apis::duration::parse_duration(v)?;
            // metav1.Duration{Duration time.Duration}: a zero duration is a zero struct.
            (!d.is_zero()).then(|| {
                StructHash::new("Duration")
                    .field("Duration", Some(hash_i64(nanos(d))))
                    .0
            })
        }
        None => None,
    };
    // NillableDuration{*time.Duration, Raw}: `Never` leaves both nil, a zero struct.
    let expire_after = parse_nillable_duration(&spec.expire_after)?.map(|d| {
        StructHash::new("NillableDuration")
            .field("Duration", Some(hash_i64(nanos(d))))
            .0
    });
    let spec_hash = StructHash::new("NodeClaimTemplateSpec")
        .field("Taints", hash_set(spec.taints.iter().map(hash_taint)))
        .field(
            "StartupTaints",
            hash_set(spec.startup_taints.iter().map(hash_taint)),
        )
        .field(
            "NodeClassRef",
            Some(hash_node_class_ref(&spec.node_class_ref)),
        )
        .field("TerminationGracePeriod", tgp)
        .field("ExpireAfter", expire_after)
        .0;
    let h = StructHash::new("NodeClaimTemplate")
        .field("ObjectMeta", meta_hash)
        .field("Spec", Some(spec_hash))
        .0;
    Ok(h.to_string())
}

// Tests: `tests/disruption_hash.rs` (golden values from upstream over an Exoscale template).
