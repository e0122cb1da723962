//! Prices per hour for instance types: the embedded public list (`catalogue`) in EUR, CHF or
//! USD, overridable for negotiated prices or discounts, plus NodeOverlay price adjustments.
//!
//! A type the list does not price is never silently made "infinitely expensive": it gets a
//! deliberately pessimistic estimate from the list's highest per-GPU / per-vCPU / per-GiB rates
//! and is reported (see [`PriceBook::unpriced`]), so an operator can add an override.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

use crate::catalogue::{Catalogue, Currency};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PricingError {
    #[error("price overrides are not valid YAML/JSON: {0}")]
    Parse(String),
    #[error("price override for {name:?} must be a non-negative number, got {value}")]
    BadPrice { name: String, value: f64 },
    #[error("price override key {0:?} is not an instance type name family.size")]
    BadName(String),
    #[error("discountPercent must be between 0 and 100, got {0}")]
    BadDiscount(f64),
    #[error("{0}")]
    Currency(String),
    #[error("invalid price adjustment {0:?}: expected +N, -N, +N% or -N% (at most -100%)")]
    BadAdjustment(String),
    #[error("invalid overlay price {0:?}: expected a non-negative decimal")]
    BadOverlayPrice(String),
}

/// Where a price came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriceSource {
    /// The public list (after any discount).
    List,
    /// An explicit operator override.
    Override,
    /// Not in the list and not overridden: a pessimistic estimate.
    Estimated,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    pub per_hour: f64,
    pub source: PriceSource,
}

/// Operator-supplied prices: a file or the data key of a ConfigMap, YAML or JSON.
///
/// ```yaml
/// currency: CHF            # optional; the configured currency otherwise
/// discountPercent: 12.5    # optional; applied to list prices
/// prices:                  # optional; exact prices per hour, win over list and discount
///   standard.medium: 0.04
/// ```
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceOverrides {
    #[serde(default)]
    pub currency: Option<String>,
    #[serde(default)]
    pub discount_percent: Option<f64>,
    #[serde(default)]
    pub prices: BTreeMap<String, f64>,
}

impl PriceOverrides {
    pub fn parse(text: &str) -> Result<Self, PricingError> {
        let o: PriceOverrides =
            serde_yaml_ng::from_str(text).map_err(|e| PricingError::Parse(e.to_string()))?;
        o.validate()?;
        Ok(o)
    }

    /// Reads overrides from a file (e.g. a mounted ConfigMap key).
    pub fn from_file(path: &std::path::Path) -> Result<Self, PricingError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PricingError::Parse(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// Reads overrides from the `key` of a ConfigMap.
    pub fn from_configmap(
        cm: &k8s_openapi::api::core::v1::ConfigMap,
        key: &str,
    ) -> Result<Self, PricingError> {
        let name = cm.metadata.name.as_deref().unwrap_or_default();
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| PricingError::Parse(format!("ConfigMap {name} has no key {key}")))?;
        Self::parse(text)
    }

    fn validate(&self) -> Result<(), PricingError> {
        if let Some(d) = self.discount_percent
            && !(0.0..=100.0).contains(&d)
        {
            return Err(PricingError::BadDiscount(d));
        }
        for (name, value) in &self.prices {
            if !name.contains('.') || name.starts_with('.') || name.ends_with('.') {
                return Err(PricingError::BadName(name.clone()));
            }
            if !value.is_finite() || *value < 0.0 {
                return Err(PricingError::BadPrice {
                    name: name.clone(),
                    value: *value,
                });
            }
        }
        if let Some(c) = &self.currency {
            c.parse::<Currency>()
                .map_err(|e| PricingError::Currency(e.to_string()))?;
        }
        Ok(())
    }
}

/// The resources a price estimate is based on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub cpus: u32,
    pub memory_bytes: u64,
    pub gpus: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Rates {
    per_cpu: f64,
    per_gib: f64,
    per_gpu: f64,
}

/// Prices in one currency for every type of the catalogue or the API.
#[derive(Clone, Debug)]
pub struct PriceBook {
    currency: Currency,
    list: BTreeMap<String, f64>,
    overrides: BTreeMap<String, f64>,
    discount: f64,
    rates: Rates,
}

const GIB: f64 = (1u64 << 30) as f64;

impl PriceBook {
    /// List prices of the embedded catalogue in `currency`.
    pub fn new(currency: Currency) -> Self {
        Self::from_catalogue(Catalogue::embedded(), currency)
    }

    pub fn from_catalogue(catalogue: &Catalogue, currency: Currency) -> Self {
        let mut list = BTreeMap::new();
        let mut rates = Rates::default();
        for t in catalogue.instance_types() {
            let Some(p) = catalogue.price(&t.family, &t.size, currency) else {
                continue;
            };
            list.insert(t.name(), p);
            if t.gpus > 0 {
                rates.per_gpu = rates.per_gpu.max(p / t.gpus as f64);
            } else {
                rates.per_cpu = rates.per_cpu.max(p / t.cpus.max(1) as f64);
                rates.per_gib = rates.per_gib.max(p / (t.memory as f64 / GIB).max(0.5));
            }
        }
        PriceBook {
            currency,
            list,
            overrides: BTreeMap::new(),
            discount: 0.0,
            rates,
        }
    }

    /// Applies operator overrides; their `currency` (if any) switches the list currency.
    pub fn with_overrides(
        catalogue: &Catalogue,
        currency: Currency,
        overrides: &PriceOverrides,
    ) -> Result<Self, PricingError> {
        overrides.validate()?;
        let currency = match &overrides.currency {
            Some(c) => c
                .parse::<Currency>()
                .map_err(|e| PricingError::Currency(e.to_string()))?,
            None => currency,
        };
        let mut book = Self::from_catalogue(catalogue, currency);
        book.discount = overrides.discount_percent.unwrap_or(0.0) / 100.0;
        book.overrides = overrides.prices.clone();
        Ok(book)
    }

    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// The price of `name` (`family.size`) with the given shape.
    pub fn price(&self, name: &str, shape: Shape) -> Price {
        if let Some(p) = self.overrides.get(name) {
            return Price {
                per_hour: *p,
                source: PriceSource::Override,
            };
        }
        if let Some(p) = self.list.get(name) {
            return Price {
                per_hour: p * (1.0 - self.discount),
                source: PriceSource::List,
            };
        }
        Price {
            per_hour: self.estimate(shape) * (1.0 - self.discount),
            source: PriceSource::Estimated,
        }
    }

    /// Highest list rate per GPU, else the higher of per-vCPU and per-GiB rates: an upper
    /// bound so an estimated type is never preferred over a comparable listed one.
    fn estimate(&self, shape: Shape) -> f64 {
        let r = self.rates;
        let base = (r.per_cpu * shape.cpus as f64).max(r.per_gib * shape.memory_bytes as f64 / GIB);
        base + r.per_gpu * shape.gpus as f64
    }

    /// Names among `names` that have neither a list price nor an override.
    pub fn unpriced<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        names
            .into_iter()
            .filter(|n| !self.overrides.contains_key(*n) && !self.list.contains_key(*n))
            .map(str::to_string)
            .collect()
    }
}

/// A NodeOverlay `priceAdjustment`: `+0.5`, `-0.1`, `+10%`, `-25%`. Never below zero.
pub fn apply_price_adjustment(price: f64, adjustment: &str) -> Result<f64, PricingError> {
    let bad = || PricingError::BadAdjustment(adjustment.to_string());
    let a = adjustment.trim();
    let (sign, rest) = match a.chars().next() {
        Some('+') => (1.0, &a[1..]),
        Some('-') => (-1.0, &a[1..]),
        _ => return Err(bad()),
    };
    let (number, percent) = match rest.strip_suffix('%') {
        Some(n) => (n, true),
        None => (rest, false),
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 || number.starts_with(['+', '-']) {
        return Err(bad());
    }
    let out = if percent {
        if sign < 0.0 && n > 100.0 {
            return Err(bad());
        }
        price * (1.0 + sign * n / 100.0)
    } else {
        price + sign * n
    };
    Ok(out.max(0.0))
}

/// A NodeOverlay absolute `price`.
pub fn parse_overlay_price(price: &str) -> Result<f64, PricingError> {
    price
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| p.is_finite() && *p >= 0.0)
        .ok_or_else(|| PricingError::BadOverlayPrice(price.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(name: &str) -> Shape {
        let t = Catalogue::embedded().instance_type(name).unwrap();
        Shape {
            cpus: t.cpus,
            memory_bytes: t.memory,
            gpus: t.gpus,
        }
    }

    #[test]
    fn every_catalogue_type_has_a_price_and_listed_ones_come_from_the_list() {
        let c = Catalogue::embedded();
        for currency in Currency::ALL {
            let book = PriceBook::new(currency);
            for t in c.instance_types() {
                let p = book.price(&t.name(), shape(&t.name()));
                assert!(p.per_hour.is_finite() && p.per_hour > 0.0, "{}", t.name());
                let listed = c.price(&t.family, &t.size, currency);
                match listed {
                    Some(l) => assert_eq!(
                        p,
                        Price {
                            per_hour: l,
                            source: PriceSource::List
                        }
                    ),
                    None => assert_eq!(p.source, PriceSource::Estimated, "{}", t.name()),
                }
            }
        }
    }

    #[test]
    fn extra_large_sizes_are_list_priced() {
        let book = PriceBook::new(Currency::Eur);
        for (name, eur) in [
            ("standard.extra-large", 0.18667),
            ("cpu.extra-large", 0.23333),
            ("memory.extra-large", 0.14),
            ("storage.extra-large", 0.14),
        ] {
            assert_eq!(book.price(name, shape(name)).per_hour, eur, "{name}");
        }
    }

    #[test]
    fn estimates_are_pessimistic_and_reported() {
        let book = PriceBook::new(Currency::Eur);
        let a30 = book.price("gpua30.small", shape("gpua30.small"));
        assert_eq!(a30.source, PriceSource::Estimated);
        let listed_single_gpu = book.price("gpu3.small", shape("gpu3.small")).per_hour;
        assert!(a30.per_hour >= listed_single_gpu, "{a30:?}");
        let unpriced = book.unpriced(["standard.medium", "gpua30.small", "gpub300.huge"]);
        assert_eq!(unpriced, vec!["gpua30.small", "gpub300.huge"]);
    }

    #[test]
    fn overrides_win_and_discounts_apply_to_list_prices() {
        let o = PriceOverrides::parse(
            "currency: chf\ndiscountPercent: 10\nprices:\n  standard.medium: 0.01\n  gpua30.small: 1.5\n",
        )
        .unwrap();
        let book = PriceBook::with_overrides(Catalogue::embedded(), Currency::Eur, &o).unwrap();
        assert_eq!(book.currency(), Currency::Chf);
        assert_eq!(
            book.price("standard.medium", shape("standard.medium")),
            Price {
                per_hour: 0.01,
                source: PriceSource::Override
            }
        );
        let large = book
            .price("standard.large", shape("standard.large"))
            .per_hour;
        assert!((large - 0.09333 * 0.9).abs() < 1e-12, "{large}");
        assert!(book.unpriced(["gpua30.small"]).is_empty());
    }

    #[test]
    fn overrides_load_from_configmaps_and_files() {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some("prices".into());
        cm.data = Some(
            [(
                "prices.yaml".to_string(),
                "discountPercent: 5\n".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            PriceOverrides::from_configmap(&cm, "prices.yaml")
                .unwrap()
                .discount_percent,
            Some(5.0)
        );
        let e = PriceOverrides::from_configmap(&cm, "other")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prices") && e.contains("other"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prices.json");
        std::fs::write(&path, r#"{"prices": {"standard.tiny": 0.001}}"#).unwrap();
        assert_eq!(
            PriceOverrides::from_file(&path).unwrap().prices["standard.tiny"],
            0.001
        );
        assert!(PriceOverrides::from_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn bad_overrides_are_named() {
        for (text, needle) in [
            ("prices:\n  standard.medium: -1\n", "standard.medium"),
            ("prices:\n  medium: 1\n", "medium"),
            ("discountPercent: 150\n", "150"),
            ("currency: gbp\n", "gbp"),
            ("price: {}\n", "price"),
        ] {
            let e = PriceOverrides::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn overlay_adjustments_follow_upstream_syntax() {
        assert!((apply_price_adjustment(1.0, "+0.5").unwrap() - 1.5).abs() < 1e-12);
        assert!((apply_price_adjustment(1.0, "-0.1").unwrap() - 0.9).abs() < 1e-12);
        assert!((apply_price_adjustment(2.0, "+10%").unwrap() - 2.2).abs() < 1e-12);
        assert!((apply_price_adjustment(2.0, "-25%").unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(apply_price_adjustment(2.0, "-100%").unwrap(), 0.0);
        assert_eq!(apply_price_adjustment(0.1, "-1").unwrap(), 0.0);
        for bad in ["10%", "+", "-101%", "+-1", "abc", "+1.2.3"] {
            assert!(apply_price_adjustment(1.0, bad).is_err(), "{bad}");
        }
        assert_eq!(parse_overlay_price("0.25").unwrap(), 0.25);
        assert!(parse_overlay_price("-1").is_err());
    }
}
