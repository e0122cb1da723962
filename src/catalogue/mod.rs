//! The one embedded Exoscale catalogue: instance families and sizes, zones and public list
//! prices. The simulated cloud, `simulate` and the pricing provider all read it.
//!
//! Prices come from the public price dump the Go provider embeds (`data/exoscale-prices.json`).
//! Unlike the Go provider, the key for a type is computed from its family and size (never by
//! suffix-matching keys in map order), so `*.extra-large` always gets its price.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

const CATALOGUE_JSON: &str = include_str!("../../data/exoscale-catalogue.json");
const PRICES_JSON: &str = include_str!("../../data/exoscale-prices.json");

/// One instance type, `family.size`, as the API would report it plus provenance notes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CatalogueInstanceType {
    pub family: String,
    pub size: String,
    /// Real instance-type UUID where known, otherwise a stable generated one (listed in `estimated`).
    pub id: String,
    pub cpus: u32,
    /// Bytes, as the API reports it.
    pub memory: u64,
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    pub zones: Vec<String>,
    pub authorized: bool,
    /// Fields whose values Exoscale does not publish; invented for simulation.
    #[serde(default)]
    pub estimated: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CatalogueInstanceType {
    /// The name clients use: `family.size`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.family, self.size)
    }

    pub fn is_estimated(&self, field: &str) -> bool {
        self.estimated.iter().any(|f| f == field)
    }

    pub fn available_in(&self, zone: &str) -> bool {
        self.zones.iter().any(|z| z == zone)
    }
}

/// Currencies of the public price list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Currency {
    Eur,
    Chf,
    Usd,
}

impl Currency {
    pub const ALL: [Currency; 3] = [Currency::Eur, Currency::Chf, Currency::Usd];

    fn key(self) -> &'static str {
        match self {
            Currency::Eur => "eur",
            Currency::Chf => "chf",
            Currency::Usd => "usd",
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key().to_uppercase())
    }
}

impl std::str::FromStr for Currency {
    type Err = CatalogueError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "eur" => Ok(Currency::Eur),
            "chf" => Ok(Currency::Chf),
            "usd" => Ok(Currency::Usd),
            _ => Err(CatalogueError::UnknownCurrency(s.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error("invalid catalogue data: {0}")]
    Json(#[from] serde_json::Error),
    #[error("price list entry {key}={value:?} in {currency} is not a number")]
    BadPrice {
        currency: String,
        key: String,
        value: String,
    },
    #[error("unknown currency {0:?} (expected EUR, CHF or USD)")]
    UnknownCurrency(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct CatalogueFile {
    zones: Vec<String>,
    instance_types: Vec<CatalogueInstanceType>,
}

/// Instance types, zones and list prices (per hour).
#[derive(Debug, Clone)]
pub struct Catalogue {
    zones: Vec<String>,
    instance_types: Vec<CatalogueInstanceType>,
    /// family → size → currency → price per hour (nested so lookups need no allocation).
    prices: BTreeMap<String, BTreeMap<String, BTreeMap<Currency, f64>>>,
}

impl Catalogue {
    /// The catalogue compiled into the binary. Parsed once.
    pub fn embedded() -> &'static Catalogue {
        static EMBEDDED: OnceLock<Catalogue> = OnceLock::new();
        EMBEDDED.get_or_init(|| {
            Catalogue::parse(CATALOGUE_JSON, PRICES_JSON)
                .expect("the embedded catalogue is checked by unit tests")
        })
    }

    /// Builds a catalogue from the catalogue JSON and a price list in the portal's format
    /// (`{"eur": {"running_<family>_<size>": "0.1"}, ...}`).
    pub fn parse(catalogue_json: &str, prices_json: &str) -> Result<Catalogue, CatalogueError> {
        let file: CatalogueFile = serde_json::from_str(catalogue_json)?;
        let raw: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_str(prices_json)?;
        let mut prices: BTreeMap<String, BTreeMap<String, BTreeMap<Currency, f64>>> =
            BTreeMap::new();
        for currency in Currency::ALL {
            let Some(table) = raw.get(currency.key()) else {
                continue;
            };
            for it in &file.instance_types {
                let Some(key) = price_key(&it.family, &it.size) else {
                    continue;
                };
                let Some(value) = table.get(&key) else {
                    continue;
                };
                let price: f64 = value.parse().map_err(|_| CatalogueError::BadPrice {
                    currency: currency.to_string(),
                    key: key.clone(),
                    value: value.clone(),
                })?;
                prices
                    .entry(it.family.clone())
                    .or_default()
                    .entry(it.size.clone())
                    .or_default()
                    .insert(currency, price);
            }
        }
        Ok(Catalogue {
            zones: file.zones,
            instance_types: file.instance_types,
            prices,
        })
    }

    pub fn zones(&self) -> &[String] {
        &self.zones
    }

    pub fn instance_types(&self) -> &[CatalogueInstanceType] {
        &self.instance_types
    }

    /// Looks a type up by `family.size`.
    pub fn instance_type(&self, name: &str) -> Option<&CatalogueInstanceType> {
        let (family, size) = name.split_once('.')?;
        self.instance_types
            .iter()
            .find(|t| t.family == family && t.size == size)
    }

    pub fn instance_type_by_id(&self, id: &str) -> Option<&CatalogueInstanceType> {
        self.instance_types.iter().find(|t| t.id == id)
    }

    /// Types offered in `zone` (authorized or not).
    pub fn instance_types_in_zone<'a>(
        &'a self,
        zone: &'a str,
    ) -> impl Iterator<Item = &'a CatalogueInstanceType> + 'a {
        self.instance_types
            .iter()
            .filter(move |t| t.available_in(zone))
    }

    /// Public list price per hour, or `None` when Exoscale publishes no price for the type.
    pub fn price(&self, family: &str, size: &str, currency: Currency) -> Option<f64> {
        self.prices.get(family)?.get(size)?.get(&currency).copied()
    }

    /// Same as [`Catalogue::price`] for a `family.size` name.
    pub fn price_by_name(&self, name: &str, currency: Currency) -> Option<f64> {
        let (family, size) = name.split_once('.')?;
        self.price(family, size, currency)
    }
}

/// The price-list key of a type: `running_[<family>_]<size>` with `-` written `_`.
/// `None` for families the list does not cover. The bare `gpu_*` keys are the first GPU
/// generation ("GPU1" in the price table), so they map to family `gpu`.
pub fn price_key(family: &str, size: &str) -> Option<String> {
    let prefix = match family {
        "standard" => "",
        "cpu" => "cpu_",
        "memory" => "memory_",
        "storage" => "storage_",
        "gpu" => "gpu_",
        "gpu2" => "gpu2_",
        "gpu3" => "gpu3_",
        "gpua5000" => "gpu_a5000_",
        "gpu3080ti" => "gpu_3080ti_",
        _ => return None,
    };
    Some(format!("running_{prefix}{}", size.replace('-', "_")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalogue_parses_and_has_every_family_of_the_api_enum() {
        let c = Catalogue::embedded();
        assert_eq!(c.zones().len(), 8);
        let families: std::collections::BTreeSet<_> = c
            .instance_types()
            .iter()
            .map(|t| t.family.as_str())
            .collect();
        for f in [
            "colossus",
            "cpu",
            "gpu",
            "gpu2",
            "gpu3",
            "gpu3080ti",
            "gpua30",
            "gpua5000",
            "gpub300",
            "gpurtx6000pro",
            "memory",
            "standard",
            "storage",
        ] {
            assert!(families.contains(f), "family {f} missing");
        }
        let sizes: std::collections::BTreeSet<_> =
            c.instance_types().iter().map(|t| t.size.as_str()).collect();
        assert_eq!(sizes.len(), 12, "every size of the API enum: {sizes:?}");
    }

    #[test]
    fn ids_and_names_are_unique_and_zones_known() {
        let c = Catalogue::embedded();
        let mut ids = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for t in c.instance_types() {
            assert!(ids.insert(t.id.clone()), "duplicate id {}", t.id);
            assert!(names.insert(t.name()), "duplicate name {}", t.name());
            assert!(uuid::Uuid::parse_str(&t.id).is_ok());
            assert!(t.cpus > 0 && t.memory > 0);
            assert_eq!(t.gpus > 0, t.family.starts_with("gpu"), "{}", t.name());
            for z in &t.zones {
                assert!(c.zones().contains(z), "{} lists unknown zone {z}", t.name());
            }
        }
    }

    #[test]
    fn published_values_match_the_reference_table() {
        let c = Catalogue::embedded();
        let t = c.instance_type("standard.medium").unwrap();
        assert_eq!((t.cpus, t.memory, t.gpus), (2, 4 << 30, 0));
        assert_eq!(t.id, "b6e9d1e8-89fc-4db3-aaa4-9b4c5b1d0844");
        assert!(t.estimated.is_empty());
        let t = c.instance_type("gpu3.huge").unwrap();
        assert_eq!((t.cpus, t.memory, t.gpus), (96, 448 << 30, 8));
        assert_eq!(t.zones, vec!["de-fra-1"]);
        assert!(!t.authorized);
        let t = c.instance_type("gpua5000.small").unwrap();
        assert!(t.is_estimated("cpus") && t.is_estimated("memory"));
        assert!(c.instance_type("standard.nope").is_none());
        assert!(c.instance_type_by_id(&t.id).is_some());
    }

    #[test]
    fn extra_large_is_priced_deterministically_in_every_currency() {
        let c = Catalogue::embedded();
        for currency in Currency::ALL {
            assert_eq!(c.price("standard", "extra-large", currency), Some(0.18667));
            assert_eq!(c.price("cpu", "extra-large", currency), Some(0.23333));
            assert_eq!(c.price("memory", "extra-large", currency), Some(0.14));
            assert_eq!(c.price("storage", "extra-large", currency), Some(0.14));
            assert_eq!(c.price("standard", "large", currency), Some(0.09333));
        }
        assert_eq!(c.price_by_name("gpu.small", Currency::Eur), Some(1.16806));
        assert_eq!(
            c.price_by_name("gpua5000.large", Currency::Chf),
            Some(4.55694)
        );
        assert_eq!(
            c.price_by_name("gpu3080ti.medium", Currency::Usd),
            Some(1.70868)
        );
        assert_eq!(c.price_by_name("gpurtx6000pro.small", Currency::Eur), None);
    }

    #[test]
    fn every_running_price_key_maps_to_exactly_one_catalogue_type() {
        let c = Catalogue::embedded();
        let raw: BTreeMap<String, BTreeMap<String, String>> =
            serde_json::from_str(PRICES_JSON).unwrap();
        for (currency, table) in &raw {
            for key in table.keys().filter(|k| k.starts_with("running_")) {
                let owners: Vec<_> = c
                    .instance_types()
                    .iter()
                    .filter(|t| price_key(&t.family, &t.size).as_deref() == Some(key))
                    .collect();
                assert_eq!(owners.len(), 1, "{currency}/{key} maps to {owners:?}");
            }
        }
    }

    #[test]
    fn every_type_with_a_price_key_in_the_list_is_priced() {
        let c = Catalogue::embedded();
        let priced = c
            .instance_types()
            .iter()
            .filter(|t| c.price(&t.family, &t.size, Currency::Eur).is_some())
            .count();
        // 11 standard + 4 cpu + 4 memory + 5 storage + 3×4 gpu/gpu2/gpu3 + 3 + 3 = 42
        assert_eq!(priced, 42);
    }

    #[test]
    fn bad_prices_are_reported_with_their_key() {
        let err = Catalogue::parse(CATALOGUE_JSON, r#"{"eur":{"running_tiny":"cheap"}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("running_tiny") && err.contains("cheap"),
            "{err}"
        );
        assert!("gbp".parse::<Currency>().is_err());
        assert_eq!("EUR".parse::<Currency>().unwrap(), Currency::Eur);
    }
}
