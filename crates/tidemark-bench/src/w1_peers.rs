//! W1 against the peers, with the same events, counts, trials and batch size as Tidemark's
//! run, at the durability level each peer states.

use std::path::Path;
use std::time::{Duration, Instant};

use tidemark_query::time::{format_instant, now_ns};

use crate::peers::kafka::{Batching, Flush, Kafka, ProducerRun};
use crate::peers::nats::Nats;
use crate::peers::questdb::{CommitMode, QuestDb};
use crate::peers::redis::{Fsync, Redis, Reply};
use crate::peers::Skipped;
use crate::w1::{cores, generate, nominal_batch_bytes, progress_bar, Trial, STREAM};

/// What W1 needs to know to run a peer like Tidemark was run.
#[derive(Debug, Clone)]
pub struct PeerInsertConfig {
    pub event_counts: Vec<usize>,
    pub trials: usize,
    /// Events per round trip (the peer's batch), as Tidemark's batch size.
    pub batch_size: usize,
    /// Scratch space for the peers' data; removed after.
    pub work_dir: std::path::PathBuf,
    pub progress: bool,
}

/// Redis Streams, `XADD` pipelined a batch per round trip, at `fsync`.
pub fn run_redis(config: &PeerInsertConfig, fsync: Fsync) -> Result<Vec<Trial>, Skipped> {
    let dir = config.work_dir.join(format!("redis-{}", fsync.name()));
    let outcome = redis_trials(config, fsync, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// The trial loop every peer shares: per count and trial, `prepare` (untimed: clear the
/// previous trial), then `insert` the trial's events, which returns how long the peer took
/// until they were stored (the peer times itself; generating events is not timed).
fn run_trials(
    config: &PeerInsertConfig,
    target: &str,
    mut prepare: impl FnMut() -> Result<(), String>,
    mut insert: impl FnMut(usize, usize) -> Result<Duration, String>,
) -> Result<Vec<Trial>, String> {
    let measured_on = format!("{} {}-core", format_instant(now_ns()), cores());
    let buffer_bytes = nominal_batch_bytes(config.batch_size);
    let mut trials = Vec::new();
    for &count in &config.event_counts {
        for trial in 1..=config.trials {
            prepare()?;
            let label = format!("{target}: {count} events, trial {trial}/{}", config.trials);
            let bar = progress_bar(config.progress, count, &label);
            let elapsed = insert(count, trial)?;
            bar.finish_and_clear();
            trials.push(Trial::timed(
                target.into(),
                "blocking",
                buffer_bytes,
                count,
                trial,
                elapsed,
                &measured_on,
            ));
        }
    }
    Ok(trials)
}

fn failed(peer: &str) -> impl Fn(String) -> Skipped + '_ {
    move |e| Skipped::new(peer, format!("failed during the run: {e}"))
}

fn redis_trials(
    config: &PeerInsertConfig,
    fsync: Fsync,
    dir: &Path,
) -> Result<Vec<Trial>, Skipped> {
    let redis = std::cell::RefCell::new(Redis::start(dir, fsync)?);
    let command = |args: &[&[u8]]| redis.borrow_mut().command(args).map_err(|e| e.to_string());
    let target = format!("redis-appendfsync-{}", fsync.name());
    run_trials(
        config,
        &target,
        || match command(&[b"DEL", STREAM.as_bytes()])? {
            Reply::Error(e) => Err(e),
            _ => Ok(()),
        },
        |count, trial| {
            let batches = generate(count, config.batch_size, now_ns(), trial as u64);
            let elapsed = redis
                .borrow_mut()
                .xadd_w1(STREAM, &batches, config.batch_size)
                .map_err(|e| e.to_string())?;
            match command(&[b"XLEN", STREAM.as_bytes()])? {
                Reply::Integer(n) if n == count as i64 => Ok(elapsed),
                other => Err(format!("XLEN answered {other:?} after {count} events")),
            }
        },
    )
    .map_err(failed("redis"))
}

/// NATS JetStream (file storage), one message per event, a batch of publishes per round
/// trip, each acknowledged once stored; the run checks the stream's message count.
pub fn run_nats(config: &PeerInsertConfig) -> Result<Vec<Trial>, Skipped> {
    let dir = config.work_dir.join("nats");
    let outcome = nats_trials(config, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn nats_trials(config: &PeerInsertConfig, dir: &Path) -> Result<Vec<Trial>, Skipped> {
    let nats = std::cell::RefCell::new(Nats::start(dir)?);
    nats.borrow_mut()
        .create_stream()
        .map_err(|e| Skipped::new("nats", format!("creating the stream: {e}")))?;
    run_trials(
        config,
        "nats-jetstream-file",
        || nats.borrow_mut().purge().map_err(|e| e.to_string()),
        |count, trial| {
            let batches = generate(count, config.batch_size, now_ns(), trial as u64);
            let mut nats = nats.borrow_mut();
            let elapsed = nats
                .publish_w1(&batches, config.batch_size)
                .map_err(|e| e.to_string())?;
            match nats.stored_messages().map_err(|e| e.to_string())? {
                n if n == count as u64 => Ok(elapsed),
                n => Err(format!(
                    "the stream holds {n} messages after {count} events"
                )),
            }
        },
    )
    .map_err(failed("nats"))
}

/// QuestDB over ILP/TCP, timed until `count()` sees every row, at `mode`.
pub fn run_questdb(config: &PeerInsertConfig, mode: CommitMode) -> Result<Vec<Trial>, Skipped> {
    let dir = config.work_dir.join(format!("questdb-{}", mode.name()));
    let outcome = questdb_trials(config, mode, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn questdb_trials(
    config: &PeerInsertConfig,
    mode: CommitMode,
    dir: &Path,
) -> Result<Vec<Trial>, Skipped> {
    let questdb = QuestDb::start(dir, mode)?;
    // One untimed round creates the table, so that no trial pays for it.
    let warm_up = generate(10, 10, now_ns(), 0);
    questdb
        .insert_w1(STREAM, &warm_up, 10, Duration::from_secs(60))
        .map_err(failed("questdb"))?;
    let target = format!("questdb-commit-{}", mode.name());
    run_trials(
        config,
        &target,
        || {
            questdb.sql(&format!("truncate table '{STREAM}'"))?;
            // WAL tables apply the truncate asynchronously: start from an empty table.
            let emptied = Instant::now();
            while questdb.count(STREAM)? > 0 {
                if emptied.elapsed() > Duration::from_secs(60) {
                    return Err("the table did not empty after TRUNCATE".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        },
        |count, trial| {
            let batches = generate(count, config.batch_size, now_ns(), trial as u64);
            questdb.insert_w1(STREAM, &batches, count as u64, Duration::from_secs(300))
        },
    )
    .map_err(failed("questdb"))
}

/// How W1 batches Kafka's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaBatches {
    /// `batch.size` = the bytes of Tidemark's batch (like for like).
    TidemarkBytes,
    /// The producer's defaults, as Kafka's users and its published figures run it.
    ProducerDefaults,
}

impl KafkaBatches {
    pub const BOTH: [KafkaBatches; 2] =
        [KafkaBatches::TidemarkBytes, KafkaBatches::ProducerDefaults];

    /// What a table adds to the durability column ("" for the like-for-like run).
    pub fn describe(self) -> &'static str {
        match self {
            KafkaBatches::TidemarkBytes => "",
            KafkaBatches::ProducerDefaults => ", producer defaults (16 KiB batches, linger 5 ms)",
        }
    }

    fn target(self, flush: Flush) -> String {
        match self {
            KafkaBatches::TidemarkBytes => format!("kafka-{}", flush.name()),
            KafkaBatches::ProducerDefaults => format!("kafka-{}-defaults", flush.name()),
        }
    }
}

/// Kafka with its own `ProducerPerformance` tool: records of the W1 payload size,
/// `acks=all`, a new topic per trial, batched as `batches` says.
pub fn run_kafka(
    config: &PeerInsertConfig,
    flush: Flush,
    batches: KafkaBatches,
) -> Result<Vec<Trial>, Skipped> {
    let target = batches.target(flush);
    let dir = config.work_dir.join(&target);
    let outcome = kafka_trials(config, flush, batches, &target, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn kafka_trials(
    config: &PeerInsertConfig,
    flush: Flush,
    batches: KafkaBatches,
    target: &str,
    dir: &Path,
) -> Result<Vec<Trial>, Skipped> {
    let kafka = Kafka::start(dir, flush)?;
    let batch_bytes = nominal_batch_bytes(config.batch_size);
    let record_size = (batch_bytes as f64 / config.batch_size.max(1) as f64).round() as usize;
    let batching = match batches {
        KafkaBatches::TidemarkBytes => Batching::Bytes {
            batch_bytes,
            linger_ms: 10,
        },
        KafkaBatches::ProducerDefaults => Batching::ToolDefaults,
    };
    run_trials(
        config,
        target,
        || Ok(()),
        |count, trial| {
            let topic = format!("w1-{count}-{trial}");
            let summary = kafka.producer_performance(&ProducerRun {
                topic: &topic,
                records: count,
                record_size,
                batching,
                records_per_second: None,
            })?;
            Ok(Duration::from_secs_f64(
                count as f64 / summary.records_per_second.max(1e-9),
            ))
        },
    )
    .map_err(failed("kafka"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kafka_run_has_a_target_and_label_of_its_own() {
        let mut targets = Vec::new();
        for flush in [Flush::EveryAppend, Flush::OsCache] {
            for batches in KafkaBatches::BOTH {
                targets.push(batches.target(flush));
            }
        }
        targets.sort();
        targets.dedup();
        assert_eq!(targets.len(), 4, "{targets:?}");
        // The like-for-like run keeps the plain label; the defaults run says so.
        assert_eq!(KafkaBatches::TidemarkBytes.describe(), "");
        assert!(KafkaBatches::ProducerDefaults
            .describe()
            .contains("defaults"));
    }

    /// With redis-server installed, the run stores every event; without it, the peer is
    /// skipped with a reason saying how to install it.
    #[test]
    fn redis_runs_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let config = PeerInsertConfig {
            event_counts: vec![10, 2000],
            trials: 2,
            batch_size: 500,
            work_dir: dir.path().to_path_buf(),
            progress: false,
        };
        match run_redis(&config, Fsync::Always) {
            Ok(trials) => {
                assert_eq!(trials.len(), 4);
                assert!(trials
                    .iter()
                    .all(|t| t.events_per_second > 0.0 && t.target == "redis-appendfsync-always"));
            }
            Err(skipped) => {
                assert!(
                    crate::peers::find_program("redis-server").is_none(),
                    "{skipped}"
                );
                assert!(skipped.reason.contains("install"), "{skipped}");
            }
        }
        assert!(
            !dir.path().join("redis-always").exists(),
            "scratch data is removed"
        );
    }

    /// With nats-server installed, JetStream stores every event (the run checks the count);
    /// without it, the peer is skipped with a reason saying how to install it.
    #[test]
    fn nats_runs_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let config = PeerInsertConfig {
            event_counts: vec![10, 3000],
            trials: 2,
            batch_size: 500,
            work_dir: dir.path().to_path_buf(),
            progress: false,
        };
        match run_nats(&config) {
            Ok(trials) => {
                assert_eq!(trials.len(), 4);
                assert!(trials
                    .iter()
                    .all(|t| t.events_per_second > 0.0 && t.target == "nats-jetstream-file"));
            }
            Err(skipped) => {
                assert!(
                    crate::peers::find_program("nats-server").is_none(),
                    "{skipped}"
                );
                assert!(skipped.reason.contains("install"), "{skipped}");
            }
        }
        assert!(!dir.path().join("nats").exists(), "scratch data is removed");
    }

    /// Without their jars (installed in `.peers/` of the working directory by
    /// `peers/install.sh`), the Java peers are skipped with the command that installs them.
    #[test]
    fn java_peers_without_their_jars_are_skipped_with_the_install_command() {
        let dir = tempfile::tempdir().unwrap();
        let config = PeerInsertConfig {
            event_counts: vec![10],
            trials: 1,
            batch_size: 10,
            work_dir: dir.path().to_path_buf(),
            progress: false,
        };
        let runs = [
            (
                crate::peers::kafka::find_libs().is_some(),
                "kafka",
                run_kafka(&config, Flush::OsCache, KafkaBatches::TidemarkBytes),
            ),
            (
                crate::peers::questdb::find_jar().is_some(),
                "questdb",
                run_questdb(&config, CommitMode::Sync),
            ),
        ];
        for (installed, peer, outcome) in runs {
            match outcome {
                Ok(trials) => assert!(
                    installed && trials.len() == 1,
                    "{peer} ran without its jars"
                ),
                Err(skipped) if !installed => {
                    assert_eq!(skipped.peer, peer);
                    assert!(
                        skipped.reason.contains(&format!("peers/install.sh {peer}")),
                        "{skipped}"
                    );
                }
                Err(skipped) => panic!("{peer} is installed but did not run: {skipped}"),
            }
        }
    }
}
