//! Aggregate and filter specs as written on a command line.

use tidemark_core::{AggFn, FieldType, Schema, Value};
use tidemark_engine::{Aggregation, CmpOp, Predicate};

use crate::QueryError;

/// `FN:FIELD` (e.g. `max:LASTTRADEPRICE`), or `count` for the number of events.
pub fn parse_aggregation(spec: &str) -> Result<Aggregation, QueryError> {
    let (func, field) = match spec.split_once(':') {
        Some((f, field)) => (f, Some(field.trim())),
        None => (spec, None),
    };
    let func: AggFn = func.parse().map_err(QueryError)?;
    match field {
        Some("") => Err(QueryError(format!("{spec:?} names no field"))),
        Some(field) => Ok(Aggregation::new(func, field)),
        None if func == AggFn::Count => Ok(Aggregation::count()),
        None => Err(QueryError(format!(
            "{func} needs a field, as in {func}:FIELD"
        ))),
    }
}

/// `FIELD OP VALUE` with OP one of `= != < <= > >=`, `FIELD IN (v1, v2)`, `FIELD IS NULL`
/// or `FIELD IS NOT NULL`. The value is read as the field's type; strings may be quoted.
pub fn parse_predicate(spec: &str, schema: &Schema) -> Result<Predicate, QueryError> {
    let text = spec.trim();
    let field_end = text
        .find(|c: char| c.is_whitespace() || "=!<>".contains(c))
        .unwrap_or(text.len());
    let (name, rest) = text.split_at(field_end);
    let index = schema
        .index_of(name)
        .ok_or_else(|| QueryError(format!("no field {name:?} in the schema ({schema})")))?;
    let field = &schema.fields()[index];
    let rest = rest.trim();
    let upper = rest.to_ascii_uppercase();
    let field_name = field.name.clone();
    if upper == "IS NULL" {
        return Ok(Predicate::IsNull { field: field_name });
    }
    if upper == "IS NOT NULL" {
        return Ok(Predicate::IsNotNull { field: field_name });
    }
    if let Some(list) = upper.strip_prefix("IN").map(|_| rest[2..].trim()) {
        let inner = list
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| QueryError(format!("{spec:?}: IN needs a list like (a, b)")))?;
        let values = inner
            .split(',')
            .map(|v| literal(v, field.ty))
            .collect::<Result<_, _>>()?;
        return Ok(Predicate::In {
            field: field_name,
            values,
        });
    }
    let (op, value) = [("<=", CmpOp::Le), (">=", CmpOp::Ge), ("!=", CmpOp::Ne), ("<>", CmpOp::Ne), ("=", CmpOp::Eq), ("<", CmpOp::Lt), (">", CmpOp::Gt)]
        .iter()
        .find_map(|(token, op)| rest.strip_prefix(token).map(|v| (*op, v)))
        .ok_or_else(|| QueryError(format!("{spec:?}: expected FIELD OP VALUE with OP one of = != < <= > >=, IN (..), IS [NOT] NULL")))?;
    Ok(Predicate::Compare {
        field: field_name,
        op,
        value: literal(value, field.ty)?,
    })
}

/// A literal of type `ty` from text.
pub fn literal(text: &str, ty: FieldType) -> Result<Value, QueryError> {
    let t = text.trim();
    let unquoted = t
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| t.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
        .unwrap_or(t);
    let bad = || QueryError(format!("{t:?} is not a {ty} value"));
    Ok(match ty {
        FieldType::Boolean => Value::Boolean(t.parse().map_err(|_| bad())?),
        FieldType::Byte => Value::Byte(t.parse().map_err(|_| bad())?),
        FieldType::Short => Value::Short(t.parse().map_err(|_| bad())?),
        FieldType::Integer => Value::Integer(t.parse().map_err(|_| bad())?),
        FieldType::Long => Value::Long(t.parse().map_err(|_| bad())?),
        FieldType::Float => Value::Float(t.parse().map_err(|_| bad())?),
        FieldType::Double => Value::Double(t.parse().map_err(|_| bad())?),
        FieldType::String => Value::String(unquoted.to_string()),
        // In base64, the form every output prints BYTES in, so a value copied from an
        // answer finds its events.
        FieldType::Bytes => {
            Value::Bytes(tidemark_core::json::decode_base64(unquoted).ok_or_else(|| {
                QueryError(format!("{t:?} is not a BYTES value: write it in base64"))
            })?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::parse_spec("SYMBOL:STRING,PRICE:FLOAT,N:INTEGER").unwrap()
    }

    #[test]
    fn aggregations() {
        assert_eq!(
            parse_aggregation("max:PRICE").unwrap(),
            Aggregation::new(AggFn::Max, "PRICE")
        );
        assert_eq!(parse_aggregation("count").unwrap(), Aggregation::count());
        assert!(parse_aggregation("max").is_err());
        assert!(parse_aggregation("median:PRICE").is_err());
        assert!(parse_aggregation("sum:").is_err());
    }

    #[test]
    fn predicates() {
        let s = schema();
        assert_eq!(
            parse_predicate("symbol = 'AAPL'", &s).unwrap(),
            Predicate::Compare {
                field: "SYMBOL".into(),
                op: CmpOp::Eq,
                value: Value::String("AAPL".into())
            }
        );
        assert_eq!(
            parse_predicate("PRICE>=2.5", &s).unwrap(),
            Predicate::Compare {
                field: "PRICE".into(),
                op: CmpOp::Ge,
                value: Value::Float(2.5)
            }
        );
        assert_eq!(
            parse_predicate("N in (1, 2)", &s).unwrap(),
            Predicate::In {
                field: "N".into(),
                values: vec![Value::Integer(1), Value::Integer(2)]
            }
        );
        assert_eq!(
            parse_predicate("N is not null", &s).unwrap(),
            Predicate::IsNotNull { field: "N".into() }
        );
        for bad in ["X = 1", "N = abc", "N ~ 3", "N in 1,2", "PRICE"] {
            assert!(parse_predicate(bad, &s).is_err(), "{bad:?}");
        }
    }
}
