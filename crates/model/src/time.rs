//! Civil UTC dates of Unix times, one implementation for every door and
//! rendering (reports, the server's pages and archive paths, findings):
//! people read dates, not epoch microseconds.

/// `(year, month, day)` of a day count since 1970-01-01 (Howard Hinnant's
/// days-to-civil; proleptic Gregorian, any i64 day).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DD` of a Unix time in seconds.
pub fn utc_date(unix_s: i64) -> String {
    let (y, m, d) = civil(unix_s.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time in seconds.
pub fn utc_seconds(unix_s: i64) -> String {
    let secs = unix_s.rem_euclid(86_400);
    format!(
        "{} {:02}:{:02}:{:02} UTC",
        utc_date(unix_s),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC, no suffix) of a Unix time in µs.
pub fn utc_ms(unix_us: u64) -> String {
    let s = (unix_us / 1_000_000) as i64;
    let secs = s.rem_euclid(86_400);
    format!(
        "{} {:02}:{:02}:{:02}.{:03}",
        utc_date(s),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        unix_us % 1_000_000 / 1000
    )
}

/// A span of Unix µs as people read it: `2026-11-23 10:01:02.462 – 10:01:03.041 UTC`
/// (the date once when both ends share it).
pub fn utc_span(from_us: u64, to_us: u64) -> String {
    let (a, b) = (utc_ms(from_us), utc_ms(to_us));
    match (a.split_once(' '), b.split_once(' ')) {
        (Some((da, _)), Some((db, tb))) if da == db => format!("{a} – {tb} UTC"),
        _ => format!("{a} – {b} UTC"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_seconds(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(-86_400), "1969-12-31");
        assert_eq!(utc_ms(1_795_518_215_462_070), "2026-11-24 11:03:35.462");
        assert_eq!(
            utc_span(1_795_518_215_462_070, 1_795_518_216_041_123),
            "2026-11-24 11:03:35.462 – 11:03:36.041 UTC"
        );
    }
}
