//! W3 on Kafka: the same 64 KiB records at the same target rates, to a topic with as many
//! partitions as Tidemark has streams, through Kafka's own `ProducerPerformance` (acks=all,
//! linger.ms=0). The tool's latency runs from `send()` to the acknowledgement — the client's
//! end-to-end latency; Kafka reports no server-side figure.

use std::path::Path;
use std::time::Duration;

use crate::latency::LatencySummary;
use crate::peers::kafka::{Batching, Flush, Kafka, ProducerRun};
use crate::peers::Skipped;
use crate::process::Sampler;
use crate::w3::{Rate, StepReport, BATCH_BYTES};

/// Records sent at `max`, per second of the configured duration: the tool needs a count,
/// and this is about what one broker does here (the run is shorter when it does more).
const MAX_RATE_RECORDS_PER_SECOND: f64 = 3000.0;

/// Runs every (partitions, rate) step on one broker with `flush`; a step that fails is
/// returned as its error message next to the others.
pub fn run_kafka(
    work_dir: &Path,
    flush: Flush,
    partition_counts: &[usize],
    rates: &[Rate],
    duration: Duration,
) -> Result<Vec<Result<StepReport, String>>, Skipped> {
    let dir = work_dir.join(format!("kafka-w3-{}", flush.name()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Skipped::new("kafka", e.to_string()))?;
    }
    let kafka = Kafka::start(&dir, flush)?;
    let mut steps = Vec::new();
    for (i, &partitions) in partition_counts.iter().enumerate() {
        for (j, &rate) in rates.iter().enumerate() {
            let topic = format!("w3-{partitions}-{i}-{j}");
            steps.push(step(&kafka, &topic, partitions, rate, duration));
            // The data of a step is not needed again; dropping it keeps the disk free.
            let _ = kafka.delete_topic(&topic);
        }
    }
    drop(kafka);
    std::fs::remove_dir_all(&dir).ok();
    Ok(steps)
}

fn step(
    kafka: &Kafka,
    topic: &str,
    partitions: usize,
    rate: Rate,
    duration: Duration,
) -> Result<StepReport, String> {
    kafka.create_topic(topic, partitions)?;
    let records_per_second = match rate {
        Rate::Max => None,
        Rate::MegabytesPerSecond(mb) => Some(mb * 1e6 / BATCH_BYTES as f64),
    };
    let run = |records: usize| ProducerRun {
        topic,
        records,
        record_size: BATCH_BYTES,
        batching: Batching::Bytes {
            batch_bytes: BATCH_BYTES,
            linger_ms: 0,
        },
        records_per_second,
    };
    // Warm-up: a short run of its own (a JVM starts cold), not measured.
    kafka.producer_performance(&run(200))?;
    let records = (records_per_second.unwrap_or(MAX_RATE_RECORDS_PER_SECOND)
        * duration.as_secs_f64())
    .ceil()
    .max(1.0) as usize;
    let sampler = Sampler::start(kafka.pid());
    let summary = kafka.producer_performance(&run(records))?;
    let usage = sampler.finish();
    Ok(StepReport {
        streams: partitions,
        rate,
        // One producer with Kafka's default of 5 requests in flight per connection.
        clients: 1,
        in_flight: 5,
        batches: records as u64,
        achieved_mb_per_s: summary.records_per_second * BATCH_BYTES as f64 / 1e6,
        try_later: 0,
        behind: 0,
        end_to_end: LatencySummary {
            count: records as u64,
            avg_ms: summary.avg_ms,
            p50_ms: summary.p50_ms,
            p95_ms: summary.p95_ms,
            p99_ms: summary.p99_ms,
            p999_ms: summary.p999_ms,
            max_ms: summary.max_ms,
        },
        server: None,
        usage,
    })
}
