//! Node-selector requirements algebra: `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`
//! (and `Gte`/`Lte`), intersection, compatibility and `minValues`.
//!
//! A requirement is either a finite set of allowed values or the complement of a finite set,
//! optionally bounded by inclusive integer bounds.

use std::cmp::Ordering;
use std::fmt;

use super::labels::{WellKnownLabels, normalize_key};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    Gte,
    Lte,
}

impl Operator {
    pub fn parse(s: &str) -> Result<Self, RequirementError> {
        Ok(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "Gte" => Operator::Gte,
            "Lte" => Operator::Lte,
            other => return Err(RequirementError::UnknownOperator(other.to_string())),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("unknown operator {0:?}")]
    UnknownOperator(String),
    #[error("operator {operator:?} on key {key:?} needs exactly one integer value, got {values:?}")]
    BadBound {
        key: String,
        operator: Operator,
        values: Vec<String>,
    },
    #[error("operator {operator:?} on key {key:?} takes no values, got {values:?}")]
    UnexpectedValues {
        key: String,
        operator: Operator,
        values: Vec<String>,
    },
    #[error("operator In on key {0:?} needs at least one value")]
    MissingValues(String),
}

/// One key's constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    complement: bool,
    /// Sorted, without duplicates.
    values: Vec<String>,
    gte: Option<i64>,
    lte: Option<i64>,
    min_values: Option<usize>,
}

impl Requirement {
    /// Builds a requirement the way a `NodeSelectorRequirement` is read (keys normalised).
    pub fn new(
        key: &str,
        operator: Operator,
        values: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Self, RequirementError> {
        let key = normalize_key(key).to_string();
        let values: Vec<String> = values.into_iter().map(Into::into).collect();
        let bound = |values: &[String]| -> Result<i64, RequirementError> {
            match values {
                [v] => v.parse::<i64>().map_err(|_| RequirementError::BadBound {
                    key: key.clone(),
                    operator,
                    values: values.to_vec(),
                }),
                _ => Err(RequirementError::BadBound {
                    key: key.clone(),
                    operator,
                    values: values.to_vec(),
                }),
            }
        };
        let no_values = |values: &[String]| {
            if values.is_empty() {
                Ok(())
            } else {
                Err(RequirementError::UnexpectedValues {
                    key: key.clone(),
                    operator,
                    values: values.to_vec(),
                })
            }
        };
        let mut r = Requirement {
            key: key.clone(),
            complement: true,
            values: Vec::new(),
            gte: None,
            lte: None,
            min_values: None,
        };
        match operator {
            Operator::In => {
                if values.is_empty() {
                    return Err(RequirementError::MissingValues(key));
                }
                r.complement = false;
                r.values = sorted(values);
            }
            Operator::NotIn => r.values = sorted(values),
            Operator::Exists => no_values(&values)?,
            Operator::DoesNotExist => {
                no_values(&values)?;
                r.complement = false;
            }
            Operator::Gt => {
                let n = bound(&values)?;
                if n == i64::MAX {
                    r.complement = false;
                } else {
                    r.gte = Some(n + 1);
                }
            }
            Operator::Lt => {
                let n = bound(&values)?;
                if n == i64::MIN {
                    r.complement = false;
                } else {
                    r.lte = Some(n - 1);
                }
            }
            Operator::Gte => r.gte = Some(bound(&values)?),
            Operator::Lte => r.lte = Some(bound(&values)?),
        }
        Ok(r)
    }

    /// `key In [values]`; an empty list gives `DoesNotExist`.
    pub fn in_values(key: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Requirement {
            key: normalize_key(key).to_string(),
            complement: false,
            values: sorted(values.into_iter().map(Into::into).collect()),
            gte: None,
            lte: None,
            min_values: None,
        }
    }

    pub fn exists(key: &str) -> Self {
        Requirement {
            key: normalize_key(key).to_string(),
            complement: true,
            values: Vec::new(),
            gte: None,
            lte: None,
            min_values: None,
        }
    }

    pub fn does_not_exist(key: &str) -> Self {
        Self::in_values(key, Vec::<String>::new())
    }

    pub fn with_min_values(mut self, min_values: Option<usize>) -> Self {
        self.min_values = min_values;
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn min_values(&self) -> Option<usize> {
        self.min_values
    }

    pub(crate) fn set_min_values(&mut self, min_values: Option<usize>) {
        self.min_values = min_values;
    }

    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// The finite value set (`In`) or the excluded values (`NotIn`).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    pub fn bounds(&self) -> (Option<i64>, Option<i64>) {
        (self.gte, self.lte)
    }

    /// The operator that best describes the requirement (`NotIn` also covers bounded complements).
    pub fn operator(&self) -> Operator {
        if self.complement {
            if self.values.is_empty() && self.gte.is_none() && self.lte.is_none() {
                Operator::Exists
            } else {
                Operator::NotIn
            }
        } else if self.values.is_empty() {
            Operator::DoesNotExist
        } else {
            Operator::In
        }
    }

    fn is_negative(&self) -> bool {
        matches!(self.operator(), Operator::NotIn | Operator::DoesNotExist)
            && self.gte.is_none()
            && self.lte.is_none()
    }

    fn within_bounds(&self, value: &str) -> bool {
        if self.gte.is_none() && self.lte.is_none() {
            return true;
        }
        match value.parse::<i64>() {
            Ok(n) => self.gte.is_none_or(|g| n >= g) && self.lte.is_none_or(|l| n <= l),
            Err(_) => false,
        }
    }

    /// Whether `value` satisfies the requirement.
    pub fn has(&self, value: &str) -> bool {
        if self.complement {
            self.values
                .binary_search_by(|v| v.as_str().cmp(value))
                .is_err()
                && self.within_bounds(value)
        } else {
            self.values
                .binary_search_by(|v| v.as_str().cmp(value))
                .is_ok()
        }
    }

    /// The single allowed value, if the requirement collapsed to one.
    pub fn single_value(&self) -> Option<&str> {
        match (self.complement, self.values.as_slice()) {
            (false, [v]) => Some(v),
            _ => None,
        }
    }

    /// Any value satisfying the requirement (smallest `In` value, or an integer within bounds).
    pub fn any_value(&self) -> Option<String> {
        if !self.complement {
            return self.values.first().cloned();
        }
        let first = match (self.gte, self.lte) {
            (Some(g), _) => g,
            (None, Some(l)) => l.min(0),
            (None, None) => 0,
        };
        (first..first.saturating_add(1000))
            .take_while(|n| self.lte.is_none_or(|l| *n <= l))
            .map(|n| n.to_string())
            .find(|s| self.has(s))
    }

    /// Number of allowed values (`usize::MAX` for complements).
    pub fn len(&self) -> usize {
        if self.complement {
            usize::MAX
        } else {
            self.values.len()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The requirement both `self` and `other` admit.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let gte = max_opt(self.gte, other.gte);
        let lte = min_opt(self.lte, other.lte);
        let min_values = max_opt(self.min_values, other.min_values);
        let mut out = Requirement {
            key: self.key.clone(),
            complement: self.complement && other.complement,
            values: Vec::new(),
            gte: None,
            lte: None,
            min_values,
        };
        match (self.complement, other.complement) {
            (true, true) => {
                out.values = union_sorted(&self.values, &other.values);
                if let (Some(g), Some(l)) = (gte, lte)
                    && g > l
                {
                    out.complement = false;
                    out.values.clear();
                    return out;
                }
                out.gte = gte;
                out.lte = lte;
            }
            (true, false) => {
                out.values = other
                    .values
                    .iter()
                    .filter(|v| self.has(v))
                    .cloned()
                    .collect();
            }
            (false, true) => {
                out.values = self
                    .values
                    .iter()
                    .filter(|v| other.has(v))
                    .cloned()
                    .collect();
            }
            (false, false) => {
                out.values = intersect_sorted(&self.values, &other.values);
            }
        }
        out
    }

    /// Whether some value satisfies both, without allocating.
    pub fn overlaps(&self, other: &Requirement) -> bool {
        match (self.complement, other.complement) {
            (true, true) => {
                let gte = max_opt(self.gte, other.gte);
                let lte = min_opt(self.lte, other.lte);
                !matches!((gte, lte), (Some(g), Some(l)) if g > l)
            }
            (true, false) => other.values.iter().any(|v| self.has(v)),
            (false, true) => self.values.iter().any(|v| other.has(v)),
            (false, false) => {
                let (mut i, mut j) = (0, 0);
                while i < self.values.len() && j < other.values.len() {
                    match self.values[i].cmp(&other.values[j]) {
                        Ordering::Less => i += 1,
                        Ordering::Greater => j += 1,
                        Ordering::Equal => return true,
                    }
                }
                false
            }
        }
    }

    /// Whether every value `other` admits is admitted here too (so intersecting changes nothing).
    /// Conservative: complements in `other` only count when `self` is `Exists` without bounds.
    pub fn admits_all_of(&self, other: &Requirement) -> bool {
        if self.min_values.unwrap_or(0) < other.min_values.unwrap_or(0) {
            return false;
        }
        if other.complement {
            return self.complement
                && self.values.is_empty()
                && self.gte.is_none()
                && self.lte.is_none();
        }
        other.values.iter().all(|v| self.has(v))
    }

    /// Upstream's pairwise `Intersects`: overlap, except two negative requirements never conflict.
    pub fn intersects(&self, other: &Requirement) -> bool {
        self.overlaps(other) || (self.is_negative() && other.is_negative())
    }

    /// Serialises as `NodeSelectorRequirement`s: `(key, operator, values)`; bounds give `Gte`/`Lte` entries.
    pub fn to_node_selector_terms(&self) -> Vec<(String, Operator, Vec<String>)> {
        let mut out = Vec::new();
        if self.complement {
            if !self.values.is_empty() || (self.gte.is_none() && self.lte.is_none()) {
                let op = if self.values.is_empty() {
                    Operator::Exists
                } else {
                    Operator::NotIn
                };
                out.push((self.key.clone(), op, self.values.clone()));
            }
            if let Some(g) = self.gte {
                out.push((self.key.clone(), Operator::Gte, vec![g.to_string()]));
            }
            if let Some(l) = self.lte {
                out.push((self.key.clone(), Operator::Lte, vec![l.to_string()]));
            }
        } else if self.values.is_empty() {
            out.push((self.key.clone(), Operator::DoesNotExist, vec![]));
        } else {
            out.push((self.key.clone(), Operator::In, self.values.clone()));
        }
        out
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms = self.to_node_selector_terms();
        for (i, (k, op, values)) in terms.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            match op {
                Operator::Exists | Operator::DoesNotExist => write!(f, "{k} {op:?}")?,
                _ => write!(f, "{k} {op:?} [{}]", values.join(", "))?,
            }
        }
        if let Some(m) = self.min_values {
            write!(f, " minValues {m}")?;
        }
        Ok(())
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort_unstable();
    v.dedup();
    v
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn union_sorted(a: &[String], b: &[String]) -> Vec<String> {
    let mut out: Vec<String> = a.iter().chain(b.iter()).cloned().collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn intersect_sorted(a: &[String], b: &[String]) -> Vec<String> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                out.push(a[i].clone());
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Why two requirement sets cannot be satisfied together. Displayed in scheduling errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incompatibility {
    /// A custom label the receiver does not define (with an optional typo hint).
    UndefinedLabel { key: String, hint: Option<String> },
    /// Both define the key but no value satisfies both.
    Conflict {
        key: String,
        incoming: String,
        existing: String,
    },
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Incompatibility::UndefinedLabel { key, hint } => {
                write!(f, "label {key:?} does not have known values")?;
                if let Some(h) = hint {
                    write!(f, " (typo of {h:?}?)")?;
                }
                Ok(())
            }
            Incompatibility::Conflict {
                key,
                incoming,
                existing,
            } => write!(
                f,
                "requirement {key} conflicts: {incoming} not in {existing}"
            ),
        }
    }
}

/// A set of requirements, one per key, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Requirements {
    items: Vec<Requirement>,
}

impl Requirements {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requirements on one key meet (as [`Requirements::add`] meets them, in the order given).
    /// Collected, then sorted: the vector holds as many requirements as were given, where
    /// inserting one by one doubled it (a Node's ~17 labels took room for 32, ~3 MB per
    /// scheduler built over 1 000 nodes).
    pub fn from_requirements(reqs: impl IntoIterator<Item = Requirement>) -> Self {
        let mut items: Vec<Requirement> = reqs.into_iter().collect();
        // Stable, so a key's requirements stay in the order given.
        items.sort_by(|a, b| a.key.cmp(&b.key));
        // `dedup_by` hands the later element first; the earlier one is kept and narrowed.
        items.dedup_by(|later, earlier| {
            if later.key != earlier.key {
                return false;
            }
            *earlier = earlier.intersection(later);
            true
        });
        Self { items }
    }

    /// Each label becomes `key In [value]`.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        Self::from_requirements(
            labels
                .into_iter()
                .map(|(k, v)| Requirement::in_values(k, [v.clone()])),
        )
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.items.iter()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.items.binary_search_by(|r| r.key.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.position(key).ok().map(|i| &self.items[i])
    }

    pub fn has(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Adds a requirement, intersecting with any existing one for the same key.
    pub fn add(&mut self, r: Requirement) {
        match self.position(&r.key) {
            Ok(i) => {
                let merged = self.items[i].intersection(&r);
                self.items[i] = merged;
            }
            Err(i) => self.items.insert(i, r),
        }
    }

    /// Replaces (not intersects) the requirement for the key.
    pub fn set(&mut self, r: Requirement) {
        match self.position(&r.key) {
            Ok(i) => self.items[i] = r,
            Err(i) => self.items.insert(i, r),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Requirement> {
        self.position(key).ok().map(|i| self.items.remove(i))
    }

    pub fn add_all(&mut self, other: &Requirements) {
        for r in &other.items {
            self.add(r.clone());
        }
    }

    pub fn intersection(&self, other: &Requirements) -> Requirements {
        let mut out = self.clone();
        out.add_all(other);
        out
    }

    /// Upstream `Intersects`: every key defined on both sides must overlap
    /// (two negative requirements never conflict).
    pub fn intersects(&self, incoming: &Requirements) -> Result<(), Incompatibility> {
        for r in &incoming.items {
            if let Some(existing) = self.get(&r.key)
                && !existing.intersects(r)
            {
                return Err(Incompatibility::Conflict {
                    key: r.key.clone(),
                    incoming: r.to_string(),
                    existing: existing.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Upstream `Compatible`: like `intersects`, and every incoming key the receiver does not define
    /// is an error unless the incoming requirement is negative, or (when `well_known` is given)
    /// the key is a well-known label.
    pub fn compatible(
        &self,
        incoming: &Requirements,
        well_known: Option<&WellKnownLabels>,
    ) -> Result<(), Incompatibility> {
        for r in &incoming.items {
            if self.has(&r.key)
                || matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist)
                || well_known.is_some_and(|w| w.contains(&r.key))
            {
                continue;
            }
            return Err(Incompatibility::UndefinedLabel {
                key: r.key.clone(),
                hint: self.label_hint(&r.key, well_known),
            });
        }
        self.intersects(incoming)
    }

    fn label_hint(&self, key: &str, well_known: Option<&WellKnownLabels>) -> Option<String> {
        let similar = |known: &str| {
            known.contains(key)
                || known.ends_with(key)
                || edit_distance(key, known) <= (known.len() / 5).max(1)
        };
        let mut candidates: Vec<&str> = well_known.map(|w| w.iter().collect()).unwrap_or_default();
        candidates.sort_unstable();
        candidates.extend(self.items.iter().map(|r| r.key.as_str()));
        candidates
            .into_iter()
            .filter(|k| *k != key && similar(k))
            .min_by_key(|k| edit_distance(key, k))
            .map(str::to_string)
    }

    /// Keys with a `minValues`.
    pub fn has_min_values(&self) -> bool {
        self.items.iter().any(|r| r.min_values.is_some())
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Requirement> {
        self.position(key).ok().map(|i| &mut self.items[i])
    }
}

impl fmt::Display for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.items.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Levenshtein distance, for typo hints.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values.iter().copied()).unwrap()
    }

    #[test]
    fn operators_map_to_sets_and_bounds() {
        assert!(req("a", Operator::In, &["x", "y"]).has("x"));
        assert!(!req("a", Operator::NotIn, &["x"]).has("x"));
        assert!(req("a", Operator::Exists, &[]).has("anything"));
        assert!(!req("a", Operator::DoesNotExist, &[]).has("x"));
        let gt = req("cpu", Operator::Gt, &["4"]);
        assert!(gt.has("5") && !gt.has("4") && !gt.has("abc"));
        let lt = req("cpu", Operator::Lt, &["4"]);
        assert!(lt.has("3") && !lt.has("4"));
        assert_eq!(
            req("cpu", Operator::Gt, &[&i64::MAX.to_string()]).operator(),
            Operator::DoesNotExist
        );
        assert!(Requirement::new("a", Operator::Gt, ["x"]).is_err());
        assert!(Requirement::new("a", Operator::In, Vec::<String>::new()).is_err());
        assert!(Operator::parse("Sometimes").is_err());
    }

    #[test]
    fn requirements_on_one_key_meet_and_take_no_spare_room() {
        // A Node's labels, a deprecated alias among them (normalised to the same key).
        let mut labels: BTreeMap<String, String> = (0..16)
            .map(|i| (format!("example.com/label-{i:02}"), format!("v{i}")))
            .collect();
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        labels.insert("beta.kubernetes.io/arch".into(), "amd64".into());
        let reqs = Requirements::from_labels(&labels);
        assert_eq!(reqs.len(), 17, "the alias meets its key");
        assert_eq!(reqs.get("kubernetes.io/arch").unwrap().values(), ["amd64"]);
        let keys: Vec<&str> = reqs.iter().map(Requirement::key).collect();
        assert!(keys.is_sorted(), "{keys:?}");
        // One by one, 18 inserts doubled the vector to room for 32.
        assert!(
            reqs.items.capacity() <= labels.len(),
            "{}",
            reqs.items.capacity()
        );

        // Later requirements narrow earlier ones on the same key, whatever their place.
        let met = Requirements::from_requirements([
            req("zone", Operator::In, &["a", "b", "c"]),
            req("arch", Operator::Exists, &[]),
            req("zone", Operator::NotIn, &["a"]),
            req("zone", Operator::In, &["b", "d"]),
        ]);
        assert_eq!(met.len(), 2);
        assert_eq!(met.get("zone").unwrap().values(), ["b"]);
        let conflict = Requirements::from_requirements([
            req("zone", Operator::In, &["a"]),
            req("zone", Operator::In, &["b"]),
        ]);
        assert!(!conflict.get("zone").unwrap().has("a") && !conflict.get("zone").unwrap().has("b"));
    }

    #[test]
    fn intersection_follows_set_algebra() {
        let i = req("a", Operator::In, &["x", "y", "z"]).intersection(&req(
            "a",
            Operator::NotIn,
            &["y"],
        ));
        assert_eq!(i.values(), ["x", "z"]);
        assert!(!i.is_complement());
        let bounds = req("n", Operator::Gt, &["2"]).intersection(&req("n", Operator::Lt, &["6"]));
        assert!(bounds.has("3") && bounds.has("5") && !bounds.has("6") && !bounds.has("2"));
        let empty = req("n", Operator::Gt, &["6"]).intersection(&req("n", Operator::Lt, &["2"]));
        assert_eq!(empty.operator(), Operator::DoesNotExist);
        let concrete =
            req("n", Operator::In, &["1", "4", "9"]).intersection(&req("n", Operator::Gt, &["3"]));
        assert_eq!(concrete.values(), ["4", "9"]);
        let min = req("a", Operator::In, &["x"])
            .with_min_values(Some(2))
            .intersection(&req("a", Operator::Exists, &[]).with_min_values(Some(3)));
        assert_eq!(min.min_values(), Some(3));
    }

    #[test]
    fn negative_requirements_never_conflict() {
        let a = req("a", Operator::NotIn, &["x"]);
        let b = req("a", Operator::DoesNotExist, &[]);
        assert!(a.intersects(&b));
        assert!(!req("a", Operator::Exists, &[]).intersects(&b));
        assert!(!req("a", Operator::In, &["x"]).intersects(&req("a", Operator::In, &["y"])));
    }

    #[test]
    fn compatible_requires_custom_labels_to_be_defined() {
        let wk = WellKnownLabels::default();
        let pool = Requirements::from_requirements([req("team", Operator::In, &["a"])]);
        let pod = Requirements::from_requirements([req("teem", Operator::In, &["a"])]);
        let err = pool.compatible(&pod, Some(&wk)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label \"teem\" does not have known values (typo of \"team\"?)"
        );
        let zone = Requirements::from_requirements([req(
            "topology.kubernetes.io/zone",
            Operator::In,
            &["z1"],
        )]);
        assert!(pool.compatible(&zone, Some(&wk)).is_ok());
        assert!(pool.compatible(&zone, None).is_err());
        let not_in = Requirements::from_requirements([req("other", Operator::NotIn, &["a"])]);
        assert!(pool.compatible(&not_in, Some(&wk)).is_ok());
        let conflict = Requirements::from_requirements([req("team", Operator::In, &["b"])]);
        assert!(matches!(
            pool.compatible(&conflict, Some(&wk)),
            Err(Incompatibility::Conflict { .. })
        ));
    }

    #[test]
    fn serialises_bounds_as_gte_and_lte() {
        let r = req("n", Operator::Gt, &["2"]).intersection(&req("n", Operator::Lt, &["6"]));
        let terms = r.to_node_selector_terms();
        assert_eq!(terms.len(), 2);
        assert_eq!(terms[0].1, Operator::Gte);
        assert_eq!(terms[0].2, ["3"]);
        assert_eq!(terms[1].1, Operator::Lte);
        assert_eq!(r.any_value().as_deref(), Some("3"));
    }

    #[test]
    fn aliases_are_normalised() {
        let r = req(
            "failure-domain.beta.kubernetes.io/zone",
            Operator::In,
            &["z"],
        );
        assert_eq!(r.key(), "topology.kubernetes.io/zone");
    }
}
