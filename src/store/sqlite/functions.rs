//! The SQLite scalar functions compiled queries call, over the pure predicate rules of
//! [`crate::predicate`]. Both are deterministic, so SQLite may evaluate them once per row
//! and factor them out of loops.
//!
//! - `pq_test(bytes, field, op, values)`: 1 when the field of the fact passes the test
//!   ([`crate::predicate::test`]; `op` is an `Op` code, or `IN`; `values` are the canonical
//!   bytes of a carrier fact `{"v": [values]}`, decoded once per statement).
//! - `pq_field(bytes, field)`: the field as an SQLite value for `ORDER BY`
//!   ([`crate::predicate::sort_key`]).

use rusqlite::Connection;
use rusqlite::functions::FunctionFlags;
use rusqlite::types::Value as Sql;

use crate::fact::Value;
use crate::predicate::{self as value, IN, Op};

struct Values(Vec<Value>);

/// Registers the functions on a connection.
pub(crate) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("pq_test", 4, flags, |ctx| {
        let values = ctx.get_or_create_aux(3, |v| -> Result<Values, String> {
            let bytes = v.as_blob().map_err(|e| e.to_string())?;
            let fields = value::fields_of(bytes).ok_or("bad predicate values")?;
            match fields.get("v") {
                Some(Value::Array(vs)) => Ok(Values(vs.clone())),
                _ => Err("bad predicate values".into()),
            }
        })?;
        let op: i64 = ctx.get(2)?;
        let field_name = ctx.get_raw(1).as_str()?.to_string();
        let bytes = ctx.get_raw(0).as_blob()?;
        let fields = value::fields_of(bytes);
        let field = fields.as_ref().and_then(|f| f.get(&field_name));
        let pass = if op == IN {
            value::test_in(field, &values.0)
        } else {
            match (Op::from_code(op), values.0.first()) {
                (Some(op), Some(v)) => value::test(field, op, v),
                _ => false,
            }
        };
        Ok(pass as i64)
    })?;
    conn.create_scalar_function("pq_field", 2, flags, |ctx| {
        let field_name = ctx.get_raw(1).as_str()?.to_string();
        let fields = value::fields_of(ctx.get_raw(0).as_blob()?);
        Ok(sql_value(fields.as_ref().and_then(|f| f.get(&field_name))))
    })
}

/// The SQLite value `pq_field` returns for a field: what [`crate::predicate::sort_key`]
/// describes.
fn sql_value(field: Option<&Value>) -> Sql {
    match field {
        Some(Value::Integer(i)) => match i64::try_from(*i) {
            Ok(i) => Sql::Integer(i),
            Err(_) => Sql::Real(*i as f64),
        },
        Some(Value::Float(f)) => Sql::Real(*f),
        Some(Value::Text(t)) => Sql::Text(t.clone()),
        Some(Value::Bytes(b)) => Sql::Blob(b.clone()),
        _ => Sql::Null,
    }
}
