//! A bound portal's parameters as the values they are: PostgreSQL types in text or binary
//! format (as the client chose) to [`Param`]s, which `tidemark_sql::params` binds.

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime};
use pgwire::api::portal::Portal;
use pgwire::api::Type;
use pgwire::error::PgWireResult;
use tidemark_sql::params::Param;

use super::errors::user_error;

/// Every parameter of `portal`, in order: exactly `expected` of them, as PostgreSQL.
pub fn decode_all<S: Clone>(portal: &Portal<S>, expected: usize) -> PgWireResult<Vec<Param>> {
    if portal.parameter_len() != expected {
        return Err(user_error(
            "08P01",
            format!(
                "bind message supplies {} parameters, but prepared statement \"{}\" requires {}",
                portal.parameter_len(),
                portal.statement.id,
                expected
            ),
        ));
    }
    (0..portal.parameter_len())
        .map(|i| decode(portal, i))
        .collect()
}

fn decode<S: Clone>(portal: &Portal<S>, i: usize) -> PgWireResult<Param> {
    let ty = portal
        .statement
        .parameter_types
        .get(i)
        .cloned()
        .flatten()
        .unwrap_or(Type::UNKNOWN);
    let unsupported = || {
        user_error(
            "0A000",
            format!(
                "parameter ${} has type {}, which Tidemark does not take: send it as text",
                i + 1,
                ty.name()
            ),
        )
    };
    let null = |value: Option<Param>| value.unwrap_or(Param::Null);
    Ok(match ty {
        Type::BOOL => {
            // postgres-types reads any nonzero byte as true; a boolean is one byte, 0 or 1.
            let raw = portal.parameters.get(i).and_then(Option::as_ref);
            if portal.parameter_format.is_binary(i)
                && raw.is_some_and(|raw| raw.as_ref() != [0] && raw.as_ref() != [1])
            {
                return Err(user_error(
                    "22P03",
                    format!(
                        "parameter ${} is not a binary boolean (one byte, 0 or 1)",
                        i + 1
                    ),
                ));
            }
            null(portal.parameter::<bool>(i, &ty)?.map(Param::Bool))
        }
        Type::INT2 => null(
            portal
                .parameter::<i16>(i, &ty)?
                .map(|v| Param::Int(v.into())),
        ),
        Type::INT4 => null(
            portal
                .parameter::<i32>(i, &ty)?
                .map(|v| Param::Int(v.into())),
        ),
        Type::INT8 => null(portal.parameter::<i64>(i, &ty)?.map(Param::Int)),
        Type::FLOAT4 => null(
            portal
                .parameter::<f32>(i, &ty)?
                .map(|v| Param::Float(v.into())),
        ),
        Type::FLOAT8 => null(portal.parameter::<f64>(i, &ty)?.map(Param::Float)),
        Type::NUMERIC => null(
            portal
                .parameter::<rust_decimal::Decimal>(i, &ty)?
                .map(|d| Param::Decimal(d.to_string())),
        ),
        Type::TIMESTAMPTZ => match portal.parameter::<DateTime<FixedOffset>>(i, &ty)? {
            None => Param::Null,
            Some(t) => Param::Timestamp(nanos(i, t.timestamp_nanos_opt())?),
        },
        Type::TIMESTAMP => match portal.parameter::<NaiveDateTime>(i, &ty)? {
            None => Param::Null,
            Some(t) => Param::Timestamp(nanos(i, t.and_utc().timestamp_nanos_opt())?),
        },
        Type::DATE => match portal.parameter::<NaiveDate>(i, &ty)? {
            None => Param::Null,
            Some(d) => Param::Timestamp(nanos(
                i,
                d.and_hms_opt(0, 0, 0)
                    .and_then(|t| t.and_utc().timestamp_nanos_opt()),
            )?),
        },
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            if portal.parameter_format.is_binary(i) && ty == Type::UNKNOWN {
                return Err(unsupported());
            }
            // `unknown` is read as text whatever it holds (the String decoder takes it).
            let text_type = if ty == Type::UNKNOWN { Type::TEXT } else { ty };
            null(portal.parameter::<String>(i, &text_type)?.map(Param::Text))
        }
        _ => return Err(unsupported()),
    })
}

/// Tidemark's times are nanoseconds in an i64: years 1677 to 2262.
fn nanos(i: usize, ns: Option<i64>) -> PgWireResult<i64> {
    ns.ok_or_else(|| {
        user_error(
            "22008",
            format!(
                "parameter ${} is outside the times Tidemark holds (1677 to 2262)",
                i + 1
            ),
        )
    })
}
