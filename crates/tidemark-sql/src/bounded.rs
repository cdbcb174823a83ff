//! DataFusion's string functions, bounded.
//!
//! A function's result is memory no operator reserves: `repeat('x', 2000000000)` would
//! allocate 2 GB before anything could refuse it, and one call makes a whole batch of
//! results. Every string, unicode and regular-expression function is therefore wrapped
//! ([`bound_functions`]) so that, in each call:
//!
//! - the query's [`Stop`] is checked first (a query past its deadline, or whose client
//!   left, computes nothing more);
//! - functions whose result can be much larger than their arguments (`repeat`, `lpad`,
//!   `rpad`, `replace`, `regexp_replace`, `concat`, `concat_ws`, `overlay`) have their
//!   result's size worked out from their arguments *before* it is made, and are refused
//!   when one value would pass the query's largest value (`limits.max_value_bytes`) or
//!   the results of one call (a batch of rows) would pass what the query may hold at all
//!   (`limits.max_result_bytes`);
//! - every result is measured after it is made against the same bounds (the others make
//!   at most a few times what they were given), and so is every `a || b`
//!   ([`ConcatPlanner`]);
//! - the constants a query's calls make (constant folding: `repeat('x', 16000000)` is
//!   computed once, while planning, and kept in the plan) count together against what the
//!   query may hold, as do the constant arguments `concat` joins while it is simplified;
//! - a call over large inputs runs as a heavy section ([`crate::runtime::heavy`]): off the
//!   query runtime's workers, a few at a time; `levenshtein` over large strings (quadratic)
//!   is computed here, checking the stop as it goes, so that its query stops within
//!   milliseconds of its deadline.
//!
//! What each call may use is the query's [`QueryGuard`], carried in its session's
//! configuration: both constant folding (which calls functions while planning) and
//! execution see it.
//!
//! A literal (a constant of the SQL text, or one folded from a function of constants) is
//! repeated for every row of a batch when it is projected: a query with a large literal
//! runs with batches small enough that this stays within its bound ([`batch_rows`]).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, Int64Array, LargeStringArray, OffsetSizeTrait,
    StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchema;
use datafusion::common::{exec_err, DataFusionError, ExprSchema, Result as DfResult, ScalarValue};
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Documentation, Expr, ExpressionPlacement, LogicalPlan, Operator,
    ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, StructFieldMapping,
    Volatility,
};

use crate::runtime::heavy;
use crate::stop::{Refusal, Stop};

/// The largest value a function may make when the query does not say
/// (`limits.max_value_bytes`'s default).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 << 20;

/// A call whose string arguments hold more than this runs as a heavy section.
const HEAVY_INPUT_BYTES: usize = 16 << 20;
/// A `levenshtein` call over more cells than this (the product of its strings' lengths,
/// summed over rows) is computed here, as a heavy section checking its stop.
const HEAVY_LEVENSHTEIN_CELLS: u128 = 1 << 22;
/// Cells of `levenshtein` between two checks of the stop.
const CELLS_PER_CHECK: usize = 1 << 20;
/// What a query's function calls may use: its stop, its memory, the largest value.
#[derive(Debug, Clone)]
pub(crate) struct QueryGuard {
    pub stop: Stop,
    /// What the query may hold ([`crate::SqlOptions::memory_bytes`]).
    pub memory_bytes: usize,
    pub max_value_bytes: usize,
    /// Bytes of the constants the query's calls have made (shared by the guard's clones).
    pub constants: Arc<AtomicUsize>,
}

impl Default for QueryGuard {
    fn default() -> Self {
        QueryGuard {
            stop: Stop::never(),
            memory_bytes: usize::MAX,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            constants: Arc::default(),
        }
    }
}

impl QueryGuard {
    /// Puts the guard in `state`'s configuration (before `mark_start_execution`, which
    /// hands the configuration to constant folding and to the physical plan).
    pub fn install(self, state: &mut SessionState) {
        state.config_mut().options_mut().extensions.insert(self);
    }

    fn of(config: &ConfigOptions) -> QueryGuard {
        config
            .extensions
            .get::<QueryGuard>()
            .cloned()
            .unwrap_or_default()
    }
}

impl ConfigExtension for QueryGuard {
    const PREFIX: &'static str = "tidemark";
}

/// Not settings a statement can change: nothing to set or list. Its clones share the stop,
/// which is the point (one query's calls all see it).
impl ExtensionOptions for QueryGuard {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, _value: &str) -> DfResult<()> {
        Err(DataFusionError::Configuration(format!(
            "tidemark.{key} cannot be set"
        )))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        Vec::new()
    }
}

/// Replaces `state`'s string, unicode and regular-expression functions by bounded ones, and
/// bounds `||`.
pub(crate) fn bound_functions(state: &mut SessionState) {
    let _ = datafusion::execution::FunctionRegistry::register_expr_planner(
        state,
        Arc::new(ConcatPlanner),
    );
    use datafusion::functions::{regex, string, unicode};
    let names: Vec<String> = string::functions()
        .into_iter()
        .chain(unicode::functions())
        .chain(regex::functions())
        .map(|f| f.name().to_owned())
        // Tidemark's to_char (crate::postgres::to_char): a short template makes a long text;
        // array_to_string, one separator per element; string_to_array, an element per byte.
        .chain(["overlay", "to_char", "array_to_string", "string_to_array"].map(str::to_owned))
        .collect();
    for name in names {
        let Some(inner) = state.scalar_functions().get(&name).cloned() else {
            continue;
        };
        let bounded = ScalarUDF::new_from_impl(Bounded {
            inner: inner.as_ref().clone(),
        });
        // SessionState's registry cannot fail (the Result is the trait's).
        let _ = datafusion::execution::FunctionRegistry::register_udf(state, Arc::new(bounded));
    }
}

/// One of DataFusion's functions, called within its query's bounds.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: ScalarUDF,
}

impl Bounded {
    fn call(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let guard = QueryGuard::of(&args.config_options);
        guard.stop.check()?;
        let name = self.inner.name();
        let rows = args.number_rows;
        // Constants in, a constant out (constant folding, while planning).
        let scalar_result = !args.args.is_empty()
            && args
                .args
                .iter()
                .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        if let Some((largest, total)) = estimate(name, &args.args, rows) {
            check_value(name, largest, &guard)?;
            let total = if scalar_result {
                check_constants(name, largest, false, &guard)?;
                largest.saturating_mul(rows)
            } else {
                total
            };
            check_results(name, total, rows, &guard)?;
        }
        let result = if name == "levenshtein"
            && levenshtein_cells(&args.args, rows) > HEAVY_LEVENSHTEIN_CELLS
        {
            let stop = guard.stop.clone();
            heavy(&guard.stop, || levenshtein(&args, &stop))??
        } else if input_bytes(&args.args) > HEAVY_INPUT_BYTES {
            heavy(&guard.stop, || self.inner.invoke_with_args(args))??
        } else {
            self.inner.invoke_with_args(args)?
        };
        let constant = scalar_result || matches!(result, ColumnarValue::Scalar(_));
        check_result(name, &result, rows, constant, &guard)?;
        Ok(result)
    }
}

/// A result made, against the query's bounds: its largest value, the bytes of the whole
/// call, and (for a constant) the bytes of all its constants.
fn check_result(
    name: &str,
    result: &ColumnarValue,
    rows: usize,
    constant: bool,
    guard: &QueryGuard,
) -> DfResult<()> {
    let (largest, total) = measure(result);
    check_value(name, largest, guard)?;
    if constant {
        check_constants(name, largest, true, guard)?;
    }
    let total = match result {
        // Repeated for every row by whatever takes it.
        ColumnarValue::Scalar(_) => largest.saturating_mul(rows),
        ColumnarValue::Array(_) => total,
    };
    check_results(name, total, rows, guard)
}

/// A constant of `bytes` against what the query's constants may take together (what the
/// query may hold); counted when `made`, only checked before.
fn check_constants(name: &str, bytes: usize, made: bool, guard: &QueryGuard) -> DfResult<()> {
    let before = if made {
        guard.constants.fetch_add(bytes, Ordering::Relaxed)
    } else {
        guard.constants.load(Ordering::Relaxed)
    };
    if before.saturating_add(bytes) > guard.memory_bytes {
        return Err(Refusal::TooLarge(format!(
            "{name} would make a constant of {bytes} bytes, with {before} bytes of constants \
             made before it, more than the {} a query may hold (limits.max_result_bytes)",
            guard.memory_bytes
        ))
        .into());
    }
    Ok(())
}

/// `a || b` as DataFusion's, its result checked as a function's ([`SizeChecked`]); of two
/// arrays (psql's `\d+` joins `pg_class.reloptions` with another array so), their
/// concatenation (at most the size of both), whose batch is checked against what the query
/// may hold (an array value has no per-value bound: [`array_sizes`] measures texts).
#[derive(Debug)]
struct ConcatPlanner;

impl ExprPlanner for ConcatPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> DfResult<PlannerResult<RawBinaryExpr>> {
        use datafusion::logical_expr::ExprSchemable;
        use datafusion::sql::sqlparser::ast::BinaryOperator;
        if expr.op != BinaryOperator::StringConcat {
            return Ok(PlannerResult::Original(expr));
        }
        let is_array = |e: &Expr| {
            e.get_type(schema)
                .is_ok_and(|t| matches!(t, DataType::List(_) | DataType::LargeList(_)))
        };
        let concat = if is_array(&expr.left) && is_array(&expr.right) {
            datafusion::functions_nested::concat::array_concat_udf()
                .call(vec![expr.left, expr.right])
        } else {
            Expr::BinaryExpr(BinaryExpr::new(
                Box::new(expr.left),
                Operator::StringConcat,
                Box::new(expr.right),
            ))
        };
        Ok(PlannerResult::Planned(Expr::ScalarFunction(
            ScalarFunction::new_udf(size_checked(), vec![concat]),
        )))
    }
}

/// The one [`SizeChecked`] function.
fn size_checked() -> Arc<ScalarUDF> {
    static CHECKED: std::sync::OnceLock<Arc<ScalarUDF>> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            Arc::new(ScalarUDF::new_from_impl(SizeChecked {
                signature: Signature::any(1, Volatility::Immutable),
            }))
        })
        .clone()
}

/// Its argument, once its size is checked as a function's result; named as its argument
/// (a column `a || b` keeps its name).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SizeChecked {
    signature: Signature,
}

impl ScalarUDFImpl for SizeChecked {
    fn name(&self) -> &str {
        "size_checked"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(arg_types[0].clone())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        Ok(args.arg_fields[0].clone())
    }

    fn display_name(&self, args: &[Expr]) -> DfResult<String> {
        Ok(args[0].to_string())
    }

    fn schema_name(&self, args: &[Expr]) -> DfResult<String> {
        Ok(args[0].schema_name().to_string())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let guard = QueryGuard::of(&args.config_options);
        guard.stop.check()?;
        let rows = args.number_rows;
        let constant = matches!(args.args[0], ColumnarValue::Scalar(_));
        let result = args.args.into_iter().next().expect("one argument");
        check_result("||", &result, rows, constant, &guard)?;
        Ok(result)
    }
}

/// Delegates everything but the call to DataFusion's function.
#[allow(deprecated)] // display_name and is_nullable, delegated while they exist
impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn display_name(&self, args: &[Expr]) -> DfResult<String> {
        self.inner.inner().display_name(args)
    }

    fn schema_name(&self, args: &[Expr]) -> DfResult<String> {
        self.inner.inner().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.inner().return_type(arg_types)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let inner = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Bounded { inner }))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.inner().return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn ExprSchema) -> bool {
        self.inner.inner().is_nullable(args, schema)
    }

    fn is_strict(&self) -> bool {
        self.inner.inner().is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        self.call(args)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> DfResult<ExprSimplifyResult> {
        // concat joins its constant arguments here, without a call.
        if matches!(self.name(), "concat" | "concat_ws") {
            let guard = QueryGuard::of(info.config_options());
            let constants: usize = args
                .iter()
                .map(|a| match a {
                    Expr::Literal(value, _) => measure(&ColumnarValue::Scalar(value.clone())).0,
                    _ => 0,
                })
                .sum();
            // A separator joins at most once per argument.
            let separators = match (self.name(), args.first()) {
                ("concat_ws", Some(Expr::Literal(value, _))) => {
                    measure(&ColumnarValue::Scalar(value.clone()))
                        .0
                        .saturating_mul(args.len())
                }
                _ => 0,
            };
            check_value(self.name(), constants.saturating_add(separators), &guard)?;
        }
        self.inner.inner().simplify(args, info)
    }

    fn preimage(
        &self,
        args: &[Expr],
        lit_expr: &Expr,
        info: &SimplifyContext,
    ) -> DfResult<PreimageResult> {
        self.inner.inner().preimage(args, lit_expr, info)
    }

    fn short_circuits(&self) -> bool {
        self.inner.inner().short_circuits()
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.inner().conditional_arguments(args)
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> DfResult<Interval> {
        self.inner.inner().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> DfResult<Option<Vec<Interval>>> {
        self.inner.inner().propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> DfResult<SortProperties> {
        self.inner.inner().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> DfResult<bool> {
        self.inner.inner().preserves_lex_ordering(inputs)
    }

    fn strictly_order_preserving(&self, inputs: &[ExprProperties]) -> DfResult<bool> {
        self.inner.inner().strictly_order_preserving(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.inner().coerce_types(arg_types)
    }

    fn struct_field_mapping(
        &self,
        literal_args: &[Option<ScalarValue>],
    ) -> Option<StructFieldMapping> {
        self.inner.inner().struct_field_mapping(literal_args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.inner.inner().placement(args)
    }
}

/// One value too large for the query.
fn check_value(name: &str, largest: usize, guard: &QueryGuard) -> DfResult<()> {
    if largest > guard.max_value_bytes {
        return Err(Refusal::TooLarge(format!(
            "{name} would make a value of {largest} bytes, more than the {} a value may have \
             (limits.max_value_bytes)",
            guard.max_value_bytes
        ))
        .into());
    }
    Ok(())
}

/// One call's results, `total` bytes over `rows` rows, against what the query may hold at
/// all. (Not against what it may still reserve: operators that spill take all they may, and
/// a batch of results is passed on, not kept.)
fn check_results(name: &str, total: usize, rows: usize, guard: &QueryGuard) -> DfResult<()> {
    if total > guard.memory_bytes {
        return Err(Refusal::TooLarge(format!(
            "{name} would make {total} bytes for a batch of {rows} rows, more than the {} a \
             query may hold (limits.max_result_bytes): narrow the query, or make smaller values",
            guard.memory_bytes
        ))
        .into());
    }
    Ok(())
}

/// The strings of an argument, row by row.
enum Strings<'a> {
    Scalar(Option<&'a str>),
    Utf8(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

impl<'a> Strings<'a> {
    fn of(value: &'a ColumnarValue) -> Option<Strings<'a>> {
        Some(match value {
            ColumnarValue::Scalar(
                ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s),
            ) => Strings::Scalar(s.as_deref()),
            ColumnarValue::Scalar(_) => return None,
            ColumnarValue::Array(a) => match a.data_type() {
                DataType::Utf8 => Strings::Utf8(a.as_string::<i32>()),
                DataType::LargeUtf8 => Strings::Large(a.as_string::<i64>()),
                DataType::Utf8View => Strings::View(a.as_string_view()),
                _ => return None,
            },
        })
    }

    fn get(&self, row: usize) -> Option<&'a str> {
        match self {
            Strings::Scalar(s) => *s,
            Strings::Utf8(a) => a.is_valid(row).then(|| a.value(row)),
            Strings::Large(a) => a.is_valid(row).then(|| a.value(row)),
            Strings::View(a) => a.is_valid(row).then(|| a.value(row)),
        }
    }

    fn len(&self, row: usize) -> usize {
        self.get(row).map_or(0, str::len)
    }
}

/// The integers of an argument, row by row.
enum Ints {
    Scalar(Option<i64>),
    Array(Int64Array),
}

impl Ints {
    fn of(value: &ColumnarValue) -> Option<Ints> {
        Some(match value {
            ColumnarValue::Scalar(s) => match s.cast_to(&DataType::Int64).ok()? {
                ScalarValue::Int64(v) => Ints::Scalar(v),
                _ => return None,
            },
            ColumnarValue::Array(a) => {
                let cast = datafusion::arrow::compute::cast(a, &DataType::Int64).ok()?;
                Ints::Array(cast.as_primitive::<Int64Type>().clone())
            }
        })
    }

    fn get(&self, row: usize) -> Option<i64> {
        match self {
            Ints::Scalar(v) => *v,
            Ints::Array(a) => a.is_valid(row).then(|| a.value(row)),
        }
    }
}

/// The largest value and the total bytes `name` would make of `args` over `rows` rows, for
/// the functions whose result can be much larger than their arguments; `None` for others.
/// An upper bound, exact where that is cheap.
fn estimate(name: &str, args: &[ColumnarValue], rows: usize) -> Option<(usize, usize)> {
    let strings = |i: usize| args.get(i).and_then(Strings::of);
    let ints = |i: usize| args.get(i).and_then(Ints::of);
    let mut per_row: Box<dyn FnMut(usize) -> u128 + '_> = match name {
        "repeat" => {
            let (s, n) = (strings(0)?, ints(1)?);
            Box::new(move |r| s.len(r) as u128 * n.get(r).unwrap_or(0).max(0) as u128)
        }
        "lpad" | "rpad" => {
            let (s, n, fill) = (strings(0)?, ints(1)?, strings(2));
            Box::new(move |r| {
                let ascii = s.get(r).is_none_or(str::is_ascii)
                    && fill
                        .as_ref()
                        .and_then(|f| f.get(r))
                        .is_none_or(str::is_ascii);
                let bytes_per_char = if ascii { 1 } else { 4 };
                n.get(r).unwrap_or(0).max(0) as u128 * bytes_per_char
            })
        }
        "replace" => {
            let (s, from, to) = (strings(0)?, strings(1)?, strings(2)?);
            Box::new(move |r| {
                let (Some(s), Some(from), Some(to)) = (s.get(r), from.get(r), to.get(r)) else {
                    return 0;
                };
                if !from.is_empty() && to.len() <= from.len() {
                    return s.len() as u128;
                }
                let matches = if from.is_empty() {
                    s.chars().count() + 1
                } else {
                    s.matches(from).count()
                };
                s.len() as u128 + matches as u128 * (to.len() - from.len().min(to.len())) as u128
            })
        }
        "regexp_replace" => {
            let (s, replacement, flags) = (strings(0)?, strings(2)?, strings(3));
            Box::new(move |r| {
                let (s, replacement) = (s.len(r) as u128, replacement.get(r).unwrap_or(""));
                let global = flags
                    .as_ref()
                    .and_then(|f| f.get(r))
                    .is_some_and(|f| f.contains('g'));
                let matches = if global { s + 1 } else { 1 };
                // Each group reference ($1, \1) can copy a whole match.
                let references = replacement.matches(['$', '\\']).count() as u128;
                s + matches * replacement.len() as u128 + references * s
            })
        }
        // A pattern of one character makes at most seven (`J`), a strftime directive of two
        // at most a few dozen (`%c`).
        "to_char" => {
            let template = strings(1)?;
            Box::new(move |r| template.len(r) as u128 * 16 + 64)
        }
        "concat" => {
            let parts: Vec<Option<Strings>> = args.iter().map(Strings::of).collect();
            Box::new(move |r| {
                parts
                    .iter()
                    .map(|p| p.as_ref().map_or(64, |p| p.len(r)) as u128)
                    .sum()
            })
        }
        // Pieces of the text (all of it at most), one element per byte and one more at
        // most (a NULL delimiter splits every character), each an offset and a bit.
        "string_to_array" => {
            let s = strings(0)?;
            Box::new(move |r| {
                let text = s.len(r) as u128;
                text + (text + 1) * 16
            })
        }
        // Each element as text, with a separator (or the text for a null) after each.
        "array_to_string" => {
            let lists = args.first()?.to_array(rows).ok()?;
            let lists = lists.as_list_opt::<i32>()?.clone();
            let (separator, null_text) = (strings(1)?, strings(2));
            Box::new(move |r| {
                if lists.is_null(r) {
                    return 0;
                }
                let elements = lists.value(r);
                // The row's own text (a slice's buffer is the whole batch's).
                let text = if let Some(strings) = elements.as_string_opt::<i32>() {
                    let offsets = strings.value_offsets();
                    (offsets[offsets.len() - 1] - offsets[0]) as u128
                } else if let Some(strings) = elements.as_string_opt::<i64>() {
                    let offsets = strings.value_offsets();
                    (offsets[offsets.len() - 1] - offsets[0]) as u128
                } else if let Some(views) = elements.as_string_view_opt() {
                    views.lengths().map(u128::from).sum()
                } else {
                    // A number or a time as text is a few dozen bytes; anything nested, no
                    // more than its memory.
                    (elements.len() as u128 * 40).max(elements.get_array_memory_size() as u128)
                };
                let joints = separator.len(r) + null_text.as_ref().map_or(0, |n| n.len(r));
                text + elements.len() as u128 * joints as u128
            })
        }
        "concat_ws" => {
            let separator = strings(0)?;
            let parts: Vec<Option<Strings>> = args[1..].iter().map(Strings::of).collect();
            let count = parts.len().saturating_sub(1) as u128;
            Box::new(move |r| {
                let values: u128 = parts
                    .iter()
                    .map(|p| p.as_ref().map_or(64, |p| p.len(r)) as u128)
                    .sum();
                values + count * separator.len(r) as u128
            })
        }
        "overlay" => {
            let (s, placing) = (strings(0)?, strings(1)?);
            Box::new(move |r| (s.len(r) + placing.len(r)) as u128)
        }
        _ => return None,
    };
    let scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let rows = if scalar { 1 } else { rows };
    let (mut largest, mut total) = (0u128, 0u128);
    for row in 0..rows {
        let bytes = per_row(row);
        largest = largest.max(bytes);
        total = total.saturating_add(bytes);
    }
    let clamp = |v: u128| usize::try_from(v).unwrap_or(usize::MAX);
    Some((clamp(largest), clamp(total)))
}

/// The largest value of a result and its bytes in all (string and binary values; other
/// types by their arrays' memory).
fn measure(result: &ColumnarValue) -> (usize, usize) {
    match result {
        ColumnarValue::Scalar(s) => {
            let bytes = match s {
                ScalarValue::Utf8(Some(v))
                | ScalarValue::LargeUtf8(Some(v))
                | ScalarValue::Utf8View(Some(v)) => v.len(),
                ScalarValue::Binary(Some(v))
                | ScalarValue::LargeBinary(Some(v))
                | ScalarValue::BinaryView(Some(v))
                | ScalarValue::FixedSizeBinary(_, Some(v)) => v.len(),
                other => other.size(),
            };
            (bytes, bytes)
        }
        ColumnarValue::Array(a) => array_sizes(a.as_ref()),
    }
}

fn array_sizes(a: &dyn Array) -> (usize, usize) {
    fn offsets<O: OffsetSizeTrait>(offsets: &[O]) -> (usize, usize) {
        let largest = offsets
            .windows(2)
            .map(|w| (w[1] - w[0]).as_usize())
            .max()
            .unwrap_or(0);
        let total = match (offsets.first(), offsets.last()) {
            (Some(first), Some(last)) => (*last - *first).as_usize(),
            _ => 0,
        };
        (largest, total)
    }
    fn views(views: &[u128]) -> (usize, usize) {
        views.iter().fold((0, 0), |(largest, total), view| {
            let len = *view as u32 as usize;
            (largest.max(len), total + len)
        })
    }
    match a.data_type() {
        DataType::Utf8 => offsets(a.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => offsets(a.as_string::<i64>().value_offsets()),
        DataType::Binary => offsets(a.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => offsets(a.as_binary::<i64>().value_offsets()),
        DataType::Utf8View => views(a.as_string_view().views()),
        DataType::BinaryView => views(a.as_binary_view().views()),
        _ => (0, a.get_array_memory_size()),
    }
}

/// Bytes of the string arguments of a call.
fn input_bytes(args: &[ColumnarValue]) -> usize {
    args.iter()
        .map(|a| match a {
            ColumnarValue::Array(a) => array_sizes(a.as_ref()).1,
            scalar => measure(scalar).0,
        })
        .sum()
}

/// What `levenshtein` of `args` would compute: the product of its strings' lengths, summed
/// over the rows (bytes: at least their characters).
fn levenshtein_cells(args: &[ColumnarValue], rows: usize) -> u128 {
    let (Some(a), Some(b)) = (
        args.first().and_then(Strings::of),
        args.get(1).and_then(Strings::of),
    ) else {
        return 0;
    };
    let scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let rows = if scalar { 1 } else { rows };
    (0..rows).map(|r| a.len(r) as u128 * b.len(r) as u128).sum()
}

/// `levenshtein` as DataFusion's (distances in characters; NULL when either is), checking
/// `stop` every [`CELLS_PER_CHECK`] cells.
fn levenshtein(args: &ScalarFunctionArgs, stop: &Stop) -> DfResult<ColumnarValue> {
    let (Some(a), Some(b)) = (
        args.args.first().and_then(Strings::of),
        args.args.get(1).and_then(Strings::of),
    ) else {
        return exec_err!("levenshtein takes two strings");
    };
    let scalar = args
        .args
        .iter()
        .all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let rows = if scalar { 1 } else { args.number_rows };
    let mut row = Vec::new();
    let mut distances = Vec::with_capacity(rows);
    for r in 0..rows {
        distances.push(match (a.get(r), b.get(r)) {
            (Some(a), Some(b)) => Some(distance(a, b, stop, &mut row)?),
            _ => None,
        });
    }
    let array: ArrayRef = match args.return_field.data_type() {
        DataType::Int64 => Arc::new(Int64Array::from_iter(
            distances.iter().map(|d| d.map(|d| d as i64)),
        )),
        _ => Arc::new(Int32Array::from_iter(
            distances.iter().map(|d| d.map(|d| d as i32)),
        )),
    };
    if scalar {
        return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
            &array, 0,
        )?));
    }
    Ok(ColumnarValue::Array(array))
}

/// The Levenshtein distance of `a` and `b` in characters, one row of the table at a time.
fn distance(a: &str, b: &str, stop: &Stop, row: &mut Vec<usize>) -> Result<usize, Refusal> {
    let b: Vec<char> = b.chars().collect();
    if b.is_empty() {
        return Ok(a.chars().count());
    }
    row.clear();
    row.extend(1..=b.len());
    let mut unchecked = 0;
    let mut last = b.len();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = i;
        let mut left = i + 1;
        for (cell, &cb) in row.iter_mut().zip(&b) {
            let up = *cell;
            let value = (diagonal + usize::from(ca != cb)).min(left + 1).min(up + 1);
            diagonal = up;
            *cell = value;
            left = value;
        }
        last = left;
        unchecked += b.len();
        if unchecked >= CELLS_PER_CHECK {
            unchecked = 0;
            stop.check()?;
        }
    }
    Ok(last)
}

/// The largest string or binary literal of `plan` (its subqueries too), in bytes.
pub(crate) fn largest_literal(plan: &LogicalPlan) -> usize {
    let mut largest = 0;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::Literal(value, _) = e {
                    largest = largest.max(measure(&ColumnarValue::Scalar(value.clone())).0);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    largest
}

/// Rows per batch for a query that may hold `memory_bytes` and has a literal of
/// `literal_bytes`: few enough that the literal repeated for each row of a batch takes at
/// most an eighth of its bound; `batch_rows` (DataFusion's) when that is already so.
pub(crate) fn batch_rows(memory_bytes: usize, literal_bytes: usize, batch_rows: usize) -> usize {
    if literal_bytes == 0 {
        return batch_rows;
    }
    (memory_bytes / 8 / literal_bytes).clamp(1, batch_rows.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::utils::datafusion_strsim;

    #[test]
    fn distances_are_datafusions() {
        let mut row = Vec::new();
        for (a, b) in [
            ("kitten", "sitting"),
            ("", "abc"),
            ("abc", ""),
            ("", ""),
            ("flaw", "lawn"),
            ("naïve café", "naive cafe"),
            ("日本語", "日本"),
        ] {
            assert_eq!(
                distance(a, b, &Stop::never(), &mut row).unwrap(),
                datafusion_strsim::levenshtein(a, b),
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn a_long_distance_stops_when_its_query_does() {
        let stop = Stop::after(std::time::Duration::from_millis(50));
        let a = "a".repeat(200_000);
        let b = "b".repeat(200_000);
        let started = std::time::Instant::now();
        let outcome = distance(&a, &b, &stop, &mut Vec::new());
        assert!(matches!(outcome, Err(Refusal::Timeout(_))), "{outcome:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn amplifying_functions_are_estimated_before_they_run() {
        let s = |v: &str| ColumnarValue::Scalar(ScalarValue::Utf8(Some(v.into())));
        let n = |v: i64| ColumnarValue::Scalar(ScalarValue::Int64(Some(v)));
        assert_eq!(
            estimate("repeat", &[s("xy"), n(2_000_000_000)], 1),
            Some((4_000_000_000, 4_000_000_000))
        );
        assert_eq!(estimate("lpad", &[s("x"), n(10)], 1), Some((10, 10)));
        assert_eq!(
            estimate("lpad", &[s("x"), n(10), s("é")], 1),
            Some((40, 40))
        );
        assert_eq!(
            estimate("replace", &[s("abab"), s("b"), s("xyz")], 1),
            Some((8, 8))
        );
        assert_eq!(
            estimate("replace", &[s("ab"), s(""), s("-")], 1),
            Some((5, 5))
        );
        assert_eq!(estimate("concat", &[s("ab"), s("cde")], 1), Some((5, 5)));
        assert_eq!(estimate("upper", &[s("ab")], 1), None);
        let column = ColumnarValue::Array(Arc::new(StringArray::from(vec!["a", "bb"])));
        assert_eq!(estimate("repeat", &[column, n(3)], 2), Some((6, 9)));
        // array_to_string: each row's own elements (a slice of the batch's text), and a
        // separator and a null's text after each element.
        let mut lists = datafusion::arrow::array::ListBuilder::new(
            datafusion::arrow::array::StringBuilder::new(),
        );
        lists.append_value([Some("ab"), Some("c")]);
        lists.append_value([Some("defg"), None, Some("h")]);
        let lists = ColumnarValue::Array(Arc::new(lists.finish()));
        assert_eq!(
            estimate("array_to_string", &[lists.clone(), s("--")], 2),
            Some((11, 18))
        );
        assert_eq!(
            estimate("array_to_string", &[lists, s(","), s("NULL")], 2),
            Some((20, 33))
        );
    }

    #[test]
    fn batches_shrink_for_large_literals() {
        assert_eq!(batch_rows(64 << 20, 0, 8192), 8192);
        assert_eq!(batch_rows(64 << 20, 100, 8192), 8192);
        assert_eq!(batch_rows(64 << 20, 1 << 20, 8192), 8);
        assert_eq!(batch_rows(64 << 20, 16 << 20, 8192), 1);
    }
}
