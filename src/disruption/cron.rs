//! Disruption budget schedules, read exactly as upstream reads them (robfig/cron's standard
//! parser, in UTC), so a schedule that opens a window upstream opens the same one here and a
//! schedule upstream refuses (its budget then allows nothing) is refused here too.
//!
//! Five fields (minute hour day-of-month month day-of-week) or a descriptor (`@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`; robfig's `@every` is
//! refused, as the NodePool CRD's pattern refuses it). Each field is a comma list (empty items
//! skipped) of `*`/`?`, `N`, `N-M`, with an optional `/step`; `N/step` runs from N to the field's
//! maximum. Months and weekdays also take three-letter names; weekdays are 0-6 (Sunday 0, no 7).
//! No `L`, `W` or `#`. Day-of-month and day-of-week combine with AND when either is a plain
//! wildcard (`*`, `?`, `*/1`), with OR otherwise.
//!
//! One upstream bug is not copied: when robfig finds no match within five years of the
//! checkpoint (`0 0 30 2 *`, an empty field, a leap day across 2100) it returns the zero time,
//! which upstream reads as "window open" for ever; here such a window never opens, and a real
//! date further away is still found.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveTime, TimeZone, Timelike, Utc};

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// Either day field was a plain wildcard: the two combine with AND.
    days_and: bool,
}

struct FieldRange {
    what: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: FieldRange = FieldRange {
    what: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: FieldRange = FieldRange {
    what: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: FieldRange = FieldRange {
    what: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
/// Names index from the field's minimum (January is 1).
const MONTH: FieldRange = FieldRange {
    what: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DAY_OF_WEEK: FieldRange = FieldRange {
    what: "day of week",
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// How far ahead a window's next opening is searched: two leap days can be eight years apart
/// (2096, 2104), so a `29 2` schedule always finds one within this.
const SEARCH_DAYS: u32 = 366 * 9;

impl Schedule {
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let spec = spec.trim();
        if spec.starts_with('@') {
            let fields = match spec {
                "@yearly" | "@annually" => "0 0 1 1 *",
                "@monthly" => "0 0 1 * *",
                "@weekly" => "0 0 * * 0",
                "@daily" | "@midnight" => "0 0 * * *",
                "@hourly" => "0 * * * *",
                _ => {
                    return Err(format!(
                        "unknown descriptor {spec:?} (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
                    ));
                }
            };
            return Schedule::parse(fields);
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            ));
        };
        let (minutes, _) = parse_field(minute, &MINUTE)?;
        let (hours, _) = parse_field(hour, &HOUR)?;
        let (days_of_month, dom_star) = parse_field(dom, &DAY_OF_MONTH)?;
        let (months, _) = parse_field(month, &MONTH)?;
        let (days_of_week, dow_star) = parse_field(dow, &DAY_OF_WEEK)?;
        Ok(Schedule {
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week,
            days_and: dom_star || dow_star,
        })
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        if !has(self.months, date.month()) {
            return false;
        }
        let dom = has(self.days_of_month, date.day());
        let dow = has(self.days_of_week, date.weekday().num_days_from_sunday());
        if self.days_and {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first whole minute strictly after `after` that the schedule names, or `None` when
    /// none comes within the search horizon (a date that never exists).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // An empty field (`,`) matches nothing: no need to walk nine years to learn that.
        if self.minutes == 0 || self.hours == 0 || self.months == 0 {
            return None;
        }
        let start = after
            .with_second(0)?
            .with_nanosecond(0)?
            .checked_add_signed(Duration::minutes(1))?;
        let mut date = start.date_naive();
        let mut from = Some((start.hour(), start.minute()));
        for _ in 0..SEARCH_DAYS {
            if self.day_matches(date)
                && let Some((hour, minute)) = self.first_time_of_day(from)
            {
                let time = NaiveTime::from_hms_opt(hour, minute, 0)?;
                return Some(Utc.from_utc_datetime(&date.and_time(time)));
            }
            date = date.succ_opt()?;
            from = None;
        }
        None
    }

    /// The first (hour, minute) of a matching day at or after `from` (the whole day if none).
    fn first_time_of_day(&self, from: Option<(u32, u32)>) -> Option<(u32, u32)> {
        let (from_hour, from_minute) = from.unwrap_or((0, 0));
        (from_hour..24)
            .filter(|h| has(self.hours, *h))
            .find_map(|hour| {
                let first = if hour == from_hour { from_minute } else { 0 };
                (first..60)
                    .find(|m| has(self.minutes, *m))
                    .map(|minute| (hour, minute))
            })
    }
}

fn has(bits: u64, value: u32) -> bool {
    bits & (1u64 << value) != 0
}

/// A comma list of ranges: the allowed values' bits, and whether a part was a plain wildcard.
fn parse_field(field: &str, range: &FieldRange) -> Result<(u64, bool), String> {
    let mut bits = 0;
    let mut star = false;
    // Go's FieldsFunc: `1,,2` is `1,2` and `,` is no value at all.
    for part in field.split(',').filter(|p| !p.is_empty()) {
        let (part_bits, part_star) =
            parse_range(part, range).map_err(|e| format!("{} field {field:?}: {e}", range.what))?;
        bits |= part_bits;
        star |= part_star;
    }
    Ok((bits, star))
}

fn parse_range(part: &str, range: &FieldRange) -> Result<(u64, bool), String> {
    let mut range_and_step = part.split('/');
    let span = range_and_step.next().unwrap_or_default();
    let step = range_and_step.next();
    if range_and_step.next().is_some() {
        return Err(format!("too many slashes in {part:?}"));
    }
    let bounds: Vec<&str> = span.split('-').collect();
    let (start, mut end, mut star) = if bounds[0] == "*" || bounds[0] == "?" {
        // robfig ignores anything after a wildcard's hyphen; so does this.
        (range.min, range.max, true)
    } else {
        let start = value(bounds[0], range)?;
        match bounds[..] {
            [_] => (start, start, false),
            [_, end] => (start, value(end, range)?, false),
            _ => return Err(format!("too many hyphens in {part:?}")),
        }
    };
    let step = match step {
        None => 1,
        Some(step) => {
            let step = number(step)?;
            if bounds.len() == 1 {
                end = range.max;
            }
            if step > 1 {
                star = false;
            }
            step
        }
    };
    if start < range.min {
        return Err(format!("{start} is below the minimum {}", range.min));
    }
    if end > range.max {
        return Err(format!("{end} is above the maximum {}", range.max));
    }
    if start > end {
        return Err(format!("range {start}-{end} runs backwards"));
    }
    if step == 0 {
        return Err("a step must be positive".into());
    }
    // Any step past the field's width keeps only its start.
    let bits = (start..=end)
        .step_by(step.min(64) as usize)
        .fold(0u64, |bits, v| bits | 1 << v);
    Ok((bits, star))
}

fn value(text: &str, range: &FieldRange) -> Result<u32, String> {
    // Go lowercases with Unicode rules.
    let lower = text.to_lowercase();
    match range.names.iter().position(|n| *n == lower) {
        Some(index) => Ok(range.min + index as u32),
        None => {
            let n = number(text)?;
            // Out of every field's range; the bounds check names it.
            Ok(u32::try_from(n).unwrap_or(u32::MAX))
        }
    }
}

/// Go's `Atoi` (a leading `+` allowed, up to `i64::MAX`), negatives refused as robfig does.
fn number(text: &str) -> Result<u64, String> {
    match text.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n as u64),
        _ => Err(format!("{text:?} is not a non-negative number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-01 is a Sunday.
    fn at(day: u32, hour: u32, minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, day, hour, minute, 0).unwrap()
    }

    /// The days of the first `n` hits after 2026-03-01 00:00, as "day weekday".
    fn days(spec: &str, n: usize) -> Vec<String> {
        let schedule = Schedule::parse(spec).unwrap();
        let mut cursor = at(1, 0, 0);
        (0..n)
            .map(|_| {
                cursor = schedule.next_after(cursor).unwrap();
                cursor.format("%m-%d %a").to_string()
            })
            .collect()
    }

    #[test]
    fn next_hit_is_the_first_whole_minute_strictly_after() {
        let hourly = Schedule::parse("@hourly").unwrap();
        assert_eq!(hourly.next_after(at(1, 10, 0)), Some(at(1, 11, 0)));
        let half_past = Utc.with_ymd_and_hms(2026, 3, 1, 10, 59, 30).unwrap();
        assert_eq!(hourly.next_after(half_past), Some(at(1, 11, 0)));
        let nine = Schedule::parse("0 9 * * *").unwrap();
        assert_eq!(nine.next_after(at(1, 9, 0)), Some(at(2, 9, 0)));
        assert_eq!(nine.next_after(at(1, 8, 59)), Some(at(1, 9, 0)));
        let quarters = Schedule::parse("*/15 9-10 * * *").unwrap();
        assert_eq!(quarters.next_after(at(1, 9, 50)), Some(at(1, 10, 0)));
        assert_eq!(quarters.next_after(at(1, 10, 45)), Some(at(2, 9, 0)));
    }

    #[test]
    fn descriptors_upstream_accepts_are_accepted() {
        assert_eq!(
            Schedule::parse("@midnight").unwrap(),
            Schedule::parse("0 0 * * *").unwrap()
        );
        assert_eq!(
            Schedule::parse("@annually").unwrap(),
            Schedule::parse("0 0 1 1 *").unwrap()
        );
        assert_eq!(days("@weekly", 2), ["03-08 Sun", "03-15 Sun"]);
        // robfig takes `@every`; the NodePool CRD's pattern does not, so neither does this.
        assert!(Schedule::parse("@every 1h").is_err());
        assert!(Schedule::parse("@Daily").is_err());
    }

    #[test]
    fn a_single_value_with_a_step_runs_to_the_fields_maximum() {
        assert_eq!(
            days("0 0 20/5 * *", 3),
            ["03-20 Fri", "03-25 Wed", "03-30 Mon"]
        );
        assert_eq!(
            days("0 0 20-25/5 * *", 3),
            ["03-20 Fri", "03-25 Wed", "04-20 Mon"]
        );
    }

    #[test]
    fn day_fields_combine_with_and_only_beside_a_plain_wildcard() {
        // `*/1` is a plain wildcard: Mondays only.
        assert_eq!(days("0 0 */1 * MON", 2), ["03-02 Mon", "03-09 Mon"]);
        assert_eq!(days("0 0 ? * mon", 2), ["03-02 Mon", "03-09 Mon"]);
        assert_eq!(
            days("0 0 * * */2", 3),
            ["03-03 Tue", "03-05 Thu", "03-07 Sat"]
        );
        // Both restricted: either matches.
        assert_eq!(
            days("0 0 */2 * MON", 4),
            ["03-02 Mon", "03-03 Tue", "03-05 Thu", "03-07 Sat"]
        );
        assert_eq!(
            days("0 0 13 * FRI", 3),
            ["03-06 Fri", "03-13 Fri", "03-20 Fri"]
        );
        // A wildcard anywhere in the list counts.
        assert_eq!(days("0 0 1,* * MON", 2), ["03-02 Mon", "03-09 Mon"]);
    }

    #[test]
    fn empty_list_items_are_skipped_and_huge_steps_keep_the_start() {
        assert_eq!(days("0 0 1,,2 * *", 2), ["03-02 Mon", "04-01 Wed"]);
        assert_eq!(days("0 0 ,3, * *", 1), ["03-03 Tue"]);
        assert_eq!(days("0 0 */5000000000 * *", 2), ["04-01 Wed", "05-01 Fri"]);
        // No value at all: nothing ever matches.
        assert_eq!(
            Schedule::parse("0 , * * *")
                .unwrap()
                .next_after(at(1, 0, 0)),
            None
        );
        assert!(Schedule::parse("0 0 */99999999999999999999 * *").is_err());
    }

    #[test]
    fn names_ranges_and_lists() {
        assert_eq!(days("0 0 1 jul,DEC *", 2), ["07-01 Wed", "12-01 Tue"]);
        assert_eq!(
            days("0 0 * * Mon-wed", 3),
            ["03-02 Mon", "03-03 Tue", "03-04 Wed"]
        );
        assert_eq!(days("30 23 * * 0", 1), ["03-01 Sun"]);
    }

    #[test]
    fn what_upstream_refuses_is_refused() {
        for spec in [
            "0 0 * * 7",
            "0 0 * * 1-7",
            "0 0 L * *",
            "0 0 15W * *",
            "0 0 * * 1#2",
            "0 0 * * 5L",
            "0 0 * * MONDAY",
            "0 0 1 * * *",
            "0 0 * *",
            "TZ=UTC 0 0 * *",
            "60 0 * * *",
            "0 24 * * *",
            "0 0 0 * *",
            "0 0 32 * *",
            "0 0 * 0 *",
            "0 0 * 13 *",
            "0 0 10-5 * *",
            "0 0 */0 * *",
            "0 0 1-2-3 * *",
            "0 0 1/2/3 * *",
            "0 0 -1 * *",
            "0 0 99999999999 * *",
            "",
        ] {
            assert!(Schedule::parse(spec).is_err(), "{spec:?} parsed");
        }
        let err = Schedule::parse("0 0 * * 7").unwrap_err();
        assert!(err.contains("day of week field \"7\""), "{err}");
    }

    #[test]
    fn a_date_that_never_comes_never_opens_a_window() {
        let never = Schedule::parse("0 0 30 2 *").unwrap();
        assert_eq!(never.next_after(at(1, 0, 0)), None);
        // A leap day is found even across 2100, which is not a leap year.
        let leap = Schedule::parse("0 0 29 2 *").unwrap();
        let after_2096 = Utc.with_ymd_and_hms(2096, 3, 1, 0, 0, 0).unwrap();
        assert_eq!(
            leap.next_after(after_2096),
            Some(Utc.with_ymd_and_hms(2104, 2, 29, 0, 0, 0).unwrap())
        );
    }
}
