//! The catalog functions clients call that `datafusion-pg-catalog` leaves out: `version()`
//! (as PostgreSQL's, which SQLAlchemy parses), `current_setting()` (Grafana reads
//! `server_version_num` and `search_path`), and the descriptions (`obj_description`,
//! `col_description`, `shobj_description`: Tidemark keeps no comments, so NULL, as
//! PostgreSQL answers for an object without one), whether a function or type is visible
//! (psql's `\df`, `\dT`: every object is, there being one schema), `pg_size_pretty`,
//! `to_regtype` (psycopg looks a type's oid up so), and the sizes and function signatures
//! psql's `\l+`, `\dt+` and `\df` name (unknown: NULL).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{exec_err, plan_err, Result as DfResult, ScalarValue};
use datafusion::execution::{FunctionRegistry, SessionState};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};

use crate::session;

/// Registers the functions in `state`, `version()` in place of DataFusion's.
pub(crate) fn install(state: &mut SessionState) {
    // (oid), (oid, catalog name) or (oid, column number): a description's arguments do not
    // change the answer.
    let described = || {
        Signature::one_of(
            vec![TypeSignature::Any(1), TypeSignature::Any(2)],
            Volatility::Stable,
        )
    };
    let no_description = ScalarValue::Utf8(None);
    let visible = ScalarValue::Boolean(Some(true));
    let functions = [
        Constant::function(
            "version",
            Signature::nullary(Volatility::Immutable),
            ScalarValue::Utf8(Some(session::version())),
        ),
        Constant::function("obj_description", described(), no_description.clone()),
        Constant::function("col_description", described(), no_description.clone()),
        Constant::function("shobj_description", described(), no_description),
        // One schema, on the search path: every function and type is visible.
        Constant::of_any_one("pg_function_is_visible", visible.clone()),
        Constant::of_any_one("pg_type_is_visible", visible),
        // psql's `\l+` and `\dt+` ask sizes of databases and tables: unknown here (NULL,
        // which psql shows blank; `tidemark streams info` says a stream's bytes on disk),
        // rather than the 0 that would say a stream is empty.
        Constant::of_any_one("pg_database_size", ScalarValue::Int64(None)),
        Constant::of_any_one("pg_table_size", ScalarValue::Int64(None)),
        Constant::of_any_one("pg_indexes_size", ScalarValue::Int64(None)),
        // psql's `\df` lists the functions outside `pg_catalog`: there are none, but its
        // query names these.
        Constant::of_any_one("pg_get_function_result", ScalarValue::Utf8(None)),
        Constant::of_any_one("pg_get_function_arguments", ScalarValue::Utf8(None)),
        ScalarUDF::new_from_impl(CurrentSetting::default()),
        ScalarUDF::new_from_impl(SizePretty::default()),
        ScalarUDF::new_from_impl(ToRegtype::default()),
        ScalarUDF::new_from_impl(TypeOf::default()),
    ];
    for function in functions {
        // SessionState's registry cannot fail (the Result is the trait's).
        let _ = state.register_udf(Arc::new(function));
    }
}

/// A function whose answer is the same whatever its arguments: `version()`, the
/// descriptions (NULL), whether a function or type is visible (true).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Constant {
    name: &'static str,
    signature: Signature,
    value: ScalarValue,
}

impl Constant {
    /// `name(x)` of any one argument, answering `value` whatever it is.
    fn of_any_one(name: &'static str, value: ScalarValue) -> ScalarUDF {
        Constant::function(name, Signature::any(1, Volatility::Stable), value)
    }

    fn function(name: &'static str, signature: Signature, value: ScalarValue) -> ScalarUDF {
        ScalarUDF::new_from_impl(Constant {
            name,
            signature,
            value,
        })
    }
}

impl ScalarUDFImpl for Constant {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(self.value.data_type())
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Ok(ColumnarValue::Scalar(self.value.clone()))
    }
}

/// `pg_typeof(x)`: the name of `x`'s type as PostgreSQL writes it (`double precision`,
/// `text`, `timestamp with time zone`), the type its value has on the wire.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TypeOf {
    signature: Signature,
}

impl Default for TypeOf {
    fn default() -> Self {
        TypeOf {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for TypeOf {
    fn name(&self) -> &str {
        "pg_typeof"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(field) = args.arg_fields.first() else {
            return exec_err!("pg_typeof takes one value");
        };
        let name = match arrow_pg::datatypes::into_pg_type(field.data_type()) {
            Ok(pg) => crate::postgres::syntax::sql_type_name(pg.name()).to_owned(),
            // A type with no PostgreSQL counterpart (a list, a struct): Arrow's name.
            Err(_) => field.data_type().to_string(),
        };
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(name))))
    }
}

/// `current_setting(name [, missing_ok])`: the settings `SHOW` answers
/// ([`session::setting`]); an unknown name is PostgreSQL's error, or NULL with `missing_ok`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentSetting {
    signature: Signature,
}

impl Default for CurrentSetting {
    fn default() -> Self {
        CurrentSetting {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Exact(vec![DataType::Utf8]),
                    TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean]),
                ],
                Volatility::Stable,
            ),
        }
    }
}

impl ScalarUDFImpl for CurrentSetting {
    fn name(&self) -> &str {
        "current_setting"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let mut arrays = ColumnarValue::values_to_arrays(&args.args)?.into_iter();
        let (Some(names), missing_ok) = (arrays.next(), arrays.next()) else {
            return plan_err!("current_setting takes a setting's name");
        };
        let Some(names) = names.as_any().downcast_ref::<StringArray>() else {
            return exec_err!("current_setting's name must be text");
        };
        let missing_ok = missing_ok.as_ref().and_then(|a| {
            let flags: &BooleanArray = a.as_any().downcast_ref()?;
            Some(flags.clone())
        });
        let mut values = Vec::with_capacity(rows);
        for row in 0..names.len() {
            if names.is_null(row) {
                values.push(None);
                continue;
            }
            let name = names.value(row);
            match session::setting(&name.to_ascii_lowercase()) {
                Some(value) => values.push(Some(value)),
                None if missing_ok
                    .as_ref()
                    .is_some_and(|ok| ok.is_valid(row) && ok.value(row)) =>
                {
                    values.push(None)
                }
                None => return exec_err!("unrecognized configuration parameter \"{name}\""),
            }
        }
        let values: ArrayRef = Arc::new(StringArray::from(values));
        Ok(ColumnarValue::Array(values))
    }
}

/// `pg_size_pretty(bytes)`: as PostgreSQL writes a size (`8192 bytes`, `16 kB`, `3 MB`:
/// units of 1024, rounded, the next unit from 10240 of the last).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SizePretty {
    signature: Signature,
}

impl Default for SizePretty {
    fn default() -> Self {
        SizePretty {
            signature: Signature::exact(vec![DataType::Int64], Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SizePretty {
    fn name(&self) -> &str {
        "pg_size_pretty"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let Some(sizes) = arrays.first().and_then(|a| {
            a.as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
        }) else {
            return exec_err!("pg_size_pretty takes a size in bytes");
        };
        let pretty: StringArray = sizes.iter().map(|s| s.map(size_pretty)).collect();
        Ok(ColumnarValue::Array(Arc::new(pretty)))
    }
}

fn size_pretty(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if bytes.unsigned_abs() < 10 * 1024 {
        return format!("{bytes} bytes");
    }
    let mut size = bytes as f64;
    for unit in UNITS {
        size /= 1024.0;
        if size.abs() < 10.0 * 1024.0 || unit == "PB" {
            return format!("{} {unit}", size.round() as i64);
        }
    }
    unreachable!("the last unit returns")
}

#[cfg(test)]
mod tests {
    use super::size_pretty;

    #[test]
    fn sizes_are_written_as_postgresql_writes_them() {
        assert_eq!(size_pretty(8192), "8192 bytes");
        assert_eq!(size_pretty(10 * 1024), "10 kB");
        assert_eq!(size_pretty(3 * 1024 * 1024), "3072 kB");
        assert_eq!(size_pretty(30 * 1024 * 1024), "30 MB");
        assert_eq!(size_pretty(-20000), "-20 kB");
    }
}

/// `to_regtype(name)`: the oid of the type `name` names in `pg_type` (PostgreSQL's own
/// rows), NULL for a type there is not (psycopg asks for `hstore` on connect).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ToRegtype {
    signature: Signature,
}

impl Default for ToRegtype {
    fn default() -> Self {
        ToRegtype {
            signature: Signature::exact(vec![DataType::Utf8], Volatility::Stable),
        }
    }
}

impl ScalarUDFImpl for ToRegtype {
    fn name(&self) -> &str {
        "to_regtype"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let Some(names) = arrays
            .first()
            .and_then(|a| a.as_any().downcast_ref::<StringArray>())
        else {
            return exec_err!("to_regtype takes a type's name");
        };
        let types = super::type_oids();
        let oids: datafusion::arrow::array::Int32Array = names
            .iter()
            .map(|name| {
                let name = name?.trim();
                // `pg_catalog.int4` and `"int4"` name int4 too.
                let name = name.strip_prefix("pg_catalog.").unwrap_or(name);
                types.get(name.trim_matches('"')).copied()
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(oids)))
    }
}
