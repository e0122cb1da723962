//! Just enough Kubernetes quantity arithmetic for summing capacities: values in thousandths.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::apis::ResourceList;

/// Parses a quantity (`100m`, `2`, `1.5Gi`, `1e3`) into thousandths of its unit; `None` when
/// malformed.
pub fn parse_milli(value: &str) -> Option<i128> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    if number.is_empty() {
        return None;
    }
    let (scale_num, scale_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().ok()?;
            (10i128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    // Exact decimal: integer part and fraction as a ratio.
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.trim_start_matches('+')),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let int: i128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    let frac_den = 10i128.checked_pow(frac_part.len() as u32)?;
    let frac: i128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().ok()?
    };
    let numerator = (int * frac_den + frac) * scale_num * 1000;
    let milli = numerator / (frac_den * scale_den);
    Some(if negative { -milli } else { milli })
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
