//! Kubernetes quantities as exact integer milli-units, and resource lists built from them.
//!
//! Fit decisions compare integers only: a quantity is stored as a count of thousandths
//! (`1` CPU = `1000`, `1Ki` memory = `1_024_000`). `i128` keeps even `10000000Gi` exact.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// Error for a quantity string Kubernetes would also reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {problem}")]
pub struct QuantityError {
    pub input: String,
    pub problem: &'static str,
}

/// An exact quantity in milli-units (rounded up to the next milli-unit, as Kubernetes does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity(pub i128);

impl Quantity {
    pub const ZERO: Quantity = Quantity(0);

    pub fn from_milli(milli: i128) -> Self {
        Quantity(milli)
    }

    pub fn from_units(units: i128) -> Self {
        Quantity(units.saturating_mul(1000))
    }

    pub fn milli(self) -> i128 {
        self.0
    }

    /// Whole units, rounded up (Kubernetes `Value()`).
    pub fn units_ceil(self) -> i128 {
        self.0.div_euclid(1000) + i128::from(self.0.rem_euclid(1000) != 0)
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Parses the Kubernetes quantity grammar: an optional sign, a decimal number, and an optional
    /// binary (`Ki`..`Ei`), decimal (`n`, `u`, `m`, `k`, `M`..`E`) or exponent (`e3`) suffix.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let err = |problem| QuantityError {
            input: input.to_string(),
            problem,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err("missing or malformed number"));
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let digits: String = format!("{int_part}{frac_part}");
        let mut mantissa: i128 = 0;
        for b in digits.bytes() {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(b - b'0')))
                .ok_or_else(|| err("number too large"))?;
        }
        // value = mantissa * 10^-frac_len * multiplier; we want milli-units.
        let frac_len = frac_part.len() as i32;
        let (base2_exp, base10_exp): (u32, i32) = match suffix {
            "" => (0, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            other if other.starts_with(['e', 'E']) => {
                let exp: i32 = other[1..].parse().map_err(|_| err("malformed exponent"))?;
                if exp.abs() > 30 {
                    return Err(err("exponent out of range"));
                }
                (0, exp)
            }
            _ => return Err(err("unknown suffix")),
        };
        let numerator = mantissa
            .checked_mul(1i128 << base2_exp)
            .ok_or_else(|| err("number too large"))?;
        // milli = numerator * 10^(base10_exp + 3 - frac_len), rounded up.
        let exp10 = base10_exp + 3 - frac_len;
        let milli = if exp10 >= 0 {
            numerator
                .checked_mul(
                    10i128
                        .checked_pow(exp10 as u32)
                        .ok_or_else(|| err("number too large"))?,
                )
                .ok_or_else(|| err("number too large"))?
        } else {
            let divisor = 10i128
                .checked_pow((-exp10) as u32)
                .ok_or_else(|| err("number too small"))?;
            numerator / divisor + i128::from(numerator % divisor != 0)
        };
        Ok(Quantity(if negative { -milli } else { milli }))
    }
}

impl fmt::Display for Quantity {
    /// Whole units when exact, otherwise milli-units with an `m` suffix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % 1000 == 0 {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Saturating: quantities from manifests can be absurd, and a wrapped sum would look small.
impl Add for Quantity {
    type Output = Quantity;
    fn add(self, rhs: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(rhs.0))
    }
}

impl Sub for Quantity {
    type Output = Quantity;
    fn sub(self, rhs: Quantity) -> Quantity {
        Quantity(self.0.saturating_sub(rhs.0))
    }
}

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const PODS: &str = "pods";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Pseudo-resource used by NodePool limits to cap the number of nodes.
pub const NODES: &str = "nodes";

const WELL_KNOWN: [&str; 4] = [CPU, MEMORY, PODS, EPHEMERAL_STORAGE];

fn well_known_index(name: &str) -> Option<usize> {
    WELL_KNOWN.iter().position(|w| *w == name)
}

/// A resource list. The four well-known resources live in a fixed array so the hot fit checks
/// never allocate; extended resources (GPUs, `nodes` for limits, …) live in a small sorted vector.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Resources {
    well_known: [i128; 4],
    extended: Vec<(String, i128)>,
}

impl Resources {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a list from `(name, quantity string)` pairs; the first unparsable quantity is an error.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, QuantityError> {
        let mut r = Resources::new();
        for (name, value) in pairs {
            r.set(name, Quantity::parse(value)?);
        }
        Ok(r)
    }

    /// Shorthand for tests and fixtures: panics on a malformed literal.
    pub fn from_literals(pairs: &[(&str, &str)]) -> Self {
        Self::parse(pairs.iter().copied()).expect("valid quantity literal")
    }

    pub fn get(&self, name: &str) -> Quantity {
        match well_known_index(name) {
            Some(i) => Quantity(self.well_known[i]),
            None => self
                .extended
                .binary_search_by(|(k, _)| k.as_str().cmp(name))
                .map(|i| Quantity(self.extended[i].1))
                .unwrap_or(Quantity::ZERO),
        }
    }

    /// Whether the resource is named in this list (even at zero).
    pub fn contains(&self, name: &str) -> bool {
        match well_known_index(name) {
            Some(i) => self.well_known[i] != 0,
            None => self
                .extended
                .binary_search_by(|(k, _)| k.as_str().cmp(name))
                .is_ok(),
        }
    }

    pub fn set(&mut self, name: &str, q: Quantity) {
        match well_known_index(name) {
            Some(i) => self.well_known[i] = q.0,
            None => match self
                .extended
                .binary_search_by(|(k, _)| k.as_str().cmp(name))
            {
                Ok(i) => self.extended[i].1 = q.0,
                Err(i) => self.extended.insert(i, (name.to_string(), q.0)),
            },
        }
    }

    pub fn cpu(&self) -> Quantity {
        Quantity(self.well_known[0])
    }

    pub fn memory(&self) -> Quantity {
        Quantity(self.well_known[1])
    }

    pub fn pods(&self) -> Quantity {
        Quantity(self.well_known[2])
    }

    /// Every named resource with its quantity, well-known first (zero well-known entries skipped).
    pub fn iter(&self) -> impl Iterator<Item = (&str, Quantity)> + '_ {
        WELL_KNOWN
            .iter()
            .zip(self.well_known.iter())
            .filter(|(_, v)| **v != 0)
            .map(|(k, v)| (*k, Quantity(*v)))
            .chain(
                self.extended
                    .iter()
                    .map(|(k, v)| (k.as_str(), Quantity(*v))),
            )
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// True when every resource requested here is available in `available` (absent = zero).
    #[inline]
    pub fn fits_in(&self, available: &Resources) -> bool {
        self.well_known
            .iter()
            .zip(available.well_known.iter())
            .all(|(r, a)| r <= a)
            && self
                .extended
                .iter()
                .all(|(k, v)| *v <= 0 || *v <= available.get(k).0)
    }

    /// True when `self + extra` fits in `available`, without building the sum.
    #[inline]
    pub fn sum_fits_in(&self, extra: &Resources, available: &Resources) -> bool {
        (0..4).all(|i| {
            self.well_known[i].saturating_add(extra.well_known[i]) <= available.well_known[i]
        }) && (self.extended.is_empty() && extra.extended.is_empty()
            || self.clone().plus(extra).fits_in(available))
    }

    /// Names of the resources in `self` that exceed `available`.
    pub fn exceeding<'a>(&'a self, available: &Resources) -> Vec<&'a str> {
        self.iter()
            .filter(|(k, v)| *v > available.get(k))
            .map(|(k, _)| k)
            .collect()
    }

    pub fn plus(mut self, other: &Resources) -> Resources {
        self += other;
        self
    }

    /// Subtraction floored at zero per resource.
    pub fn saturating_minus(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        for i in 0..4 {
            out.well_known[i] = out.well_known[i].saturating_sub(other.well_known[i]).max(0);
        }
        for (k, v) in &other.extended {
            let cur = out.get(k).0;
            out.set(k, Quantity(cur.saturating_sub(*v).max(0)));
        }
        out
    }

    /// Per-resource maximum.
    pub fn max_with(&mut self, other: &Resources) {
        for i in 0..4 {
            self.well_known[i] = self.well_known[i].max(other.well_known[i]);
        }
        if other.extended.is_empty() {
            return;
        }
        for (k, v) in &other.extended {
            let cur = self.get(k).0;
            if *v > cur || !self.contains(k) {
                self.set(k, Quantity(cur.max(*v)));
            }
        }
    }

    /// Per-resource minimum over resources present in both (absent = zero).
    pub fn min_with(&mut self, other: &Resources) {
        for i in 0..4 {
            self.well_known[i] = self.well_known[i].min(other.well_known[i]);
        }
        for (k, v) in self.extended.iter_mut() {
            *v = (*v).min(other.get(k).0);
        }
    }
}

impl AddAssign<&Resources> for Resources {
    fn add_assign(&mut self, other: &Resources) {
        for i in 0..4 {
            self.well_known[i] = self.well_known[i].saturating_add(other.well_known[i]);
        }
        for (k, v) in &other.extended {
            let cur = self.get(k).0;
            self.set(k, Quantity(cur.saturating_add(*v)));
        }
    }
}

impl Resources {
    /// `self + other`, or the first resource whose sum does not fit (sums elsewhere saturate,
    /// so an absurd request can never wrap around to a small one).
    pub fn checked_plus(&self, other: &Resources) -> Result<Resources, String> {
        let mut out = self.clone();
        for (k, v) in other.iter() {
            let sum = out.get(k).0.checked_add(v.0).ok_or_else(|| k.to_string())?;
            out.set(k, Quantity(sum));
        }
        Ok(out)
    }
}

impl fmt::Display for Resources {
    /// `{cpu: 1500m, memory: 2Gi, pods: 3}`; memory-like values printed in the largest exact binary unit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            if k == CPU || k == PODS || k == NODES {
                write!(f, "{k}: {v}")?;
            } else {
                write!(f, "{k}: {}", format_bytes(v))?;
            }
        }
        write!(f, "}}")
    }
}

fn format_bytes(q: Quantity) -> String {
    if q.0 % 1000 != 0 {
        return q.to_string();
    }
    let bytes = q.0 / 1000;
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        let unit = 1i128 << shift;
        if bytes != 0 && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> i128 {
        Quantity::parse(s).unwrap().0
    }

    #[test]
    fn parses_the_kubernetes_suffixes_exactly() {
        assert_eq!(q("1"), 1000);
        assert_eq!(q("100m"), 100);
        assert_eq!(q("1.5"), 1500);
        assert_eq!(q("1Ki"), 1_024_000);
        assert_eq!(q("2Gi"), 2 * (1 << 30) * 1000);
        assert_eq!(q("1k"), 1_000_000);
        assert_eq!(q("1e3"), 1_000_000);
        assert_eq!(q("0.5Gi"), (1i128 << 29) * 1000);
        assert_eq!(q("-2"), -2000);
        assert_eq!(q("10000000Gi"), 10_000_000i128 * (1 << 30) * 1000);
    }

    #[test]
    fn sub_milli_values_round_up() {
        assert_eq!(q("1n"), 1);
        assert_eq!(q("0.0001"), 1);
        assert_eq!(q("1500u"), 2);
    }

    #[test]
    fn rejects_malformed_quantities_with_a_reason() {
        for bad in ["", "abc", "1.2.3", "1Zi", "1e", "."] {
            let e = Quantity::parse(bad).unwrap_err();
            assert_eq!(e.input, bad);
        }
    }

    #[test]
    fn resources_fit_and_sum_without_floats() {
        let node =
            Resources::from_literals(&[("cpu", "2"), ("memory", "4Gi"), ("nvidia.com/gpu", "1")]);
        let pod = Resources::from_literals(&[("cpu", "1500m"), ("memory", "1Gi")]);
        assert!(pod.fits_in(&node));
        assert!(!pod.clone().plus(&pod).fits_in(&node));
        assert_eq!(pod.clone().plus(&pod).exceeding(&node), vec!["cpu"]);
        let gpu = Resources::from_literals(&[("nvidia.com/gpu", "2")]);
        assert!(!gpu.fits_in(&node));
        assert!(pod.sum_fits_in(&Resources::from_literals(&[("cpu", "500m")]), &node));
        assert_eq!(node.to_string(), "{cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}");
    }
}
