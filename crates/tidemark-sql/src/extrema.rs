//! `min` and `max` of floats in PostgreSQL's order, in which NaN is greater than every number.
//!
//! DataFusion 55's grouped `min`/`max` of floats (a `PrimitiveGroupsAccumulator` comparing
//! with `partial_cmp`) takes whichever value comes next when either is NaN, so a group's
//! answer depends on where a NaN falls (the reference test against DuckDB found `max` = 411.6
//! where the group held a NaN); and it starts `max` at `f64::MIN`, so the max of a group of
//! only `-inf` would be -1.8e308. Its other accumulators (no GROUP BY, windows) are right.
//! These functions are DataFusion's `min` and `max` in everything but that one accumulator.

use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef, Float32Type, Float64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature, StatisticsArgs,
};
use datafusion_functions_aggregate_common::aggregate::groups_accumulator::prim_op::PrimitiveGroupsAccumulator;

/// Which end a [`FloatExtremum`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum End {
    Min,
    Max,
}

/// `min` or `max`, with PostgreSQL's order for the grouped accumulator of floats.
#[derive(Debug)]
pub struct FloatExtremum {
    end: End,
    datafusions: Arc<dyn AggregateUDFImpl>,
}

impl PartialEq for FloatExtremum {
    fn eq(&self, other: &Self) -> bool {
        self.end == other.end
    }
}

impl Eq for FloatExtremum {}

impl Hash for FloatExtremum {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.end.hash(state);
    }
}

/// `min` and `max` to register in place of DataFusion's.
pub fn functions() -> [AggregateUDF; 2] {
    [
        FloatExtremum {
            end: End::Min,
            datafusions: min_udaf().inner().clone(),
        },
        FloatExtremum {
            end: End::Max,
            datafusions: max_udaf().inner().clone(),
        },
    ]
    .map(AggregateUDF::new_from_impl)
}

/// Whether `new` goes before (`Min`) or after (`Max`) `current` in PostgreSQL's order of
/// floats: numbers as usual, and every NaN equal to every other and after every number.
fn replaces(end: End, new: f64, current: f64) -> bool {
    let after = match (new.is_nan(), current.is_nan()) {
        (true, false) => true,
        (false, false) => new > current,
        (_, true) => false,
    };
    let before = match (new.is_nan(), current.is_nan()) {
        (false, true) => true,
        (false, false) => new < current,
        (true, _) => false,
    };
    match end {
        End::Max => after,
        End::Min => before,
    }
}

impl FloatExtremum {
    fn groups_accumulator(&self, data_type: &DataType) -> Option<Box<dyn GroupsAccumulator>> {
        let end = self.end;
        // The first value of a group replaces the start, unless it equals it, which is then
        // the right answer too: -inf for max (the least number; NaN is greatest), NaN for min.
        match data_type {
            DataType::Float64 => Some(Box::new(
                PrimitiveGroupsAccumulator::<Float64Type, _>::new(data_type, move |cur, new| {
                    if replaces(end, new, *cur) {
                        *cur = new;
                    }
                })
                .with_starting_value(match end {
                    End::Max => f64::NEG_INFINITY,
                    End::Min => f64::NAN,
                }),
            )),
            DataType::Float32 => Some(Box::new(
                PrimitiveGroupsAccumulator::<Float32Type, _>::new(data_type, move |cur, new| {
                    if replaces(end, f64::from(new), f64::from(*cur)) {
                        *cur = new;
                    }
                })
                .with_starting_value(match end {
                    End::Max => f32::NEG_INFINITY,
                    End::Min => f32::NAN,
                }),
            )),
            _ => None,
        }
    }
}

impl AggregateUDFImpl for FloatExtremum {
    fn name(&self) -> &str {
        self.datafusions.name()
    }

    fn aliases(&self) -> &[String] {
        self.datafusions.aliases()
    }

    fn signature(&self) -> &Signature {
        self.datafusions.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.datafusions.return_type(arg_types)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.datafusions.accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.datafusions.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.datafusions.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        match self.groups_accumulator(args.return_field.data_type()) {
            Some(accumulator) => Ok(accumulator),
            None => self.datafusions.create_groups_accumulator(args),
        }
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.datafusions.create_sliding_accumulator(args)
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.datafusions.order_sensitivity()
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.datafusions.reverse_expr()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.datafusions.coerce_types(arg_types)
    }

    fn is_descending(&self) -> Option<bool> {
        self.datafusions.is_descending()
    }

    fn value_from_stats(&self, args: &StatisticsArgs) -> Option<ScalarValue> {
        self.datafusions.value_from_stats(args)
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.datafusions.default_value(data_type)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.datafusions.documentation()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.datafusions.set_monotonicity(data_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_is_after_every_number_and_equal_to_itself() {
        for number in [f64::NEG_INFINITY, -1.0, 0.0, 1e308, f64::INFINITY] {
            assert!(replaces(End::Max, f64::NAN, number));
            assert!(!replaces(End::Max, number, f64::NAN));
            assert!(replaces(End::Min, number, f64::NAN));
            assert!(!replaces(End::Min, f64::NAN, number));
        }
        assert!(!replaces(End::Max, f64::NAN, f64::NAN));
        assert!(!replaces(End::Min, f64::NAN, f64::NAN));
        assert!(replaces(End::Max, 2.0, 1.0) && !replaces(End::Max, 1.0, 2.0));
        assert!(replaces(End::Min, 1.0, 2.0) && !replaces(End::Min, 2.0, 1.0));
    }
}
