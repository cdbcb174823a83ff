//! The events of the benchmark workloads, generated: pure computation, so that the server's
//! built-in insert benchmark (`/api/sys-info/performance/measure/...`) and the harness in
//! `tidemark-bench` make the same events without the server depending on the harness.

/// W1 `insert`: the ChronicleDB demo stream of trades.
pub mod w1 {
    use std::sync::Arc;

    use crate::{BatchBuilder, EventBatch, Schema, Value};

    pub const STREAM: &str = "demo_event_store";
    /// Timestamps of consecutive events are 0.1 ms apart.
    pub const EVENT_SPACING_NS: i64 = 100_000;

    pub fn schema() -> Schema {
        // Cannot fail: a constant, valid spec (checked by the tests).
        Schema::parse_spec("SYMBOL:STRING,SECURITYTYPE:INTEGER,LASTTRADEPRICE:FLOAT")
            .unwrap_or_else(|e| panic!("W1 schema: {e}"))
    }

    /// `count` W1 events in batches of `batch_size`, the last one at `end_ns`.
    pub fn generate(count: usize, batch_size: usize, end_ns: i64, seed: u64) -> Vec<EventBatch> {
        generate_spaced(count, batch_size, end_ns, seed, EVENT_SPACING_NS)
    }

    /// [`generate`] with events `spacing_ns` apart (`bench tier` spreads them over a day).
    pub fn generate_spaced(
        count: usize,
        batch_size: usize,
        end_ns: i64,
        seed: u64,
        spacing_ns: i64,
    ) -> Vec<EventBatch> {
        const SYMBOLS: [&str; 16] = [
            "AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "BRK", "JPM", "V", "XOM",
            "UNH", "SAP", "ASML", "TSM", "NESN",
        ];
        let schema = Arc::new(schema());
        let mut rng = fastrand::Rng::with_seed(seed);
        let start = end_ns - (count as i64 - 1).max(0) * spacing_ns;
        let mut price = 100.0f32;
        let mut batches = Vec::with_capacity(count.div_ceil(batch_size.max(1)));
        let mut i = 0;
        while i < count {
            let n = batch_size.max(1).min(count - i);
            let mut b = BatchBuilder::new(schema.clone(), n);
            for _ in 0..n {
                price = (price + (rng.f32() - 0.5) * 0.2).max(0.01);
                let values = [
                    Value::String(SYMBOLS[rng.usize(..SYMBOLS.len())].to_string()),
                    Value::Integer(rng.i32(0..8)),
                    Value::Float((price * 100.0).round() / 100.0),
                ];
                // Cannot fail: the values match the schema and tend is absent.
                let _ = b.push_row(start + i as i64 * spacing_ns, None, &values);
                i += 1;
            }
            batches.push(b.finish());
        }
        batches
    }
}

#[cfg(test)]
mod tests {
    use super::w1;

    #[test]
    fn w1_events_are_spaced_batched_and_end_where_asked() {
        let batches = w1::generate(25, 10, 1_000_000, 7);
        assert_eq!(
            batches.iter().map(|b| b.len()).collect::<Vec<_>>(),
            [10, 10, 5]
        );
        let ts: Vec<i64> = batches.iter().flat_map(|b| b.tstart().to_vec()).collect();
        assert_eq!(*ts.last().unwrap(), 1_000_000);
        assert!(ts.windows(2).all(|w| w[1] - w[0] == w1::EVENT_SPACING_NS));
        assert_eq!(batches[0].schema().as_ref(), &w1::schema());
        let again = w1::generate(25, 10, 1_000_000, 7);
        assert_eq!(
            again[2].column(0).value(4),
            batches[2].column(0).value(4),
            "seeded"
        );
    }
}
