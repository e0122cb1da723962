//! Taints and tolerations with Kubernetes matching semantics.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "NoSchedule" => Some(Self::NoSchedule),
            "PreferNoSchedule" => Some(Self::PreferNoSchedule),
            "NoExecute" => Some(Self::NoExecute),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

impl Taint {
    pub fn new(key: &str, value: &str, effect: TaintEffect) -> Self {
        Self {
            key: key.to_string(),
            value: value.to_string(),
            effect,
        }
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{:?}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{:?}", self.key, self.value, self.effect)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TolerationOperator {
    #[default]
    Equal,
    Exists,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Toleration {
    /// Empty with `Exists` tolerates every key.
    pub key: String,
    pub operator: TolerationOperator,
    pub value: String,
    /// `None` tolerates every effect.
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn exists(key: &str, effect: Option<TaintEffect>) -> Self {
        Self {
            key: key.to_string(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect,
        }
    }

    pub fn equal(key: &str, value: &str, effect: Option<TaintEffect>) -> Self {
        Self {
            key: key.to_string(),
            operator: TolerationOperator::Equal,
            value: value.to_string(),
            effect,
        }
    }

    /// Kubernetes `ToleratesTaint`.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => true,
            TolerationOperator::Equal => !self.key.is_empty() && self.value == taint.value,
        }
    }
}

/// The first taint not tolerated, if any. `ignore_prefer_no_schedule` treats soft taints as tolerated.
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    ignore_prefer_no_schedule: bool,
) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        let soft = ignore_prefer_no_schedule && t.effect == TaintEffect::PreferNoSchedule;
        !soft && !tolerations.iter().any(|tol| tol.tolerates(t))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toleration_matching_follows_kubernetes() {
        let t = Taint::new("dedicated", "gpu", TaintEffect::NoSchedule);
        assert!(Toleration::equal("dedicated", "gpu", None).tolerates(&t));
        assert!(!Toleration::equal("dedicated", "cpu", None).tolerates(&t));
        assert!(Toleration::exists("dedicated", Some(TaintEffect::NoSchedule)).tolerates(&t));
        assert!(!Toleration::exists("dedicated", Some(TaintEffect::NoExecute)).tolerates(&t));
        assert!(Toleration::exists("", None).tolerates(&t));
        assert!(!Toleration::equal("", "", None).tolerates(&t));
        let soft = Taint::new("soft", "", TaintEffect::PreferNoSchedule);
        let taints = [t.clone(), soft.clone()];
        assert_eq!(first_untolerated(&taints, &[], false), Some(&t));
        let tol = [Toleration::exists("dedicated", None)];
        assert_eq!(first_untolerated(&taints, &tol, false), Some(&soft));
        assert_eq!(first_untolerated(&taints, &tol, true), None);
        assert_eq!(soft.to_string(), "soft:PreferNoSchedule");
    }
}
