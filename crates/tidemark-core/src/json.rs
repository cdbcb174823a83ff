//! Events as JSON objects: `{"tstart": 123, "tend": 124, "SYMBOL": "A", ...}`.
//!
//! Keys match field names case-insensitively. Every schema field must be present (`null`
//! for no value); unknown and repeated keys are refused. Floats also accept the strings
//! "NaN", "Infinity" and "-Infinity", and BYTES are base64 strings.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value as Json};

use crate::{BatchBuilder, CoreError, EventBatch, FieldType, Schema, Timestamp, Value};

/// Parses JSON text like `serde_json::from_slice::<Value>`, except that an object giving
/// the same key twice is refused at any depth (serde_json keeps the last silently, so a
/// client's mistake would store a value it did not mean). Nesting is bounded by serde_json's
/// recursion limit (128).
pub fn parse_strict(bytes: &[u8]) -> Result<Json, serde_json::Error> {
    use serde::Deserialize as _;
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let Strict(value) = Strict::deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// A JSON value read by [`parse_strict`].
struct Strict(Json);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key {:?} is given twice in one object",
                    crate::truncated(&key, 64)
                )));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Json::Object(object))
    }
}

/// Decodes standard base64 (with padding), the form every output gives BYTES values in.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

pub fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes a list of JSON events into one batch; the first bad event fails the whole batch.
pub fn decode_events<'a>(
    schema: &Arc<Schema>,
    events: impl IntoIterator<Item = &'a Json>,
) -> Result<EventBatch, CoreError> {
    let mut builder = BatchBuilder::new(schema.clone(), 0);
    for (row, event) in events.into_iter().enumerate() {
        decode_event_into(&mut builder, event, row)?;
    }
    Ok(builder.finish())
}

/// Appends one JSON event to `builder`; `row` numbers the event in error messages.
pub fn decode_event_into(
    builder: &mut BatchBuilder,
    event: &Json,
    row: usize,
) -> Result<(), CoreError> {
    let Json::Object(object) = event else {
        return Err(CoreError::InvalidEvent {
            row,
            message: format!("expected a JSON object, got {}", kind(event)),
        });
    };
    let (tstart, tend, values) = decode_object(builder.schema(), object, row)?;
    builder.push_row(tstart, tend, &values)
}

fn decode_object(
    schema: &Schema,
    object: &Map<String, Json>,
    row: usize,
) -> Result<(Timestamp, Option<Timestamp>, Vec<Value>), CoreError> {
    let mut tstart = None;
    let mut tend = None;
    let mut values: Vec<Option<Value>> = vec![None; schema.len()];
    for (key, json) in object {
        let duplicate = || CoreError::DuplicateField {
            row,
            field: key.clone(),
        };
        if key.eq_ignore_ascii_case("tstart") {
            if tstart.replace(timestamp(json, row, "tstart")?).is_some() {
                return Err(duplicate());
            }
        } else if key.eq_ignore_ascii_case("tend") {
            let end = if json.is_null() {
                None
            } else {
                Some(timestamp(json, row, "tend")?)
            };
            if tend.replace(end).is_some() {
                return Err(duplicate());
            }
        } else {
            let index = schema
                .index_of(key)
                .ok_or_else(|| CoreError::InvalidEvent {
                    row,
                    message: format!("field {key:?} is not in the stream's schema"),
                })?;
            let field = &schema.fields()[index];
            let value = field_value(json, field.ty).ok_or_else(|| CoreError::TypeMismatch {
                row,
                field: field.name.clone(),
                expected: field.ty,
                found: if json.is_number() {
                    format!("{}, out of its range", describe(json))
                } else {
                    describe(json)
                },
            })?;
            if values[index].replace(value).is_some() {
                return Err(duplicate());
            }
        }
    }
    let tstart = tstart.ok_or_else(|| CoreError::InvalidTimestamp {
        row,
        reason: "tstart is missing".into(),
    })?;
    let values = values
        .into_iter()
        .zip(schema.fields())
        .map(|(v, f)| {
            v.ok_or_else(|| CoreError::MissingField {
                row,
                field: f.name.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((tstart, tend.flatten(), values))
}

fn timestamp(json: &Json, row: usize, which: &str) -> Result<Timestamp, CoreError> {
    let invalid = |reason: String| CoreError::InvalidTimestamp { row, reason };
    match json {
        Json::Number(n) => {
            if let Some(v) = n.as_i64() {
                return Ok(v);
            }
            if n.is_u64() {
                return Err(invalid(format!(
                    "{which} {n} is beyond the latest timestamp ({} ns since the epoch, in 2262)",
                    i64::MAX
                )));
            }
            // A float is exact only below 2^53; beyond, it would be silently rounded.
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() <= MAX_EXACT_FLOAT {
                Ok(f as i64)
            } else if f.fract() == 0.0 && f.is_finite() {
                Err(invalid(format!(
                    "{which} {n} is a float too large to be exact; write it as an integer"
                )))
            } else {
                Err(invalid(format!(
                    "{which} {n} is not a whole number of nanoseconds"
                )))
            }
        }
        Json::String(text) => crate::time::parse_rfc3339(text).map_err(|e| {
            invalid(format!(
                "{which}: {e}; or an integer (nanoseconds since the epoch)"
            ))
        }),
        other => Err(invalid(format!(
            "{which} must be an integer (nanoseconds since the epoch) or an RFC 3339 time, got {}",
            describe(other)
        ))),
    }
}

fn field_value(json: &Json, ty: FieldType) -> Option<Value> {
    if json.is_null() {
        return Some(Value::Null);
    }
    Some(match ty {
        FieldType::Boolean => Value::Boolean(json.as_bool()?),
        FieldType::Byte => Value::Byte(i8::try_from(integer(json)?).ok()?),
        FieldType::Short => Value::Short(i16::try_from(integer(json)?).ok()?),
        FieldType::Integer => Value::Integer(i32::try_from(integer(json)?).ok()?),
        FieldType::Long => Value::Long(integer(json)?),
        // A finite number beyond f32's range would become an infinity: refused instead.
        FieldType::Float => {
            let wide = float(json)?;
            let narrow = wide as f32;
            if wide.is_finite() && !narrow.is_finite() {
                return None;
            }
            Value::Float(narrow)
        }
        FieldType::Double => Value::Double(float(json)?),
        FieldType::String => Value::String(json.as_str()?.to_string()),
        FieldType::Bytes => Value::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(json.as_str()?)
                .ok()?,
        ),
    })
}

/// The largest magnitude at which every whole f64 is exact (2^53).
const MAX_EXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

/// An integer, or a float with no fractional part that is exact (at most 2^53).
fn integer(json: &Json) -> Option<i64> {
    let n = json.as_number()?;
    n.as_i64().or_else(|| {
        let f = n.as_f64()?;
        (f.fract() == 0.0 && f.abs() <= MAX_EXACT_FLOAT).then_some(f as i64)
    })
}

fn float(json: &Json) -> Option<f64> {
    match json {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" | "nan" => Some(f64::NAN),
            "Infinity" | "inf" | "+Infinity" => Some(f64::INFINITY),
            "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn describe(json: &Json) -> String {
    let text = json.to_string();
    if text.len() > 40 {
        format!(
            "{} ({}…)",
            kind(json),
            &text[..text.floor_char_boundary(40)]
        )
    } else {
        format!("{} ({text})", kind(json))
    }
}

/// One event of a batch as a JSON object with `tstart`, `tend` (when present) and the fields.
pub fn event_to_json(batch: &EventBatch, row: usize) -> Json {
    let mut object = Map::with_capacity(batch.schema().len() + 2);
    object.insert("tstart".into(), Json::from(batch.tstart()[row]));
    if let Some(end) = batch.tend_at(row) {
        object.insert("tend".into(), Json::from(end));
    }
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        object.insert(field.name.clone(), column.value(row).to_json());
    }
    Json::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Arc<Schema> {
        Arc::new(
            Schema::parse_spec("SYMBOL:STRING,SECURITYTYPE:INTEGER,LASTTRADEPRICE:FLOAT,RAW:BYTES")
                .unwrap(),
        )
    }

    #[test]
    fn decodes_case_insensitively_and_round_trips() {
        let events = [
            json!({"symbol": "A", "SecurityType": 1, "LASTTRADEPRICE": 2.5, "raw": "AAE=", "TSTART": 123, "tend": 124}),
            json!({"SYMBOL": null, "SECURITYTYPE": 2.0, "LASTTRADEPRICE": "NaN", "RAW": null, "tstart": 1e3}),
        ];
        let batch = decode_events(&schema(), &events).unwrap();
        assert_eq!(batch.tstart(), &[123, 1000]);
        assert_eq!(batch.tend_at(0), Some(124));
        assert_eq!(batch.row(0)[3], Value::Bytes(vec![0, 1]));
        assert_eq!(batch.row(1)[0], Value::Null);
        let back = event_to_json(&batch, 0);
        assert_eq!(back["SYMBOL"], json!("A"));
        assert_eq!(back["RAW"], json!("AAE="));
        assert_eq!(event_to_json(&batch, 1)["LASTTRADEPRICE"], json!("NaN"));
        let again = decode_events(&schema(), &[back, event_to_json(&batch, 1)]).unwrap();
        assert_eq!(again.row(0), batch.row(0));
    }

    #[test]
    fn refuses_bad_events() {
        let base = json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1});
        let cases = [
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null}),
                "tstart is missing",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "RAW": null, "tstart": 1}),
                "missing",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1, "X": 1}),
                "not in the stream",
            ),
            (
                json!({"SYMBOL": 5, "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1}),
                "expects STRING",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 3000000000u64, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1}),
                "expects INTEGER",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1.5}),
                "whole number",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 1.7e18}),
                "write it as an integer",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": "NaN"}),
                "not an RFC 3339 time",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": true}),
                "must be an integer",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": "!!", "tstart": 1}),
                "expects BYTES",
            ),
            (
                json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "RAW": null, "tstart": 5, "tend": 4}),
                "before tstart",
            ),
            (json!([1, 2]), "JSON object"),
        ];
        for (event, expected) in cases {
            let err = decode_events(&schema(), &[base.clone(), event.clone()])
                .expect_err(&event.to_string())
                .to_string();
            assert!(err.contains(expected), "{event}: {err}");
            assert!(
                err.starts_with("event 1") || err.contains("event 1"),
                "{err}"
            );
        }
        let too_wide = json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 1e300, "RAW": null, "tstart": 1});
        let err = decode_events(&schema(), &[too_wide])
            .unwrap_err()
            .to_string();
        assert!(err.contains("out of its range"), "{err}");
        let past_2262 = json!({"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 1.0, "RAW": null, "tstart": u64::MAX});
        let err = decode_events(&schema(), &[past_2262])
            .unwrap_err()
            .to_string();
        assert!(err.contains("beyond the latest timestamp"), "{err}");
        let duplicate = r#"{"SYMBOL":"A","symbol":"B","SECURITYTYPE":1,"LASTTRADEPRICE":2.5,"RAW":null,"tstart":1}"#;
        let parsed: Json = serde_json::from_str(duplicate).unwrap();
        assert!(decode_events(&schema(), &[parsed]).is_err());
    }

    #[test]
    fn strict_parsing_refuses_a_key_given_twice_at_any_depth() {
        for text in [
            r#"{"I":1,"I":2}"#,
            r#"{"tstart":1,"tstart":2}"#,
            r#"[{"a":{"b":1,"b":1}}]"#,
            r#"{"events":[],"events":[]}"#,
        ] {
            let err = parse_strict(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains("given twice"), "{text}: {err}");
        }
        let text = r#"{"a":[1,-2,18446744073709551615,2.5,"x",null,true],"b":{"c":{}}}"#;
        assert_eq!(
            parse_strict(text.as_bytes()).unwrap(),
            serde_json::from_str::<Json>(text).unwrap()
        );
        assert!(parse_strict(b"{} x").is_err());
        assert!(parse_strict("[".repeat(10_000).as_bytes()).is_err());
    }
}
