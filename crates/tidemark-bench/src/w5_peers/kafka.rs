//! W5 on Kafka: the live-latency, catch-up and idle-subscription steps through the real
//! `kafka-clients` 4.1 producer and consumer, run by `peers/kafka/ConsumeBench.java` (embedded
//! here, written out at run time and started with Java 17's single-file source launcher) on
//! one KRaft broker that fsyncs every append before a consumer can see it
//! (`log.flush.interval.messages=1`: the broker flushes inside the append, before the high
//! watermark moves), as Tidemark does.
//!
//! - **Live latency**: a topic of S partitions; one producer (acks=all, linger.ms=0, one
//!   64 KiB record per batch, as W3's Kafka runs) sends on a fixed schedule, each record to a
//!   random partition, its due time (`System.nanoTime`) in its first 8 bytes; one consumer
//!   assigned every partition, at their ends before the first send, polls and records
//!   receipt − due. Producer and consumer share one JVM, so one clock.
//! - **Catch-up**: a 1-partition topic filled beforehand; N consumers in one JVM, each its
//!   own `KafkaConsumer` and connections, read it from offset 0 to its end at once.
//! - **Idle**: N consumers, each on its own partition of an empty topic, each blocked in
//!   `poll` on its own thread; the broker's RSS before and after.
//!
//! The program prints `WINDOW`/`END`/`GO`/`READY` as it goes (the broker is sampled
//! between them) and one `RESULT key=value ...` line, which is parsed here.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::latency::LatencySummary;
use crate::peers::kafka::{Flush, Kafka};
use crate::peers::Skipped;
use crate::process::{rss_bytes, Sampler};
use crate::w5::{CatchUpStep, ConsumePlan, IdleMemory, LatencyStep, SystemReport, BATCH_BYTES};

/// The benchmark program, so that the binary carries the exact client code it ran.
const PROGRAM: &str = include_str!("../../../../peers/kafka/ConsumeBench.java");

/// What the report says about durability: what a consumer sees has been fsync'd.
const DURABILITY: &str = "fsync per append (log.flush.interval.messages=1)";

/// The most idle subscriptions measured: each is a `KafkaConsumer` with its own thread and
/// connections in the client's JVM, and a partition of its own on the broker; beyond this the
/// client's JVM (not the broker) becomes the limit on 2 cores. The report gives the N used.
pub const MAX_IDLE_SUBSCRIPTIONS: usize = 2000;

/// How long the broker is left alone before its memory is read.
const SETTLE: Duration = Duration::from_secs(3);

/// Time allowed on top of a step's own work for the JVM to start and compile the program,
/// and for its clients to connect and close.
const STARTUP: Duration = Duration::from_secs(180);

/// Runs every step on one broker; a step that fails is its error next to the others. Only a
/// broker that is not installed or does not start skips Kafka.
pub fn run(work_dir: &Path, plan: &ConsumePlan) -> Result<Vec<SystemReport>, Skipped> {
    let skip = |e: std::io::Error| Skipped::new("kafka", e.to_string());
    let dir = work_dir.join("kafka-w5");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(skip)?;
    }
    let mut reports = Vec::new();
    // Tidemark's durability first, then Kafka's default (the page cache) for the live
    // latency alone: reads do not depend on how appends were flushed.
    for flush in [Flush::EveryAppend, Flush::OsCache] {
        let kafka = Kafka::start(&dir, flush)?;
        let source = dir.join("ConsumeBench.java");
        std::fs::write(&source, PROGRAM).map_err(skip)?;
        let bench = Bench {
            kafka: &kafka,
            source,
            dir: dir.clone(),
        };
        let latency = plan
            .stream_counts
            .iter()
            .enumerate()
            .map(|(i, &streams)| {
                let topic = format!("w5-live-{streams}-{i}");
                let step = latency_step(&bench, &topic, streams, plan);
                // The step's data is not needed again; deleting it keeps the disk free.
                let _ = kafka.delete_topic(&topic);
                step
            })
            .collect();
        let (durability, catch_up, idle) = match flush {
            Flush::EveryAppend => (
                DURABILITY,
                catch_up_steps(&bench, plan),
                Some(idle_step(&bench, plan)),
            ),
            Flush::OsCache => ("os cache, no fsync (Kafka's default)", Vec::new(), None),
        };
        reports.push(SystemReport {
            system: "kafka".into(),
            durability: durability.into(),
            latency,
            catch_up,
            idle,
        });
        drop(kafka);
        std::fs::remove_dir_all(&dir).map_err(skip)?;
    }
    Ok(reports)
}

/// The broker and where the program lives.
struct Bench<'a> {
    kafka: &'a Kafka,
    source: PathBuf,
    dir: PathBuf,
}

impl Bench<'_> {
    /// Starts `ConsumeBench.java <mode> <bootstrap> <args...>` with its stdout read line by
    /// line and its stderr in `<dir>/<name>.stderr`.
    fn start(&self, name: &str, mode: &str, args: &[String]) -> Result<Program, String> {
        let (java, classpath) = self.kafka.java();
        let stderr_path = self.dir.join(format!("{name}.stderr"));
        let stderr = File::create(&stderr_path)
            .map_err(|e| format!("creating {}: {e}", stderr_path.display()))?;
        let mut child = Command::new(java)
            // Room for 100 catch-up consumers' fetch buffers (about 2 MiB each) and the
            // latency run's records.
            .args(["-Xmx2g", "-cp", classpath])
            .arg(&self.source)
            .args([mode, self.kafka.bootstrap()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("starting java: {e}"))?;
        let (lines, receiver) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if lines.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Program {
            child,
            lines: receiver,
            stderr: stderr_path,
            other: Vec::new(),
        })
    }
}

/// A running `ConsumeBench`; killed (by its own handle) if dropped while it runs.
struct Program {
    child: Child,
    lines: Receiver<String>,
    stderr: PathBuf,
    /// The last lines of stdout that were not the ones waited for (log4j's, if any).
    other: Vec<String>,
}

impl Program {
    /// Waits until `deadline` for the line that is `word` or starts with `word `.
    fn wait_for(&mut self, word: &str, deadline: Instant) -> Result<String, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if line == word || line.starts_with(&format!("{word} ")) {
                        return Ok(line);
                    }
                    if self.other.len() == 5 {
                        self.other.remove(0);
                    }
                    self.other.push(line);
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(&format!("no {word} in time")));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failure(&format!("ended without {word}")));
                }
            }
        }
    }

    /// Closes the program's standard input (the idle mode's signal to stop).
    fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// The `RESULT` line's fields, once the program has exited successfully.
    fn result(mut self, deadline: Instant) -> Result<Fields, String> {
        let line = self.wait_for("RESULT", deadline)?;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(_)) => return Err(self.failure("failed after its result")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => return Err(self.failure("did not exit after its result")),
                Err(e) => return Err(format!("waiting for java: {e}")),
            }
        }
        Fields::parse(&line).map_err(|e| format!("{e}: {line}"))
    }

    /// Stops the program if it still runs and says what happened, with its stderr's tail.
    fn failure(&mut self, what: &str) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => status.to_string(),
            _ => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                "stopped".into()
            }
        };
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let tail: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(6)
            .collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "ConsumeBench {what} ({status}): {} {}",
            tail.join(" | "),
            self.other.join(" | ")
        )
        .trim_end()
        .to_string()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The `key=value` fields of a `RESULT` line.
#[derive(Debug)]
struct Fields(HashMap<String, String>);

impl Fields {
    fn parse(line: &str) -> Result<Fields, String> {
        let rest = line
            .strip_prefix("RESULT")
            .ok_or_else(|| "not a RESULT line".to_string())?;
        let mut fields = HashMap::new();
        for word in rest.split_whitespace() {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("{word:?} is not key=value"))?;
            fields.insert(key.to_string(), value.to_string());
        }
        Ok(Fields(fields))
    }

    fn get<T: FromStr>(&self, key: &str) -> Result<T, String> {
        let value = self
            .0
            .get(key)
            .ok_or_else(|| format!("the result has no {key}"))?;
        value
            .parse()
            .map_err(|_| format!("the result's {key}={value} is not a number"))
    }

    /// A latency of the result, in nanoseconds, as milliseconds.
    fn ms(&self, key: &str) -> Result<f64, String> {
        Ok(self.get::<u64>(key)? as f64 / 1e6)
    }
}

/// One live-latency step on `topic`, a new topic of `streams` partitions. The broker's CPU
/// and memory are sampled over the measured window (the program marks its edges), so the
/// JVM's start and the warm-up are not in them.
fn latency_step(
    bench: &Bench<'_>,
    topic: &str,
    streams: usize,
    plan: &ConsumePlan,
) -> Result<LatencyStep, String> {
    bench.kafka.create_topic(topic, streams)?;
    let args = [
        topic.to_string(),
        streams.to_string(),
        format!("{:.6}", plan.batches_per_second()),
        BATCH_BYTES.to_string(),
        plan.warmup.as_millis().to_string(),
        plan.duration.as_millis().to_string(),
    ];
    let deadline = Instant::now() + STARTUP + plan.warmup + plan.duration;
    let mut program = bench.start(&format!("latency-{streams}"), "latency", &args)?;
    program.wait_for("WINDOW", deadline)?;
    let sampler = Sampler::start(bench.kafka.pid());
    let end = program.wait_for("END", deadline);
    let usage = sampler.finish();
    end?;
    let result = program.result(deadline)?;

    let send_errors: u64 = result.get("send_errors")?;
    if send_errors > 0 {
        return Err(format!(
            "{send_errors} sends failed (see {}-latency-{streams}.stderr)",
            bench.dir.display()
        ));
    }
    let missing: i64 = result.get("missing")?;
    if missing > 0 {
        // Sent in the window, not received 5 s after it: not in the latencies (they would
        // be lower bounds), said here so a short count is explained.
        eprintln!(
            "kafka W5 {streams} streams: {missing} records still not received 5 s after the window"
        );
    }
    let count: u64 = result.get("count")?;
    let latency = if count == 0 {
        None
    } else {
        Some(LatencySummary {
            count,
            avg_ms: result.ms("avg_ns")?,
            p50_ms: result.ms("p50_ns")?,
            p95_ms: result.ms("p95_ns")?,
            p99_ms: result.ms("p99_ns")?,
            p999_ms: result.ms("p999_ns")?,
            max_ms: result.ms("max_ns")?,
        })
    };
    let window_ns: u64 = result.get("window_ns")?;
    let delivered: u64 = result.get("delivered_bytes")?;
    Ok(LatencyStep {
        streams,
        target_mb_per_s: plan.target_mb_per_s,
        // Payload the consumer received while the window ran.
        delivered_mb_per_s: delivered as f64 / 1e6 / (window_ns.max(1) as f64 / 1e9),
        latency,
        behind: result.get("behind")?,
        usage,
    })
}

/// Fills one 1-partition topic with the catch-up stream, then runs every consumer count on
/// it. The stream is `plan.catch_up_batches()` records of 64 KiB: the whole batches that hold
/// `catch_up_bytes`, as the other systems' streams.
fn catch_up_steps(bench: &Bench<'_>, plan: &ConsumePlan) -> Vec<Result<CatchUpStep, String>> {
    let topic = "w5-catch-up";
    let records = plan.catch_up_batches();
    let stream_bytes = records * BATCH_BYTES as u64;
    let filled = bench
        .kafka
        .create_topic(topic, 1)
        .and_then(|()| fill(bench, topic, records, stream_bytes));
    let steps = match filled {
        Err(e) => plan
            .consumer_counts
            .iter()
            .map(|_| Err(format!("filling the stream: {e}")))
            .collect(),
        Ok(()) => plan
            .consumer_counts
            .iter()
            .map(|&consumers| catch_up_step(bench, topic, consumers, records, stream_bytes))
            .collect(),
    };
    let _ = bench.kafka.delete_topic(topic);
    steps
}

/// Writes the catch-up stream with the same producer as the latency steps, as fast as it
/// goes (each append fsync'd, as everything here).
fn fill(bench: &Bench<'_>, topic: &str, records: u64, bytes: u64) -> Result<(), String> {
    let args = [
        topic.to_string(),
        records.to_string(),
        BATCH_BYTES.to_string(),
    ];
    // A safety net only: at least 1 MB/s.
    let deadline = Instant::now() + STARTUP + Duration::from_secs(bytes / 1_000_000);
    let program = bench.start("fill", "fill", &args)?;
    let result = program.result(deadline)?;
    let written: u64 = result.get("records")?;
    if written != records {
        return Err(format!("wrote {written} records, not {records}"));
    }
    Ok(())
}

/// `consumers` consumers read the whole stream at once. Kafka's consumer defaults are kept:
/// a fetch brings at most `max.partition.fetch.bytes` (1 MiB, 16 records here) of the one
/// partition. That is not what limits it: one consumer of a 256 MB stream on this 2-core
/// machine took 1.7 and 2.3 s with it, 2.7 and 1.4 s with 8 MiB — within the noise.
fn catch_up_step(
    bench: &Bench<'_>,
    topic: &str,
    consumers: usize,
    records: u64,
    stream_bytes: u64,
) -> Result<CatchUpStep, String> {
    let total = stream_bytes.saturating_mul(consumers as u64);
    let args = [
        topic.to_string(),
        consumers.to_string(),
        records.to_string(),
    ];
    // A safety net only: at least 2 MB/s in all.
    let deadline = Instant::now() + STARTUP + Duration::from_secs(total / 2_000_000);
    let mut program = bench.start(&format!("catch-up-{consumers}"), "catchup", &args)?;
    program.wait_for("GO", deadline)?;
    let sampler = Sampler::start(bench.kafka.pid());
    let result = program.result(deadline);
    let usage = sampler.finish();
    let result = result?;
    let read: u64 = result.get("bytes")?;
    if read != total {
        return Err(format!("read {read} bytes, not {total}"));
    }
    let seconds: f64 = result.get("seconds")?;
    if seconds <= 0.0 {
        return Err(format!("took {seconds} s"));
    }
    Ok(CatchUpStep {
        consumers,
        stream_bytes,
        aggregate_mb_per_s: total as f64 / seconds / 1e6,
        usage,
    })
}

/// The broker's resident memory per idle consumer.
///
/// Why the figure is what it is: the broker is a JVM (`-Xmx1g`). What a consumer costs it —
/// its connections' channels and buffers, its fetch session, its fetch parked in purgatory
/// for `fetch.max.wait.ms` — lives on the Java heap, and the heap shows in RSS only as the
/// pages the garbage collector has touched: regions it already used are reused without the
/// RSS moving, and new ones show up a region at a time. The sockets' buffers are the kernel's,
/// not in RSS at all. So the delta is what the process really took from the machine, and
/// can be near 0 (or a little below, if the GC gave memory back) when the heap had room; it
/// is not the bytes of the broker's objects per consumer.
fn idle_step(bench: &Bench<'_>, plan: &ConsumePlan) -> Result<IdleMemory, String> {
    let subscriptions = plan.idle_subscriptions.min(MAX_IDLE_SUBSCRIPTIONS);
    if subscriptions == 0 {
        return Err("the plan asks for no idle subscriptions".into());
    }
    if subscriptions < plan.idle_subscriptions {
        eprintln!(
            "kafka W5 idle: {subscriptions} subscriptions measured of the {} asked for",
            plan.idle_subscriptions
        );
    }
    let topic = "w5-idle";
    // One partition per subscription, as each follows a stream of its own; the topic exists
    // before the first reading, so its partitions are not counted as the subscriptions'.
    bench.kafka.create_topic(topic, subscriptions)?;
    let measured = idle_memory(bench, topic, subscriptions);
    let _ = bench.kafka.delete_topic(topic);
    measured
}

fn idle_memory(bench: &Bench<'_>, topic: &str, subscriptions: usize) -> Result<IdleMemory, String> {
    let pid = bench.kafka.pid();
    let before = settled_rss(pid).ok_or("cannot read the broker's memory")?;
    let args = [
        topic.to_string(),
        subscriptions.to_string(),
        subscriptions.to_string(),
    ];
    // Creating and connecting a consumer takes some milliseconds on a busy machine.
    let deadline = Instant::now() + STARTUP + Duration::from_millis(50 * subscriptions as u64);
    let mut program = bench.start("idle", "idle", &args)?;
    program.wait_for("READY", deadline)?;
    let after = settled_rss(pid);
    program.close_stdin();
    let result = program.result(Instant::now() + STARTUP)?;
    let after = after.ok_or("cannot read the broker's memory")?;
    let unexpected: u64 = result.get("unexpected_records")?;
    if unexpected > 0 {
        return Err(format!("the idle consumers received {unexpected} records"));
    }
    Ok(IdleMemory {
        subscriptions,
        bytes_per_subscription: (after as f64 - before as f64) / subscriptions as f64,
    })
}

/// The broker's RSS once it has been left alone for [`SETTLE`]: the median of five readings
/// over a second, so one GC's moment does not decide it.
fn settled_rss(pid: u32) -> Option<u64> {
    std::thread::sleep(SETTLE);
    let mut readings = Vec::with_capacity(5);
    for _ in 0..5 {
        readings.push(rss_bytes(pid)?);
        std::thread::sleep(Duration::from_millis(250));
    }
    readings.sort_unstable();
    readings.get(2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_result_lines() {
        let fields = Fields::parse("RESULT count=12 p99_ns=2500000 seconds=1.5").unwrap();
        assert_eq!(fields.get::<u64>("count"), Ok(12));
        assert_eq!(fields.ms("p99_ns"), Ok(2.5));
        assert_eq!(fields.get::<f64>("seconds"), Ok(1.5));
        assert!(fields.get::<u64>("max_ns").unwrap_err().contains("max_ns"));
        assert!(fields.get::<u64>("seconds").is_err(), "1.5 is not a count");
        assert!(Fields::parse("READY 3").is_err());
        assert!(Fields::parse("RESULT count").is_err());
    }

    #[test]
    fn the_program_is_embedded() {
        assert!(PROGRAM.contains("public class ConsumeBench"));
    }

    /// A small plan on a real broker (needs `peers/install.sh kafka` and java):
    /// `cargo test -p tidemark-bench --lib w5_peers::kafka -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn smoke() {
        // The harness finds Kafka at `.peers/kafka/libs` from the repository's root; this
        // test runs alone (ignored, filtered), so changing the directory touches no other.
        std::env::set_current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).unwrap();
        let plan = crate::w5::tiny_plan();
        let work = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let reports = run(work.path(), &plan).unwrap();
        println!("took {:?}", started.elapsed());
        assert_eq!(reports.len(), 2, "fsync per append, then the page cache");
        for report in &reports {
            assert_eq!(report.system, "kafka");
            assert_eq!(report.latency.len(), plan.stream_counts.len());
            for step in &report.latency {
                println!("{step:?}");
                let step = step.as_ref().unwrap();
                let latency = step.latency.unwrap();
                assert!(latency.count > 0 && latency.p99_ms > 0.0, "{step:?}");
                assert!(step.delivered_mb_per_s > 0.0, "{step:?}");
            }
        }
        assert!(reports[1].catch_up.is_empty() && reports[1].idle.is_none());
        let report = &reports[0];
        for step in &report.catch_up {
            println!("{step:?}");
            assert!(step.as_ref().unwrap().aggregate_mb_per_s > 0.0);
        }
        println!("{:?}", report.idle);
        let idle = report.idle.clone().unwrap().unwrap();
        assert_eq!(idle.subscriptions, plan.idle_subscriptions);
        assert!(!work.path().join("kafka-w5").exists());
    }
}
