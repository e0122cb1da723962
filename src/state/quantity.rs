//! Just enough Kubernetes quantity arithmetic for summing capacities: values in thousandths.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::apis::ResourceList;

/// Parses a quantity (`100m`, `2`, `1.5Gi`, `1e3`) into thousandths of its unit; `None` when
/// malformed.
pub fn parse_milli(value: &str) -> Option<i128> {
    // One quantity parser for the whole program: the scheduler's exact milli-unit arithmetic.
    crate::scheduling::Quantity::parse(value.trim())
        .ok()
        .map(|q| q.milli())
}

/// Formats thousandths back into a quantity string.
pub fn format_milli(milli: i128) -> Quantity {
    if milli % 1000 == 0 {
        Quantity((milli / 1000).to_string())
    } else {
        Quantity(format!("{milli}m"))
    }
}

/// Adds `list` into `total` (unparsable values are skipped).
pub fn add_into(total: &mut BTreeMap<String, i128>, list: &ResourceList) {
    for (name, quantity) in list {
        if let Some(milli) = parse_milli(&quantity.0) {
            *total.entry(name.clone()).or_default() += milli;
        }
    }
}

/// Converts summed thousandths into a resource list.
pub fn to_resource_list(total: &BTreeMap<String, i128>) -> ResourceList {
    total
        .iter()
        .map(|(name, milli)| (name.clone(), format_milli(*milli)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("1Ki"), Some(1_024_000));
        assert_eq!(parse_milli("1.5Gi"), Some(1_610_612_736_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("abc"), None);
        assert_eq!(parse_milli("1Qi"), None);
    }

    #[test]
    fn sums_and_formats() {
        let mut total = BTreeMap::new();
        let list: ResourceList = [
            ("cpu".to_string(), Quantity("500m".into())),
            ("memory".to_string(), Quantity("1Gi".into())),
        ]
        .into();
        add_into(&mut total, &list);
        add_into(&mut total, &list);
        let out = to_resource_list(&total);
        assert_eq!(out["cpu"].0, "1");
        assert_eq!(out["memory"].0, "2147483648");
        assert_eq!(format_milli(1500).0, "1500m");
    }
}
