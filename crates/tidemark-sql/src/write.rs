//! SQL that adds events to a stream: `INSERT INTO stream [(columns)] VALUES ... | SELECT ...`
//! and `COPY stream [(columns)] FROM STDIN`, as QuestDB users and PostgreSQL tools
//! (`psql`'s `\copy`, pandas' `to_sql`, a JDBC prepared INSERT) write.
//!
//! Owns: which stream and columns a write names, and its rows as one batch of the stream's
//! events, each value cast to its column's type as PostgreSQL casts it (an INSERT's values
//! through SQL's `CAST`, so `1.5` into an INTEGER rounds to 2 and `300` into a BYTE is
//! "tinyint out of range"; a COPY's text as Arrow reads text). Columns not named are null
//! (`tend`: the event has no end); `tstart` is required.
//!
//! Must never know about: storing the rows. The caller submits them through its write path
//! (tokens, the write budget, durability, the out-of-order window), all or nothing, as every
//! other door does.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, RecordBatch, StringArray};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::sql::sqlparser::ast::{
    visit_expressions, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget,
    Expr, Ident, Insert, ObjectName, Query, SetExpr, Statement, TableObject,
};
use futures::StreamExt;
use tidemark_core::{EventBatch, FieldType, Schema};
use tidemark_engine::{Engine, EngineError};
use tidemark_protocol::arrow::events_of_batches;
use tidemark_protocol::pg_copy::{self, CopyFormat, CopyOptions};

use crate::bounds::{operators, parse_bounded, MAX_OPERATORS, MAX_SQL_BYTES};
use crate::convert::{arrow_type, time_type, TEND, TSTART};
use crate::resolve::exact_or_folded;
use crate::{PlanCache, SqlError, SqlOptions};

/// The kinds of statement that write, told from a statement's text alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Insert,
    /// `COPY ... FROM STDIN`: its rows follow as the transport's copy data.
    CopyFromStdin,
}

/// The write `sql` is, if it is one statement and one that writes; `None` for anything
/// else, including text that does not parse (the query path says why).
pub fn write_of(sql: &str) -> Option<Write> {
    // Every query over HTTP is asked this before it is planned (and parsed again): only text
    // that could be a write, naming INSERT or COPY, pays for a parse here.
    let could_write = [b"insert".as_slice(), b"copy"].iter().any(|word| {
        sql.as_bytes()
            .windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    });
    if !could_write {
        return None;
    }
    write_of_statement(&crate::bounds::one_statement(sql)?)
}

/// The write `statement` is, if it writes.
pub fn write_of_statement(statement: &Statement) -> Option<Write> {
    match statement {
        Statement::Insert(_) => Some(Write::Insert),
        Statement::Copy {
            to: false,
            target: CopyTarget::Stdin,
            ..
        } => Some(Write::CopyFromStdin),
        _ => None,
    }
}

/// Events for one stream, ready to be appended as one batch.
#[derive(Debug)]
pub struct Rows {
    pub stream: String,
    pub events: EventBatch,
}

/// The rows `sql` (one `INSERT`) adds: its `VALUES` or query run as a query of `engine`
/// (within `options`' bounds), at most `max_bytes` of them, each batch's bytes asked of
/// `reserve` (the caller's budget: `false` refuses the INSERT as overloaded) as it comes.
pub async fn insert(
    engine: &Engine,
    sql: &str,
    options: SqlOptions,
    max_bytes: usize,
    reserve: &mut (dyn FnMut(usize) -> bool + Send),
) -> Result<Rows, SqlError> {
    let insert = match one_statement(sql)? {
        Statement::Insert(insert) => insert,
        other => {
            return Err(SqlError::Internal(format!(
                "insert() was given another statement: {other}"
            )))
        }
    };
    refuse_insert_clauses(&insert)?;
    let TableObject::TableName(table) = &insert.table else {
        return Err(SqlError::Unsupported(
            "INSERT into a table function (name a stream)".into(),
        ));
    };
    let Some(source) = &insert.source else {
        return Err(SqlError::Unsupported(
            "INSERT without VALUES or a query (DEFAULT VALUES): every event needs its tstart"
                .into(),
        ));
    };
    let named = insert
        .columns
        .iter()
        .map(|name| {
            let single = match name.0.as_slice() {
                [part] => part.as_ident().cloned(),
                _ => None,
            };
            single.ok_or_else(|| {
                SqlError::Unsupported(format!("{name} as a column of INSERT (name a field)"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut target = Target::of(engine, table, &named)?;
    let values = values_of(source)?;
    let given = match &values {
        Some(rows) => rows.first().map_or(0, |row| row.len()),
        None => crate::describe(engine, &source.to_string(), options.clone())
            .await?
            .fields()
            .len(),
    };
    // As PostgreSQL: without a column list, the values fill the first columns in order.
    if named.is_empty() && given < target.columns.len() {
        target.columns.truncate(given);
    }
    if given > target.columns.len() {
        return Err(SqlError::Invalid(format!(
            "INSERT has more expressions ({given}) than target columns ({}: {})",
            target.columns.len(),
            target.names()
        )));
    }
    if given < target.columns.len() {
        return Err(SqlError::Invalid(format!(
            "INSERT has more target columns ({}) than expressions ({given})",
            target.columns.len()
        )));
    }
    let schema = target.arrow_schema();
    let mut collected = Collected {
        batches: Vec::new(),
        bytes: 0,
        max_bytes,
        reserve,
    };
    match values {
        // Each value typed by its column, as PostgreSQL types an INSERT's VALUES: rows may
        // then write a column's values differently ('f' in one, false in the next). Typed
        // values are longer text than the statement's: they are run in parts, each within
        // the bounds of one statement ([`crate::bounds`]), collected before any is stored.
        Some(rows) => {
            for part in values_parts(&rows, &target.columns)? {
                let query = select_into(&part, &target.columns, given, false);
                collected
                    .run(engine, &query, options.clone(), &schema)
                    .await?;
            }
        }
        // The query's answer, cast by SQL to each column's type: PostgreSQL's casts
        // (rounding, ranges, text to times) are the query engine's, not repeated here.
        None => {
            let query = select_into(&source.to_string(), &target.columns, given, true);
            collected.run(engine, &query, options, &schema).await?;
        }
    }
    target.rows(&schema, &collected.batches)
}

/// The batches of an INSERT's rows, as they are computed: held on their budget.
struct Collected<'r> {
    batches: Vec<RecordBatch>,
    bytes: usize,
    max_bytes: usize,
    reserve: &'r mut (dyn FnMut(usize) -> bool + Send),
}

impl Collected<'_> {
    /// Runs `query` and keeps its batches (as `schema`'s types).
    async fn run(
        &mut self,
        engine: &Engine,
        query: &str,
        options: SqlOptions,
        schema: &SchemaRef,
    ) -> Result<(), SqlError> {
        let mut answer = crate::query_with(&PlanCache::new(0), engine, query, options)
            .await
            .map_err(integer_out_of_range)?;
        while let Some(batch) = answer.next().await {
            let batch = of_schema(batch.map_err(|e| integer_out_of_range(e.into()))?, schema)?;
            let bytes = batch.get_array_memory_size();
            self.bytes += bytes;
            if self.bytes > self.max_bytes {
                return Err(SqlError::TooLarge(format!(
                    "the INSERT adds more than {} bytes of events (the server's \
                     limits.max_body_bytes): split it into several statements",
                    self.max_bytes
                )));
            }
            if !(self.reserve)(bytes) {
                return Err(SqlError::Engine(EngineError::Overloaded(
                    "the server is taking as many appends as it can: retry the INSERT shortly"
                        .into(),
                )));
            }
            self.batches.push(batch);
        }
        Ok(())
    }
}

/// The query giving `source`'s rows (of `given` columns) as `columns`: cast to each column's
/// type when `cast` (a query's answer; VALUES are typed already), BYTES as they are (text
/// for them is read here as PostgreSQL reads it, `\x00ff`, not as SQL's cast reads it).
fn select_into(source: &str, columns: &[TargetColumn], given: usize, cast: bool) -> String {
    let select = columns
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let name = Ident::with_quote('"', &column.name);
            if cast && !column.bytes {
                format!("CAST(\"value {i}\" AS {}) AS {name}", column.sql_type)
            } else {
                format!("\"value {i}\" AS {name}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let aliases = (0..given)
        .map(|i| format!("\"value {i}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!("SELECT {select} FROM ({source}) AS \"inserted\"({aliases})")
}

/// The rows of an INSERT's source when it is a plain `VALUES` list, each of the same length.
fn values_of(source: &Query) -> Result<Option<Vec<&[Expr]>>, SqlError> {
    let plain = source.with.is_none()
        && source.order_by.is_none()
        && source.limit_clause.is_none()
        && source.fetch.is_none();
    let SetExpr::Values(values) = source.body.as_ref() else {
        return Ok(None);
    };
    if !plain {
        return Ok(None);
    }
    let rows: Vec<&[Expr]> = values
        .rows
        .iter()
        .map(|row| row.content.as_slice())
        .collect();
    let width = rows.first().map_or(0, |row| row.len());
    if rows.iter().any(|row| row.len() != width) {
        return Err(SqlError::Invalid(
            "VALUES lists must all be the same length".into(),
        ));
    }
    Ok(Some(rows))
}

/// One value of a `VALUES` row as text: `DEFAULT` is NULL (a stream's fields have no other
/// default; `tstart` has none and is then refused as missing). A subquery is refused: each
/// part of a long `VALUES` list runs as a query of its own, which DataFusion cannot run a
/// scalar subquery in (it failed with an internal error).
fn value_of(value: &Expr) -> Result<String, SqlError> {
    if let Expr::Identifier(ident) = value {
        if ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("default") {
            return Ok("NULL".into());
        }
    }
    let subquery = visit_expressions(value, |e| match e {
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    if subquery.is_break() {
        return Err(SqlError::Unsupported(format!(
            "a subquery in VALUES ({value}): write INSERT INTO stream (columns) SELECT ..."
        )));
    }
    Ok(value.to_string())
}

/// `VALUES` with each value cast to its column's type (BYTES values as they are: see
/// [`bytea`]), in parts whose text (operators and bytes) is within the bounds of one
/// statement.
fn values_parts(rows: &[&[Expr]], columns: &[TargetColumn]) -> Result<Vec<String>, SqlError> {
    // Room for the query around the values: SELECT, FROM, VALUES and an AS per column, and
    // its text.
    let budget = MAX_OPERATORS.saturating_sub(8 + 2 * columns.len());
    let room =
        MAX_SQL_BYTES.saturating_sub(select_into("VALUES ", columns, columns.len(), false).len());
    let mut parts = Vec::new();
    let mut part: Vec<String> = Vec::new();
    let (mut used, mut bytes) = (0, 0);
    for row in rows {
        let values: Vec<String> = row
            .iter()
            .zip(columns)
            .map(|(value, column)| {
                let value = value_of(value)?;
                Ok(if column.bytes {
                    value
                } else {
                    format!("CAST({value} AS {})", column.sql_type)
                })
            })
            .collect::<Result<_, SqlError>>()?;
        let row = format!("({})", values.join(", "));
        let cost = operators(&row)?;
        if cost > budget {
            return Err(SqlError::TooComplex(format!(
                "a row of the INSERT's VALUES has {cost} operators and keywords once typed; \
                 the limit is {budget}"
            )));
        }
        if row.len() > room {
            return Err(SqlError::TooComplex(format!(
                "a row of the INSERT's VALUES has {} bytes once typed; the limit is {room}",
                row.len()
            )));
        }
        if used + cost > budget || bytes + row.len() + 2 > room {
            parts.push(format!("VALUES {}", part.join(", ")));
            part.clear();
            (used, bytes) = (0, 0);
        }
        used += cost;
        bytes += row.len() + 2;
        part.push(row);
    }
    if !part.is_empty() {
        parts.push(format!("VALUES {}", part.join(", ")));
    }
    Ok(parts)
}

/// Arrow's refusal to cast an integer to a narrower integer type, as PostgreSQL says it
/// ("smallint out of range"); other errors as they are.
fn integer_out_of_range(e: SqlError) -> SqlError {
    if let SqlError::OutOfRange(message) = &e {
        if message.contains("Can't cast value") {
            for (arrow, name) in [
                ("Int8", "tinyint"),
                ("Int16", "smallint"),
                ("Int32", "integer"),
                ("Int64", "bigint"),
            ] {
                if message.ends_with(&format!("to type {arrow}")) {
                    return SqlError::OutOfRange(format!("{name} out of range"));
                }
            }
        }
    }
    e
}

/// Refuses what an INSERT may say that Tidemark does not do, naming it.
fn refuse_insert_clauses(insert: &Insert) -> Result<(), SqlError> {
    let refused = if insert.on.is_some() {
        Some("INSERT ... ON CONFLICT (events are never updated; each INSERT appends)")
    } else if insert.returning.is_some() || insert.output.is_some() {
        Some("INSERT ... RETURNING")
    } else if insert.overwrite || insert.replace_into || insert.or.is_some() || insert.ignore {
        Some("INSERT OVERWRITE, REPLACE and OR/IGNORE forms (each INSERT appends)")
    } else if !insert.assignments.is_empty() {
        Some("INSERT ... SET (write VALUES)")
    } else if insert.partitioned.is_some() || !insert.after_columns.is_empty() {
        Some("INSERT ... PARTITION")
    } else if insert.format_clause.is_some() || insert.settings.is_some() {
        Some("INSERT ... FORMAT or SETTINGS")
    } else {
        None
    };
    match refused {
        Some(what) => Err(SqlError::Unsupported(what.into())),
        None => Ok(()),
    }
}

/// A record batch of the query casting an INSERT's values as one of exactly the stream's
/// Arrow types: SQL's casts may answer a time zone's label or a string's view type other
/// than the stream's (lossless changes).
fn of_schema(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, SqlError> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            let text = match column.data_type() {
                DataType::Utf8View | DataType::LargeUtf8
                    if *field.data_type() == DataType::Binary =>
                {
                    Some(cast_with_options(column, &DataType::Utf8, &STRICT))
                }
                DataType::Utf8 if *field.data_type() == DataType::Binary => {
                    Some(Ok(column.clone()))
                }
                _ => None,
            };
            if let Some(text) = text {
                let text =
                    text.map_err(|e| SqlError::Invalid(format!("column {}: {e}", field.name())))?;
                return bytea_column(text.as_string::<i32>(), field.name());
            }
            if column.data_type() == field.data_type() {
                Ok(column.clone())
            } else {
                cast_with_options(column, field.data_type(), &STRICT).map_err(|e| {
                    SqlError::Invalid(format!(
                        "column {} is {}: {e}",
                        field.name(),
                        field.data_type()
                    ))
                })
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| SqlError::Internal(e.to_string()))
}

/// Casts that fail on a value they cannot convert, rather than make it null.
const STRICT: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: datafusion::arrow::util::display::FormatOptions::new(),
};

/// The one statement of `sql`.
fn one_statement(sql: &str) -> Result<Statement, SqlError> {
    let mut statements = parse_bounded(sql)?;
    match (statements.pop(), statements.is_empty()) {
        (Some(statement), true) => Ok(statement),
        (None, _) => Err(SqlError::Syntax("empty statement".into())),
        (Some(_), false) => Err(SqlError::Unsupported(
            "several statements in one write (send exactly one)".into(),
        )),
    }
}

/// The stream a write names and the columns it gives values for, in the order given.
#[derive(Debug)]
struct Target {
    stream: String,
    schema: Arc<Schema>,
    columns: Vec<TargetColumn>,
}

#[derive(Debug)]
struct TargetColumn {
    /// As the stream spells it.
    name: String,
    data_type: DataType,
    /// Its type as SQL names it, to cast to.
    sql_type: &'static str,
    /// BYTES: PostgreSQL's `\x` hex text is read as the bytes it spells.
    bytes: bool,
}

impl Target {
    /// The stream `table` names (as a query names it: exactly, or unquoted without regard
    /// to case; in schema `public` or none) and its columns `named` (none: all of them,
    /// `tstart`, `tend`, then the fields in order).
    fn of(engine: &Engine, table: &ObjectName, named: &[Ident]) -> Result<Target, SqlError> {
        let parts: Vec<&Ident> = table.0.iter().filter_map(|p| p.as_ident()).collect();
        let name = match parts.as_slice() {
            [name] => *name,
            [schema, name] if schema.value.eq_ignore_ascii_case(crate::SCHEMA) => *name,
            [catalog, schema, name]
                if catalog.value.eq_ignore_ascii_case(crate::CATALOG)
                    && schema.value.eq_ignore_ascii_case(crate::SCHEMA) =>
            {
                *name
            }
            _ => return Err(EngineError::UnknownStream(table.to_string()).into()),
        };
        let streams = engine.list_streams();
        let stream = exact_or_folded(&streams, name)
            .ok_or_else(|| EngineError::UnknownStream(name.value.clone()))?
            .to_owned();
        let schema = engine.stream_schema(&stream)?;
        let mut every = vec![TargetColumn::time(TSTART), TargetColumn::time(TEND)];
        every.extend(
            schema
                .fields()
                .iter()
                .map(|f| TargetColumn::field(&f.name, f.ty)),
        );
        let columns = if named.is_empty() {
            every
        } else {
            let names: Vec<String> = every.iter().map(|c| c.name.clone()).collect();
            let mut columns = Vec::with_capacity(named.len());
            let mut every: Vec<Option<TargetColumn>> = every.into_iter().map(Some).collect();
            for ident in named {
                let found = exact_or_folded(&names, ident)
                    .and_then(|exact| names.iter().position(|n| n == exact))
                    .ok_or_else(|| {
                        SqlError::Invalid(format!(
                            "column \"{}\" of stream {stream} does not exist; its columns are {}",
                            ident.value,
                            names.join(", ")
                        ))
                    })?;
                let column = every[found].take().ok_or_else(|| {
                    SqlError::Invalid(format!("column \"{}\" is named twice", names[found]))
                })?;
                columns.push(column);
            }
            columns
        };
        Ok(Target {
            stream,
            schema,
            columns,
        })
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        names.join(", ")
    }

    /// The columns as Arrow fields of the stream's types.
    fn arrow_schema(&self) -> SchemaRef {
        Arc::new(ArrowSchema::new(
            self.columns
                .iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// `batches` (of `schema`, [`Target::arrow_schema`]) as the stream's events.
    fn rows(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Rows, SqlError> {
        let events = events_of_batches(schema, batches, &self.schema)
            .map_err(|e| SqlError::Invalid(e.to_string()))?;
        assert_eq!(
            events.len(),
            batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
            "every row written is one event"
        );
        Ok(Rows {
            stream: self.stream.clone(),
            events,
        })
    }
}

impl TargetColumn {
    fn time(name: &str) -> TargetColumn {
        TargetColumn {
            name: name.into(),
            data_type: time_type(),
            sql_type: "TIMESTAMP WITH TIME ZONE",
            bytes: false,
        }
    }

    fn field(name: &str, ty: FieldType) -> TargetColumn {
        TargetColumn {
            name: name.into(),
            data_type: arrow_type(ty),
            sql_type: match ty {
                FieldType::Boolean => "BOOLEAN",
                FieldType::Byte => "TINYINT",
                FieldType::Short => "SMALLINT",
                FieldType::Integer => "INTEGER",
                FieldType::Long => "BIGINT",
                FieldType::Float => "REAL",
                FieldType::Double => "DOUBLE PRECISION",
                FieldType::String => "TEXT",
                FieldType::Bytes => "BYTEA",
            },
            bytes: ty == FieldType::Bytes,
        }
    }

    /// `text` (a COPY's values of this column) as values of the column's type.
    fn parse_text(&self, text: &StringArray) -> Result<ArrayRef, SqlError> {
        if self.bytes {
            return bytea_column(text, &self.name);
        }
        cast_with_options(text, &self.data_type, &STRICT).or_else(|_| {
            // Found again, to say which value: the safe cast makes it null.
            let nulls = cast_with_options(text, &self.data_type, &CastOptions::default())
                .map_err(|e| SqlError::Invalid(format!("column {}: {e}", self.name)))?;
            let row = (0..text.len())
                .find(|&i| text.is_valid(i) && nulls.is_null(i))
                .unwrap_or(0);
            Err(self.invalid(row, text.value(row)))
        })
    }

    fn invalid(&self, row: usize, value: &str) -> SqlError {
        invalid(row, &self.name, self.sql_type, value)
    }
}

/// A value of row `row` (from 0) that is not one of column `name`'s type.
fn invalid(row: usize, name: &str, sql_type: &str, value: &str) -> SqlError {
    let shown: String = value.chars().take(64).collect();
    SqlError::Invalid(format!(
        "row {}: invalid input for column {name} ({sql_type}): \"{shown}\"",
        row + 1,
    ))
}

/// Text values for a BYTES column as the bytes they spell ([`bytea`]).
fn bytea_column(text: &StringArray, name: &str) -> Result<ArrayRef, SqlError> {
    let mut out = BinaryBuilder::with_capacity(text.len(), text.value_data().len());
    for (row, value) in text.iter().enumerate() {
        match value {
            None => out.append_null(),
            Some(value) => {
                out.append_value(bytea(value).ok_or_else(|| invalid(row, name, "BYTEA", value))?)
            }
        }
    }
    Ok(Arc::new(out.finish()))
}

/// The bytes of a BYTEA value as text: PostgreSQL's hex form `\x0aff`, or the text's own
/// bytes. `None` for a `\x` value that is not hex.
fn bytea(value: &str) -> Option<Vec<u8>> {
    let Some(hex) = value.strip_prefix("\\x") else {
        return Some(value.as_bytes().to_vec());
    };
    if hex.len() % 2 != 0 {
        return None;
    }
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A `COPY stream FROM STDIN` waiting for its data.
#[derive(Debug)]
pub struct CopyIn {
    target: Target,
    options: CopyOptions,
}

impl CopyIn {
    /// The `COPY ... FROM STDIN` of `sql`: its stream, columns and format.
    pub fn new(engine: &Engine, sql: &str) -> Result<CopyIn, SqlError> {
        let Statement::Copy {
            source,
            to: false,
            target: CopyTarget::Stdin,
            options,
            legacy_options,
            values,
        } = one_statement(sql)?
        else {
            return Err(SqlError::Unsupported(
                "COPY other than FROM STDIN (psql's \\copy sends a file that way)".into(),
            ));
        };
        let CopySource::Table {
            table_name,
            columns,
        } = source
        else {
            return Err(SqlError::Unsupported("COPY (query) FROM".into()));
        };
        // The parser takes whatever follows `FROM STDIN;` as rows written in the statement
        // (as pg_dump's scripts do): statements sent after a COPY, which would be lost.
        let trailing = values
            .iter()
            .any(|v| v.as_deref().is_some_and(|v| !v.trim().is_empty()));
        if trailing {
            return Err(SqlError::Unsupported(
                "text after COPY ... FROM STDIN: it must be the last statement of its message \
                 (its rows come as COPY data, as psql's \\copy sends them)"
                    .into(),
            ));
        }
        let target = Target::of(engine, &table_name, &columns)?;
        let options = copy_options(&options, &legacy_options)?;
        Ok(CopyIn { target, options })
    }

    pub fn stream(&self) -> &str {
        &self.target.stream
    }

    /// How many columns each row has.
    pub fn columns(&self) -> usize {
        self.target.columns.len()
    }

    /// `data`, every byte the client sent, as the stream's events.
    pub fn rows(&self, data: &[u8]) -> Result<Rows, SqlError> {
        let texts = pg_copy::decode(data, &self.options, self.columns())
            .map_err(|e| SqlError::Invalid(e.to_string()))?;
        let columns = texts
            .iter()
            .zip(&self.target.columns)
            .map(|(text, column)| column.parse_text(text))
            .collect::<Result<Vec<_>, _>>()?;
        let schema = self.target.arrow_schema();
        let batch = RecordBatch::try_new(schema.clone(), columns)
            .map_err(|e| SqlError::Internal(e.to_string()))?;
        self.target.rows(&schema, &[batch])
    }
}

/// The shape of a COPY's bytes from its options, new (`WITH (FORMAT csv, HEADER)`) or old
/// (`CSV HEADER`, what older psql scripts write).
fn copy_options(
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
) -> Result<CopyOptions, SqlError> {
    let unsupported = |what: &str| Err(SqlError::Unsupported(format!("COPY option {what}")));
    let format = options
        .iter()
        .find_map(|o| match o {
            CopyOption::Format(name) => Some(name.value.to_ascii_lowercase()),
            _ => None,
        })
        .or_else(|| {
            legacy.iter().find_map(|o| match o {
                CopyLegacyOption::Csv(_) => Some("csv".into()),
                CopyLegacyOption::Binary => Some("binary".into()),
                _ => None,
            })
        });
    let mut copy = CopyOptions::new(match format.as_deref() {
        None | Some("text") => CopyFormat::Text,
        Some("csv") => CopyFormat::Csv,
        Some(other) => {
            return Err(SqlError::Unsupported(format!(
                "COPY FORMAT {other} (text and csv are read)"
            )))
        }
    });
    let byte = |what: &str, c: char| -> Result<u8, SqlError> {
        u8::try_from(c)
            .ok()
            .filter(|b| b.is_ascii() && *b != b'\n' && *b != b'\r')
            .ok_or_else(|| SqlError::Invalid(format!("COPY {what} must be one ASCII character")))
    };
    for option in options {
        match option {
            CopyOption::Format(_) | CopyOption::Freeze(_) => {}
            CopyOption::Delimiter(c) => copy.delimiter = byte("delimiter", *c)?,
            CopyOption::Null(text) => copy.null = text.clone(),
            CopyOption::Header(header) => copy.header = *header,
            CopyOption::Quote(c) => copy.quote = byte("quote", *c)?,
            CopyOption::Escape(c) => copy.escape = byte("escape", *c)?,
            CopyOption::Encoding(name)
                if matches!(name.to_ascii_lowercase().as_str(), "utf8" | "utf-8") => {}
            other => return unsupported(&other.to_string()),
        }
    }
    for option in legacy {
        match option {
            CopyLegacyOption::Csv(csv) => {
                for option in csv {
                    match option {
                        CopyLegacyCsvOption::Header => copy.header = true,
                        CopyLegacyCsvOption::Quote(c) => copy.quote = byte("quote", *c)?,
                        CopyLegacyCsvOption::Escape(c) => copy.escape = byte("escape", *c)?,
                        other => return unsupported(&other.to_string()),
                    }
                }
            }
            CopyLegacyOption::Delimiter(c) => copy.delimiter = byte("delimiter", *c)?,
            CopyLegacyOption::Null(text) => copy.null = text.clone(),
            CopyLegacyOption::Header => copy.header = true,
            other => return unsupported(&other.to_string()),
        }
    }
    if copy.format == CopyFormat::Csv && copy.delimiter == copy.quote {
        return Err(SqlError::Invalid(
            "COPY delimiter and quote must be different".into(),
        ));
    }
    if copy.format == CopyFormat::Text && copy.delimiter == b'\\' {
        return Err(SqlError::Invalid(
            "COPY delimiter cannot be a backslash in text format".into(),
        ));
    }
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_that_write_are_told_apart() {
        assert_eq!(write_of("INSERT INTO t VALUES (1)"), Some(Write::Insert));
        assert_eq!(
            write_of("insert into t (tstart, x) select tstart, x from u"),
            Some(Write::Insert)
        );
        assert_eq!(
            write_of("COPY t FROM STDIN WITH (FORMAT csv)"),
            Some(Write::CopyFromStdin)
        );
        assert_eq!(write_of("COPY t TO STDOUT"), None);
        assert_eq!(write_of("SELECT 1"), None);
        assert_eq!(write_of("INSERT INTO t VALUES (1); SELECT 1"), None);
        assert_eq!(write_of("INSERT INTO"), None);
    }

    #[test]
    fn copy_options_old_and_new() {
        let options = |sql: &str| match one_statement(sql).expect("parses") {
            Statement::Copy {
                options,
                legacy_options,
                ..
            } => copy_options(&options, &legacy_options),
            other => panic!("not a copy: {other}"),
        };
        let csv = options("COPY t FROM STDIN WITH (FORMAT csv, HEADER, DELIMITER ';', NULL 'NA')")
            .expect("taken");
        assert_eq!(csv.format, CopyFormat::Csv);
        assert!(csv.header);
        assert_eq!((csv.delimiter, csv.null.as_str()), (b';', "NA"));
        let legacy = options("COPY t FROM STDIN CSV HEADER").expect("taken");
        assert_eq!((legacy.format, legacy.header), (CopyFormat::Csv, true));
        let text = options("COPY t FROM STDIN").expect("taken");
        assert_eq!((text.format, text.delimiter), (CopyFormat::Text, b'\t'));
        assert!(matches!(
            options("COPY t FROM STDIN WITH (FORMAT binary)"),
            Err(SqlError::Unsupported(_))
        ));
        assert!(matches!(
            copy_options(&[CopyOption::Delimiter('é')], &[]),
            Err(SqlError::Invalid(_))
        ));
        assert!(matches!(
            options("COPY t FROM STDIN WITH (FORMAT csv, DELIMITER '\"')"),
            Err(SqlError::Invalid(_))
        ));
    }

    #[test]
    fn bytea_text_is_hex_or_the_text_itself() {
        assert_eq!(bytea("\\x00ff"), Some(vec![0, 255]));
        assert_eq!(bytea("ab"), Some(b"ab".to_vec()));
        assert_eq!(bytea("\\x0"), None);
        assert_eq!(bytea("\\xzz"), None);
        assert_eq!(bytea("\\xé0"), None);
        assert_eq!(bytea("\\x+f"), None);
    }
}
