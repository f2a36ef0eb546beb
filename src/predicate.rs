//! Field values in queries: how predicates compare them and how they sort. Pure: no I/O.
//!
//! The same functions run inside the database (the SQLite backend registers them as the
//! scalar functions `pq_test` and `pq_field`) and in Rust, so a predicate means one thing
//! wherever it is evaluated:
//! - integers and floats compare numerically (an integer with a float as binary64);
//! - text compares bytewise (UTF-8 byte order), bytes bytewise;
//! - booleans, null, arrays and maps support only `=`, `!=` and `in`, by equality;
//! - values of different kinds are never equal and never ordered, so `<` is false;
//! - a missing field makes every predicate on it false, `!=` included.

use std::cmp::Ordering;

use crate::fact::{Fields, Value};

/// The `op` code of `in` in the database's `pq_test` (the other codes are `Op::code`).
pub(crate) const IN: i64 = 6;

/// A comparison operator of a field predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Op {
    /// The operator as written in the text syntax.
    pub fn text(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    /// Whether the operator orders values (`<`, `<=`, `>`, `>=`) rather than testing
    /// equality.
    pub fn orders(self) -> bool {
        !matches!(self, Op::Eq | Op::Ne)
    }

    pub(crate) fn code(self) -> i64 {
        self as i64
    }

    pub(crate) fn from_code(code: i64) -> Option<Op> {
        [Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Gt, Op::Ge]
            .get(usize::try_from(code).ok()?)
            .copied()
    }
}

/// Whether a literal of this kind may appear after an ordering operator.
pub(crate) fn orderable(v: &Value) -> bool {
    matches!(
        v,
        Value::Integer(_) | Value::Float(_) | Value::Text(_) | Value::Bytes(_)
    )
}

/// Compares two values of comparable kinds; `None` when they are of different kinds or
/// of a kind that is not ordered.
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Integer(x), Value::Integer(y)) => Some(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
        (Value::Integer(x), Value::Float(y)) => integer_float(*x, *y),
        (Value::Float(x), Value::Integer(y)) => integer_float(*y, *x).map(Ordering::reverse),
        (Value::Text(x), Value::Text(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// Where the integer `i` sorts against the float `f`, exactly: converting `i` to a float
/// would make 2^53 + 1 equal to 2^53.
fn integer_float(i: i128, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    // 2^127 is exact in binary64; every float at or beyond it exceeds every field integer.
    const TWO_127: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f >= TWO_127 {
        return Some(Ordering::Less);
    }
    if f < -TWO_127 {
        return Some(Ordering::Greater);
    }
    // In range, the integer part of f is an i128 exactly.
    let whole = f.trunc();
    Some(i.cmp(&(whole as i128)).then_with(|| {
        if f > whole {
            Ordering::Less
        } else if f < whole {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }))
}

/// Equality as predicates see it: numeric across integers and floats, otherwise
/// structural (`-0.0` equals `0.0`, as numbers do).
pub fn equal(a: &Value, b: &Value) -> bool {
    match compare(a, b) {
        Some(o) => o == Ordering::Equal,
        None => a == b,
    }
}

/// Whether `field` (absent: `None`) passes `op` against `value`.
pub fn test(field: Option<&Value>, op: Op, value: &Value) -> bool {
    let Some(field) = field else { return false };
    match op {
        Op::Eq => equal(field, value),
        Op::Ne => !equal(field, value) && same_kind(field, value),
        _ => match compare(field, value) {
            Some(o) => match op {
                Op::Lt => o == Ordering::Less,
                Op::Le => o != Ordering::Greater,
                Op::Gt => o == Ordering::Greater,
                _ => o != Ordering::Less,
            },
            None => false,
        },
    }
}

/// Whether `field` equals one of `values`.
pub fn test_in(field: Option<&Value>, values: &[Value]) -> bool {
    field.is_some_and(|f| values.iter().any(|v| equal(f, v)))
}

fn same_kind(a: &Value, b: &Value) -> bool {
    let numeric = |v: &Value| matches!(v, Value::Integer(_) | Value::Float(_));
    (numeric(a) && numeric(b)) || std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The sort key of a field for `order by`: SQLite's order of storage classes, which the
/// compiled SQL uses. Missing, null, booleans, arrays and maps sort first (as SQL NULL, in
/// release order among themselves), then numbers (integers beyond 64 bits as binary64),
/// then text bytewise, then bytes bytewise.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
pub enum SortKey {
    /// Missing or not orderable.
    Null,
    /// A number.
    Number(Number),
    /// Text, compared by UTF-8 bytes.
    Text(Vec<u8>),
    /// Bytes.
    Bytes(Vec<u8>),
}

/// A number as SQLite holds it, and compares it: a 64-bit integer or a binary64 float,
/// an integer and a float compared exactly (not by converting the integer to a float,
/// which would make 2^53 and 2^53 + 1 equal).
#[derive(Clone, Copy, Debug)]
pub enum Number {
    /// A 64-bit integer.
    Int(i64),
    /// A float (an integer beyond 64 bits is one, as SQLite receives it).
    Real(f64),
}

impl Number {
    /// The number of an integer field value: a float beyond the 64-bit range.
    pub fn of_integer(i: i128) -> Number {
        i64::try_from(i).map_or(Number::Real(i as f64), Number::Int)
    }
}

impl PartialEq for Number {
    fn eq(&self, other: &Number) -> bool {
        self.partial_cmp(other) == Some(Ordering::Equal)
    }
}

impl PartialOrd for Number {
    fn partial_cmp(&self, other: &Number) -> Option<Ordering> {
        match (*self, *other) {
            (Number::Int(a), Number::Int(b)) => Some(a.cmp(&b)),
            (Number::Real(a), Number::Real(b)) => a.partial_cmp(&b),
            (Number::Int(a), Number::Real(b)) => integer_float(a.into(), b),
            (Number::Real(a), Number::Int(b)) => integer_float(b.into(), a).map(Ordering::reverse),
        }
    }
}

/// The sort key of a field value.
pub fn sort_key(field: Option<&Value>) -> SortKey {
    match field {
        Some(Value::Integer(i)) => SortKey::Number(Number::of_integer(*i)),
        Some(Value::Float(f)) => SortKey::Number(Number::Real(*f)),
        Some(Value::Text(t)) => SortKey::Text(t.as_bytes().to_vec()),
        Some(Value::Bytes(b)) => SortKey::Bytes(b.clone()),
        _ => SortKey::Null,
    }
}

/// Reads the fields of canonical fact bytes (strictly decoded: stored bytes were checked
/// when written, so this never fails on an intact database).
pub(crate) fn fields_of(bytes: &[u8]) -> Option<Fields> {
    crate::encoding::decode(bytes).ok().map(|(_, f, _)| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_across_kinds_and_others_do_not() {
        assert!(test(Some(&Value::Integer(2)), Op::Lt, &Value::Float(2.5)));
        assert!(test(Some(&Value::Float(2.0)), Op::Eq, &Value::Integer(2)));
        assert!(!test(
            Some(&Value::Text("a".into())),
            Op::Lt,
            &Value::Integer(1)
        ));
        assert!(!test(
            Some(&Value::Text("a".into())),
            Op::Ne,
            &Value::Integer(1)
        ));
        assert!(test(Some(&Value::Bool(true)), Op::Ne, &Value::Bool(false)));
        assert!(!test(None, Op::Ne, &Value::Integer(1)));
        assert!(test(
            Some(&Value::Text("B".into())),
            Op::Lt,
            &Value::Text("a".into())
        ));
    }

    #[test]
    fn numbers_compare_exactly_across_integers_and_floats() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let two_53 = 1i64 << 53;
        let cases = [
            (
                Number::Int(two_53 + 1),
                Number::Real(two_53 as f64),
                Greater,
            ),
            (Number::Int(two_53), Number::Real(two_53 as f64), Equal),
            (
                Number::Int(i64::MAX),
                Number::Real(9_223_372_036_854_775_808.0),
                Less,
            ),
            (
                Number::Int(i64::MIN),
                Number::Real(-9_223_372_036_854_775_808.0),
                Equal,
            ),
            (
                Number::Int(i64::MIN),
                Number::Real(f64::NEG_INFINITY),
                Greater,
            ),
            (Number::Int(-1), Number::Real(-1.5), Greater),
            (Number::Int(-2), Number::Real(-1.5), Less),
            (Number::Int(1), Number::Real(1.5), Less),
            (Number::Int(2), Number::Real(1.5), Greater),
            (Number::Int(0), Number::Real(-0.0), Equal),
            (Number::Int(two_53 + 1), Number::Int(two_53), Greater),
        ];
        for (a, b, want) in cases {
            assert_eq!(a.partial_cmp(&b), Some(want), "{a:?} against {b:?}");
            assert_eq!(
                b.partial_cmp(&a),
                Some(want.reverse()),
                "{b:?} against {a:?}"
            );
        }
        assert_eq!(Number::Int(0).partial_cmp(&Number::Real(f64::NAN)), None);
        // Predicates compare field integers (to 2^64) with floats exactly too.
        let big = Value::Integer((1i128 << 53) + 1);
        assert!(test(Some(&big), Op::Gt, &Value::Float((1u64 << 53) as f64)));
        assert!(!test(
            Some(&big),
            Op::Eq,
            &Value::Float((1u64 << 53) as f64)
        ));
        let max = Value::Integer(u64::MAX as i128);
        assert!(test(
            Some(&max),
            Op::Lt,
            &Value::Float(18_446_744_073_709_551_616.0)
        ));
        assert!(test(Some(&Value::Integer(-1)), Op::Gt, &Value::Float(-1.5)));
        assert!(test(Some(&Value::Float(2.0)), Op::Eq, &Value::Integer(2)));
        // Integers beyond 64 bits reach SQLite as floats, and sort as such.
        assert_eq!(
            sort_key(Some(&Value::Integer(u64::MAX as i128))),
            SortKey::Number(Number::Real(u64::MAX as f64))
        );
        assert!(
            sort_key(Some(&Value::Integer(two_53 as i128 + 1)))
                > sort_key(Some(&Value::Integer(two_53 as i128)))
        );
    }
}
