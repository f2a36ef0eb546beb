//! The [`Sql`](crate::store::Sql) seam's values on PostgreSQL: portable `?N` parameters
//! rewritten to `$N`, [`Arg`]s bound as whatever type the server inferred, and columns
//! read back as [`ValueRef`]s.

use std::error::Error as StdError;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};

use crate::store::backend::{Arg, ValueRef};

type BoxError = Box<dyn StdError + Sync + Send>;

/// Rewrites the portable parameters of client SQL (`?N`, and `+?N`, SQLite's way to keep
/// the planner from peeking at a value) to PostgreSQL's `$N`, lexically: string literals,
/// quoted identifiers, dollar-quoted bodies and comments are copied as they are. A `+`
/// before `?N` is dropped only where it is unary (after an operator, a parenthesis, a
/// comma or a keyword); `a+?1` stays an addition.
#[cfg(test)]
pub(crate) fn rewrite(sql: &str) -> String {
    rewrite_numbered(sql, &mut |n| n)
}

/// [`rewrite`], with the parameters the text uses renumbered `$1..$k` in the order of
/// their numbers; returns the text and, for each new number, the old one. PostgreSQL
/// cannot prepare a statement with a parameter it never sees (`could not determine data
/// type of parameter $3`), where SQLite leaves an unused `?3` alone: the query compiler
/// numbers its arguments per step and some steps use only some of them.
pub(crate) fn rewrite_used(sql: &str) -> (String, Vec<usize>) {
    let mut used = std::collections::BTreeSet::new();
    let text = rewrite_numbered(sql, &mut |n| {
        used.insert(n);
        n
    });
    let order: Vec<usize> = used.into_iter().collect();
    if order.iter().enumerate().all(|(i, &n)| n == i + 1) {
        return (text, order);
    }
    let text = rewrite_numbered(sql, &mut |n| order.binary_search(&n).map_or(n, |i| i + 1));
    (text, order)
}

/// Pushes `$` and the parameter number `digits` as `number` renumbers it.
fn push_number(out: &mut String, digits: &str, number: &mut dyn FnMut(usize) -> usize) {
    out.push('$');
    match digits.parse::<usize>() {
        Ok(n) => out.push_str(&number(n).to_string()),
        Err(_) => out.push_str(digits),
    }
}

/// [`rewrite`], each `?N` (or `$N`) becoming `$` and `number(N)`.
fn rewrite_numbered(sql: &str, number: &mut dyn FnMut(usize) -> usize) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let mut i = 0;
    // Start of the text not copied yet.
    let mut from = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => i = skip_quoted(b, i, q),
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(b.len(), |n| i + n);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = sql[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
            }
            // Text already in PostgreSQL's `$N` (the query compiler's): renumbered too.
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                out.push_str(&sql[from..i]);
                push_number(&mut out, &sql[i + 1..i + 1 + digits], number);
                i += 1 + digits;
                from = i;
            }
            b'$' if dollar_tag(b, i).is_some() => {
                let tag = dollar_tag(b, i).unwrap_or_default();
                let body = i + tag.len();
                i = sql[body..]
                    .find(tag)
                    .map_or(b.len(), |n| body + n + tag.len());
            }
            b'?' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let mut start = i;
                if i > 0 && b[i - 1] == b'+' && unary_before(&sql[..i - 1]) {
                    start = i - 1;
                }
                out.push_str(&sql[from..start]);
                push_number(&mut out, &sql[i + 1..i + 1 + digits], number);
                i += 1 + digits;
                from = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[from..]);
    out
}

/// The index after the literal or identifier quoted with `q` that starts at `i` (a
/// doubled quote inside is part of it; an `E'...'` string escapes with backslashes).
fn skip_quoted(b: &[u8], i: usize, q: u8) -> usize {
    let escapes = q == b'\'' && i > 0 && matches!(b[i - 1], b'e' | b'E');
    let mut j = i + 1;
    while j < b.len() {
        if escapes && b[j] == b'\\' {
            j += 2;
            continue;
        }
        if b[j] == q {
            if b.get(j + 1) == Some(&q) {
                j += 2;
                continue;
            }
            return j + 1;
        }
        j += 1;
    }
    b.len()
}

/// The dollar-quote tag (`$$`, `$body$`) starting at `i`, if one does.
fn dollar_tag(b: &[u8], i: usize) -> Option<&str> {
    let len = b[i + 1..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count();
    let end = i + 1 + len;
    (b.get(end) == Some(&b'$') && !b.get(i + 1).is_some_and(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(&b[i..=end]).ok())
        .flatten()
}

/// Whether a `+` ending `before` is unary: nothing, an operator, an opening parenthesis,
/// a comma or a keyword before it.
fn unary_before(before: &str) -> bool {
    let t = before.trim_end();
    let Some(last) = t.chars().last() else {
        return true;
    };
    if "(,=<>!+-*/%|&".contains(last) {
        return true;
    }
    if !(last.is_ascii_alphanumeric() || last == '_') {
        return false;
    }
    let word: String = t
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    const KEYWORDS: &[&str] = &[
        "select",
        "where",
        "and",
        "or",
        "not",
        "then",
        "else",
        "when",
        "between",
        "is",
        "like",
        "in",
        "on",
        "by",
        "limit",
        "offset",
        "returning",
        "values",
        "set",
        "case",
        "having",
    ];
    KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(&word))
}

/// An [`Arg`] bound to a parameter of whatever type PostgreSQL inferred for it, converted
/// when it can be (an integer to `numeric` or `text`, text to `bytea`), so client SQL need
/// not cast its parameters.
pub(crate) struct PgArg<'a>(pub(crate) Arg<'a>);

impl std::fmt::Debug for PgArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

fn mismatch(v: &Arg<'_>, ty: &Type) -> BoxError {
    let what = match v {
        Arg::Null => "null".to_string(),
        Arg::Int(i) => format!("integer {i}"),
        Arg::Real(f) => format!("real {f}"),
        Arg::Text(_) => "text".into(),
        Arg::Blob(b) => format!("{} bytes", b.len()),
    };
    format!("cannot bind {what} to a parameter of type {ty}").into()
}

fn is_text(ty: &Type) -> bool {
    [
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::UNKNOWN,
    ]
    .contains(ty)
}

impl ToSql for PgArg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let v = &self.0;
        Ok(match *v {
            Arg::Null => IsNull::Yes,
            Arg::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out)?,
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out)?,
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out)?,
                Type::OID => u32::try_from(i)?.to_sql(ty, out)?,
                Type::FLOAT8 => (i as f64).to_sql(ty, out)?,
                Type::FLOAT4 => (i as f32).to_sql(ty, out)?,
                Type::BOOL => (i != 0).to_sql(ty, out)?,
                Type::NUMERIC => numeric(i, out),
                _ if is_text(ty) => i.to_string().as_str().to_sql(&Type::TEXT, out)?,
                _ => return Err(mismatch(v, ty)),
            },
            Arg::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out)?,
                Type::FLOAT4 => (f as f32).to_sql(ty, out)?,
                Type::INT8 | Type::INT4 | Type::INT2 | Type::NUMERIC
                    if f.fract() == 0.0 && f.abs() < 9.0e18 =>
                {
                    return PgArg(Arg::Int(f as i64)).to_sql(ty, out);
                }
                _ if is_text(ty) => f.to_string().as_str().to_sql(&Type::TEXT, out)?,
                _ => return Err(mismatch(v, ty)),
            },
            Arg::Text(t) => match *ty {
                Type::BYTEA | Type::JSON => raw(out, t.as_bytes()),
                Type::JSONB => {
                    out.extend_from_slice(&[1]);
                    raw(out, t.as_bytes())
                }
                Type::INT8 | Type::INT4 | Type::INT2 => {
                    return PgArg(Arg::Int(t.trim().parse()?)).to_sql(ty, out);
                }
                _ if is_text(ty) => t.to_sql(&Type::TEXT, out)?,
                _ => return Err(mismatch(v, ty)),
            },
            Arg::Blob(b) => match *ty {
                Type::BYTEA => raw(out, b),
                _ if is_text(ty) => std::str::from_utf8(b)?.to_sql(&Type::TEXT, out)?,
                _ => return Err(mismatch(v, ty)),
            },
        })
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn raw(out: &mut BytesMut, bytes: &[u8]) -> IsNull {
    out.extend_from_slice(bytes);
    IsNull::No
}

/// An integer in `numeric`'s binary form: base-10000 digits, most significant first.
fn numeric(i: i64, out: &mut BytesMut) -> IsNull {
    let mut n = i.unsigned_abs();
    let mut digits = Vec::new();
    while n > 0 {
        digits.push((n % 10_000) as i16);
        n /= 10_000;
    }
    digits.reverse();
    let weight = digits.len() as i16 - 1;
    let sign: u16 = if i < 0 { 0x4000 } else { 0 };
    out.extend_from_slice(&(digits.len() as i16).to_be_bytes());
    out.extend_from_slice(&weight.max(0).to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&0i16.to_be_bytes());
    for d in digits {
        out.extend_from_slice(&d.to_be_bytes());
    }
    IsNull::No
}

/// A column's value in PostgreSQL's binary form, whatever its type ([`value`] reads it).
pub(crate) struct Raw<'a>(pub(crate) &'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Raw(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Reads a column's binary value as a [`ValueRef`]: integers (and `bool`, as 0 or 1) as
/// `Int`, floats as `Real`, integral `numeric` as `Int` and any other as `Real`, text as
/// `Text`, `bytea` as `Blob`, `json` and `jsonb` as `Text`.
pub(crate) fn value<'a>(ty: &Type, raw: Option<&'a [u8]>) -> Result<ValueRef<'a>, String> {
    let Some(raw) = raw else {
        return Ok(ValueRef::Null);
    };
    let be = |n: usize| -> Result<[u8; 8], String> {
        let mut buf = [0u8; 8];
        if raw.len() != n {
            return Err(format!("a {ty} of {} bytes", raw.len()));
        }
        buf[8 - n..].copy_from_slice(raw);
        Ok(buf)
    };
    Ok(match *ty {
        Type::INT8 => ValueRef::Int(i64::from_be_bytes(be(8)?)),
        Type::INT4 => {
            ValueRef::Int(i32::from_be_bytes(raw.try_into().map_err(|_| "bad int4")?).into())
        }
        Type::INT2 => {
            ValueRef::Int(i16::from_be_bytes(raw.try_into().map_err(|_| "bad int2")?).into())
        }
        Type::OID => {
            ValueRef::Int(u32::from_be_bytes(raw.try_into().map_err(|_| "bad oid")?).into())
        }
        Type::BOOL => ValueRef::Int(i64::from(raw.first().is_some_and(|b| *b != 0))),
        Type::FLOAT8 => ValueRef::Real(f64::from_be_bytes(be(8)?)),
        Type::FLOAT4 => {
            ValueRef::Real(f32::from_be_bytes(raw.try_into().map_err(|_| "bad float4")?).into())
        }
        Type::NUMERIC => numeric_value(raw)?,
        Type::BYTEA => ValueRef::Blob(raw),
        Type::JSONB => text(raw.get(1..).unwrap_or_default())?,
        _ if is_text(ty) || *ty == Type::JSON => text(raw)?,
        Type::VOID => ValueRef::Null,
        _ => {
            return Err(format!(
                "a column of type {ty}, which the seam does not read"
            ));
        }
    })
}

fn text(raw: &[u8]) -> Result<ValueRef<'_>, String> {
    std::str::from_utf8(raw)
        .map(ValueRef::Text)
        .map_err(|e| format!("text is not utf-8: {e}"))
}

/// A `numeric` in binary form as an integer when it is one that fits, else a double.
fn numeric_value(raw: &[u8]) -> Result<ValueRef<'static>, String> {
    let word = |k: usize| -> Result<i16, String> {
        raw.get(2 * k..2 * k + 2)
            .map(|w| i16::from_be_bytes([w[0], w[1]]))
            .ok_or_else(|| "a short numeric".to_string())
    };
    let (ndigits, weight, sign) = (word(0)? as usize, word(1)? as i32, word(2)? as u16);
    // NaN, and (PostgreSQL 14 on) the infinities, carry no digits.
    match sign {
        0xC000 => return Ok(ValueRef::Real(f64::NAN)),
        0xD000 => return Ok(ValueRef::Real(f64::INFINITY)),
        0xF000 => return Ok(ValueRef::Real(f64::NEG_INFINITY)),
        _ => {}
    }
    let mut int: i128 = 0;
    let mut real = 0f64;
    let mut integral = true;
    for k in 0..ndigits {
        let d = word(4 + k)? as i128;
        let power = weight - k as i32;
        real += d as f64 * 10_000f64.powi(power);
        if power < 0 {
            integral &= d == 0;
        } else {
            int = int.saturating_add(d.saturating_mul(10_000i128.saturating_pow(power as u32)));
        }
    }
    let negative = sign == 0x4000;
    let int = if negative { -int } else { int };
    Ok(match i64::try_from(int) {
        Ok(i) if integral => ValueRef::Int(i),
        _ => ValueRef::Real(if negative { -real } else { real }),
    })
}

#[cfg(test)]
mod tests {
    use super::{rewrite, rewrite_used};

    #[test]
    fn parameters_are_rewritten_outside_literals() {
        assert_eq!(rewrite("SELECT ?1, ?12"), "SELECT $1, $12");
        // Only the parameters used, renumbered, with their old numbers.
        assert_eq!(
            rewrite_used("WHERE a = ?2 AND b = ?1 AND c = ?5 AND '?3' = ?5"),
            (
                "WHERE a = $2 AND b = $1 AND c = $3 AND '?3' = $3".into(),
                vec![1, 2, 5]
            )
        );
        assert_eq!(rewrite_used("SELECT ?1, ?2").1, vec![1, 2]);
        assert_eq!(
            rewrite_used("WHERE a = $4 AND b = $2"),
            ("WHERE a = $2 AND b = $1".into(), vec![2, 4])
        );
        assert_eq!(rewrite("WHERE seq > +?1"), "WHERE seq > $1");
        assert_eq!(rewrite("SELECT a+?1"), "SELECT a+$1");
        assert_eq!(rewrite("SELECT (+?2)"), "SELECT ($2)");
        assert_eq!(
            rewrite("SELECT '?1', \"?2\", ?3"),
            "SELECT '?1', \"?2\", $3"
        );
        assert_eq!(
            rewrite("SELECT 'it''s ?1' || ?2"),
            "SELECT 'it''s ?1' || $2"
        );
        assert_eq!(rewrite("SELECT E'\\' ?1' , ?2"), "SELECT E'\\' ?1' , $2");
        assert_eq!(rewrite("-- ?1\nSELECT ?2"), "-- ?1\nSELECT $2");
        assert_eq!(rewrite("/* ?1 */ ?2"), "/* ?1 */ $2");
        assert_eq!(rewrite("$$ ?1 $$ ?2 $x$ ?3 $x$"), "$$ ?1 $$ $2 $x$ ?3 $x$");
        assert_eq!(rewrite("SELECT j ? 'k', $1"), "SELECT j ? 'k', $1");
        assert_eq!(rewrite("AND +?4"), "AND $4");
    }
}
