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
        _ => match array_element(&ty) {
            Some(element) => decode_array(portal, i, &ty, element)?,
            None => return Err(unsupported()),
        },
    })
}

/// The kinds of element an array parameter may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    Text,
    Int,
    Float,
    Numeric,
    Bool,
}

fn array_element(ty: &Type) -> Option<Element> {
    Some(match *ty {
        Type::TEXT_ARRAY | Type::VARCHAR_ARRAY | Type::BPCHAR_ARRAY | Type::NAME_ARRAY => {
            Element::Text
        }
        Type::INT2_ARRAY | Type::INT4_ARRAY | Type::INT8_ARRAY => Element::Int,
        Type::FLOAT4_ARRAY | Type::FLOAT8_ARRAY => Element::Float,
        Type::NUMERIC_ARRAY => Element::Numeric,
        Type::BOOL_ARRAY => Element::Bool,
        _ => return None,
    })
}

/// An array parameter (psycopg sends a list of numbers as `int8[]`, `float8[]`...; a list
/// of strings it leaves untyped, which arrives as text): its elements, each a parameter.
fn decode_array<S: Clone>(
    portal: &Portal<S>,
    i: usize,
    ty: &Type,
    element: Element,
) -> PgWireResult<Param> {
    let Some(raw) = portal.parameters.get(i).and_then(Option::as_ref) else {
        return Ok(Param::Null);
    };
    let invalid = |why: String| user_error("22P02", format!("parameter ${}: {why}", i + 1));
    if portal.parameter_format.is_binary(i) {
        let elements: Vec<Param> = match element {
            Element::Text => binary!(portal, i, ty, String, Param::Text),
            Element::Int => match *ty {
                Type::INT2_ARRAY => binary!(portal, i, ty, i16, |v| Param::Int(v.into())),
                Type::INT4_ARRAY => binary!(portal, i, ty, i32, |v| Param::Int(v.into())),
                _ => binary!(portal, i, ty, i64, Param::Int),
            },
            Element::Float => match *ty {
                Type::FLOAT4_ARRAY => {
                    binary!(portal, i, ty, f32, |v| Param::Float(v.into()))
                }
                _ => binary!(portal, i, ty, f64, Param::Float),
            },
            Element::Numeric => binary!(portal, i, ty, rust_decimal::Decimal, |d| {
                Param::Decimal(d.to_string())
            }),
            Element::Bool => binary!(portal, i, ty, bool, Param::Bool),
        };
        return Ok(Param::Array(elements));
    }
    let text = std::str::from_utf8(raw).map_err(|e| invalid(e.to_string()))?;
    let elements = tidemark_sql::postgres::arrays::parse_array(text).map_err(invalid)?;
    elements
        .into_iter()
        .map(|element_text| {
            let Some(t) = element_text else {
                return Ok(Param::Null);
            };
            let bad = || invalid(format!("{t:?} is not a {} element", ty.name()));
            Ok(match element {
                Element::Text => Param::Text(t),
                Element::Int => Param::Int(t.trim().parse().map_err(|_| bad())?),
                // Rust reads NaN, inf and infinity, in any case, as PostgreSQL does.
                Element::Float => Param::Float(t.trim().parse().map_err(|_| bad())?),
                Element::Numeric => Param::Decimal(t.trim().to_owned()),
                Element::Bool => match t.trim().to_ascii_lowercase().as_str() {
                    "t" | "true" | "yes" | "on" | "1" => Param::Bool(true),
                    "f" | "false" | "no" | "off" | "0" => Param::Bool(false),
                    _ => return Err(bad()),
                },
            })
        })
        .collect::<PgWireResult<Vec<Param>>>()
        .map(Param::Array)
}

/// The elements of a binary array parameter of Rust type `$t`, each made a parameter by
/// `$param` (a macro: the decoding traits' bounds are postgres-types', not a dependency).
macro_rules! binary {
    ($portal:expr, $i:expr, $ty:expr, $t:ty, $param:expr) => {
        $portal
            .parameter::<Vec<Option<$t>>>($i, $ty)?
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.map_or(Param::Null, $param))
            .collect::<Vec<Param>>()
    };
}
use binary;

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
