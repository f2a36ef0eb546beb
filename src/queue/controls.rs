//! What operators control on a queue besides retries: priorities and schedules read from
//! declared fields of the input, and the limits a claim obeys (live leases, rate). The
//! claim side runs in `work.rs`; this file holds the rules, so that they read in one place.

use serde::{Deserialize, Serialize};

use crate::args;
use crate::error::Result;
use crate::fact::{Fact, Value};
use crate::queue::state_code;
use crate::queue::{QueueSpec, Semantics};
use crate::store::{Dialect, SqlExt, Writer};

/// At most `count` inputs handed out per `per_ms`, across every worker: the periods are
/// fixed windows aligned to the epoch (a window starts at a multiple of `per_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Inputs per window.
    pub count: u64,
    /// The window's length in ms.
    pub per_ms: i64,
}

impl std::str::FromStr for RateLimit {
    type Err = String;

    /// `N/s`, `N/m`, `N/h`, or `N/DUR` with a duration in ms (`100/250`).
    fn from_str(text: &str) -> std::result::Result<RateLimit, String> {
        let bad = || format!("bad rate {text:?}: expected N/s, N/m, N/h or N/MS, e.g. 50/s");
        let (n, per) = text.split_once('/').ok_or_else(bad)?;
        let count: u64 = n.trim().parse().map_err(|_| bad())?;
        let per_ms = match per.trim() {
            "s" | "1s" => 1000,
            "m" | "1m" | "min" => 60_000,
            "h" | "1h" => 3_600_000,
            ms => ms.parse::<i64>().map_err(|_| bad())?,
        };
        if count == 0 || per_ms <= 0 {
            return Err(bad());
        }
        Ok(RateLimit { count, per_ms })
    }
}

/// Parses an RFC 3339 instant (`2026-12-01T11:28:28Z`, `2026-12-01T12:28:28.5+01:00`)
/// into ms since the epoch. Leap seconds are not accepted.
///
/// # Errors
/// A description of what does not parse.
pub fn parse_rfc3339_ms(text: &str) -> std::result::Result<i64, String> {
    let bad = || format!("{text:?} is not an RFC 3339 time (e.g. 2026-12-01T11:28:28Z)");
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let num = |from: usize, to: usize| -> std::result::Result<i64, String> {
        let s = text.get(from..to).ok_or_else(bad)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (h, mi, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let mut at = 19;
    let mut ms = 0;
    if b.get(at) == Some(&b'.') {
        let start = at + 1;
        at = start;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return Err(bad());
        }
        let digits = &text[start..at.min(start + 3)];
        ms = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_min = match &text[at..] {
        "Z" | "z" => 0,
        // Bytes, not text slices: a multi-byte character there is refused, not a panic.
        o if o.len() == 6 && matches!(o.as_bytes()[0], b'+' | b'-') && o.as_bytes()[3] == b':' => {
            let sign = if o.as_bytes()[0] == b'-' { -1 } else { 1 };
            sign * (num(at + 1, at + 3)? * 60 + num(at + 4, at + 6)?)
        }
        _ => return Err(bad()),
    };
    let days_in = [
        31,
        28 + i64::from(leap(y)),
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo) || d < 1 || d > days_in[(mo - 1) as usize] || h > 23 || mi > 59 {
        return Err(bad());
    }
    if s > 59 {
        return Err(bad());
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_min * 60;
    Ok(secs * 1000 + ms)
}

fn leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl QueueSpec {
    /// Why `fact` is poison in this queue: an unmet field requirement, or a priority or
    /// not-before field that does not parse.
    pub(crate) fn poison_reason(&self, fact: &Fact) -> Option<String> {
        self.unmet_requirement(fact)
            .or_else(|| self.priority_of(fact).err())
            .or_else(|| self.not_before_of(fact).err())
    }

    /// The input's priority (its priority field, 0 without one), or a poison reason.
    pub(crate) fn priority_of(&self, fact: &Fact) -> std::result::Result<i64, String> {
        let Some(name) = &self.priority_field else {
            return Ok(0);
        };
        match fact.field(name) {
            None => Ok(0),
            Some(Value::Integer(n)) => i64::try_from(*n)
                .map_err(|_| format!("priority field {name:?} is out of the 64-bit range")),
            Some(_) => Err(format!("priority field {name:?} is not an integer")),
        }
    }

    /// When the input may first be handed out (its not-before field), or a poison reason.
    pub(crate) fn not_before_of(&self, fact: &Fact) -> std::result::Result<Option<i64>, String> {
        let Some(name) = &self.not_before_field else {
            return Ok(None);
        };
        match fact.field(name) {
            None => Ok(None),
            Some(Value::Integer(n)) => i64::try_from(*n)
                .map(Some)
                .map_err(|_| format!("not-before field {name:?} is out of the 64-bit range")),
            Some(Value::Text(t)) => parse_rfc3339_ms(t)
                .map(Some)
                .map_err(|e| format!("not-before field {name:?}: {e}")),
            Some(_) => Err(format!(
                "not-before field {name:?} is neither RFC 3339 text nor integer ms"
            )),
        }
    }
}

/// How many of `n` inputs a claim on queue `id` may hand out under the spec's limits, and
/// the rate window to charge them to. With no limit, `n` and no window.
///
/// IMPORTANT: on PostgreSQL the queue's row is locked (`FOR UPDATE`) before the live
/// leases are counted, and stays locked until the claim commits: a second claim waits
/// there, and then (READ COMMITTED: each statement reads what committed before it) counts
/// the first one's leases. Without the lock two claims could each count the same free
/// slots. SQLite's write lock already serialises claims.
pub(super) fn allowance(
    w: &mut Writer<'_>,
    spec: &QueueSpec,
    id: i64,
    n: usize,
    now: i64,
) -> Result<(usize, Option<i64>)> {
    if spec.max_leased.is_none() && spec.rate.is_none() {
        return Ok((n, None));
    }
    if w.sql().dialect() == Dialect::Postgres && spec.semantics == Semantics::AtMostOnce {
        // Its delivery facts take the write lock, and a completion that holds it updates
        // this row at its commit: taken first, so that the two do not wait for each
        // other (PostgreSQL would abort one of them as a deadlock).
        w.lock_writers()?;
    }
    let lock = match w.sql().dialect() {
        Dialect::Postgres => "SELECT rate_window, rate_count FROM queue WHERE id = ?1 FOR UPDATE",
        _ => "SELECT rate_window, rate_count FROM queue WHERE id = ?1",
    };
    let (window, used): (i64, i64) = w
        .sql()
        .query_one(lock, args![id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let mut allowed = n as u64;
    if let Some(max) = spec.max_leased {
        let live: i64 = w.sql().query_one(
            concat!(
                "SELECT count(*) FROM queue_item WHERE queue_id = ?1 AND state = ",
                state_code!(Leased),
                " AND claimable_at > ?2"
            ),
            args![id, now],
            |r| r.get(0),
        )?;
        allowed = allowed.min(max.saturating_sub(live.max(0) as u64));
    }
    let mut charge = None;
    if let Some(rate) = spec.rate {
        let mut start = now - now.rem_euclid(rate.per_ms);
        // Another process whose clock runs a little ahead may have charged the next window
        // already: counted in that one, not in this clock's, which would start the count
        // again at zero (and let the two hand out a full quota each time they took turns).
        // A window more than one period ahead is a clock far off, not skew: not followed.
        if window > start && window - start <= rate.per_ms {
            start = window;
        }
        let used = if window == start {
            used.max(0) as u64
        } else {
            0
        };
        allowed = allowed.min(rate.count.saturating_sub(used));
        charge = Some(start);
    }
    Ok((allowed as usize, charge))
}

/// Charges `handed` claims to the rate window starting at `start`.
pub(super) fn charge(w: &mut Writer<'_>, id: i64, start: i64, handed: usize) -> Result<()> {
    w.sql().execute(
        "UPDATE queue SET rate_count = CASE WHEN rate_window = ?2 THEN rate_count ELSE 0 END + ?3,
                          rate_window = ?2
         WHERE id = ?1",
        args![id, start, handed as i64],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_parse_to_epoch_ms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("2026-12-01T11:28:28Z"),
            Ok(1_796_124_508_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-12-01T12:28:28.25+01:00"),
            Ok(1_796_124_508_250)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z"),
            Ok(1_709_164_800_000)
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2026-12-01 11:28:28",
            "2026-13-01T00:00:00Z",
            "yesterday",
            "2026-12-01T11:28:28.Z",
            // A zone of six bytes that a multi-byte character starts or crosses.
            "2026-12-01T11:28:28\u{e9}1234",
            "2026-12-01T11:28:28+\u{e9}:000",
            "2026-12-01T11:28:28+0\u{e9}000",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_parse_with_their_period() {
        let r: RateLimit = "50/s".parse().unwrap();
        assert_eq!((r.count, r.per_ms), (50, 1000));
        let r: RateLimit = "3/250".parse().unwrap();
        assert_eq!((r.count, r.per_ms), (3, 250));
        assert!("0/s".parse::<RateLimit>().is_err());
        assert!("5".parse::<RateLimit>().is_err());
    }
}
