//! Time, as the rest of the crate sees it: milliseconds since the Unix epoch.
//!
//! A leaf every module may import. Pure code takes a [`Millis`] argument; only the shells (the HTTP
//! handlers, the mesh event loop, the background loops) read [`now_millis`] and pass it down, so the
//! protocol core and health derivation run unchanged under the simulator's virtual clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Wall-clock, because heartbeat times are shown to users and
/// (in the mesh) compared across nodes.
pub type Millis = u64;

/// Wall-clock now, in milliseconds since the epoch.
pub fn now_millis() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// RFC 3339 UTC with milliseconds ([`write_rfc3339`]).
pub fn rfc3339(ms: Millis) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339(ms, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The first millisecond of the year 10000, which RFC 3339's four-digit years cannot write.
const YEAR_10000: Millis = 253_402_300_800_000;

/// Appends `ms` as RFC 3339 UTC with milliseconds (24 bytes) to `out`, without an allocation or the
/// formatting machinery: a discovery page writes one per agent. A time past the year 9999 is written
/// as its last millisecond.
pub fn write_rfc3339(ms: Millis, out: &mut Vec<u8>) {
    let ms = ms.min(YEAR_10000 - 1);
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date, in eras of 400 years from 0000-03-01 (H. Hinnant's
    // `civil_from_days`, for days >= 0).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let mut text = *b"0000-00-00T00:00:00.000Z";
    for (at, value) in [
        (0..4, year),
        (5..7, month),
        (8..10, day),
        (11..13, of_day / 3600),
        (14..16, of_day / 60 % 60),
        (17..19, of_day % 60),
        (20..23, millis),
    ] {
        let mut value = value;
        for digit in text[at].iter_mut().rev() {
            *digit = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    out.extend_from_slice(&text);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rfc3339_keeps_milliseconds() {
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert!(now_millis() > 1_700_000_000_000);
    }

    fn written(ms: Millis) -> String {
        let mut out = b"x".to_vec();
        write_rfc3339(ms, &mut out);
        String::from_utf8(out[1..].to_vec()).unwrap()
    }

    /// The writer gives humantime's text for every time it can write: the epoch, leap days, the ends of
    /// months, years and centuries, the last millisecond of 9999, and a spread of times between; later
    /// times are written as that last millisecond.
    #[test]
    fn the_writer_agrees_with_humantime() {
        let day = 86_400_000;
        let mut times = vec![0, 1, 999, 1000, day - 1, day, YEAR_10000 - 1];
        // 1972-02-29, 2000-02-29 and 2000-03-01, 2100-02-28 and 2100-03-01 (no leap day), 2400-02-29.
        for date in
            [68_169_600_000u64, 951_782_400_000, 951_868_800_000, 4_107_456_000_000, 4_107_542_400_000]
        {
            times.extend([date - 1, date, date + day - 1]);
        }
        times.push(13_574_563_200_000 + 59 * day);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            times.push(x % YEAR_10000);
        }
        for ms in times {
            let expected =
                humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string();
            assert_eq!((written(ms), rfc3339(ms)), (expected.clone(), expected), "{ms}");
        }
        assert_eq!(written(951_782_400_123), "2000-02-29T00:00:00.123Z");
        for ms in [YEAR_10000, u64::MAX] {
            assert_eq!(rfc3339(ms), "9999-12-31T23:59:59.999Z");
        }
    }
}
