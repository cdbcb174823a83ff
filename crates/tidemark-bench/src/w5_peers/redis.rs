//! W5 on Redis Streams, at `appendfsync always` (an fsync before every reply, Tidemark's
//! level): each batch is one `XADD` entry of one 64 KiB field, and every step reads through
//! the consumer API a Redis user has, `XREAD`.
//!
//! - **Live latency**: S keys `w5_0000…`; 16 producer connections (one `XADD` in flight
//!   each, so Redis can fsync several clients' writes at once, as it does per event-loop
//!   turn); one consumer connection in `XREAD BLOCK 0 COUNT 100 STREAMS k1..kS id1..idS`,
//!   the last id per key tracked (starting from `0-0` on the freshly deleted keys, never
//!   `$`, which would skip what arrived between two calls). Redis holds streams in memory,
//!   so every `XADD` trims its key to the last 10 s (`MINID ~ <now − 10 s>`: entry ids are
//!   the server's milliseconds), as a user following a live stream would trim; the
//!   consumer trails by milliseconds, so nothing it has not read is trimmed unless it
//!   falls 10 s behind (and a message that late would not count anyway but for the first
//!   seconds of the window).
//! - **Catch-up**: one key filled beforehand, read by N connections each looping
//!   `XREAD COUNT 100 STREAMS key <last id>` from `0-0`.
//! - **Idle**: N connections each blocked in `XREAD BLOCK 0 STREAMS w5_idle $`: a blocked
//!   read holds its connection, so in Redis a subscription *is* a connection.
//!
//! `w5_peers::driver` holds what this adapter shares with the NATS one (the schedule, the producer
//! slots, the consumer's bookkeeping, the catch-up timing), so both measure identically.

use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::peers::redis::{read_reply, write_command, Fsync, Redis, Reply};
use crate::peers::Skipped;
use crate::w5::{CatchUpStep, ConsumePlan, IdleMemory, LatencyStep, SystemReport, BATCH_BYTES};

use super::driver::{self, Arrivals, Following, Window};

pub const SYSTEM: &str = "redis";
pub const DURABILITY: &str = "fsync per write (appendfsync always)";

/// Entries per `XREAD` and key: 100 × 64 KiB = 6.5 MB per reply, enough that a round trip
/// (a fraction of a millisecond here) is a small part of reading it, and small enough that
/// Redis, which builds each reply whole in its output buffer, does not hold hundreds of MB
/// for 100 catch-up readers. In the live step it is only a cap: `XREAD` answers as soon as
/// any key has an entry, however few.
const XREAD_COUNT: &str = "100";
/// `XADD`s per pipelined round trip while filling the catch-up key (untimed): one fsync
/// covers them all.
const FILL_PIPELINE: usize = 32;
/// How much of the live step's traffic each key keeps (`XADD … MINID ~`).
const RETAINED: Duration = Duration::from_secs(10);
/// Bytes Redis's allocator (jemalloc) takes per 64 KiB entry: its next size class, 80 KiB.
const BYTES_PER_ENTRY_IN_MEMORY: u64 = 80 << 10;
const CATCH_UP_KEY: &str = "w5_catchup";
const IDLE_KEY: &str = "w5_idle";

/// Runs every W5 step against a redis-server started in `work_dir/redis-w5`.
pub fn run(work_dir: &Path, plan: &ConsumePlan) -> Result<Vec<SystemReport>, Skipped> {
    let dir = work_dir.join("redis-w5");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Skipped::new(SYSTEM, e.to_string()))?;
    }
    // Each idle subscriber is a connection: room for them beyond the default 10 000.
    let max_clients = (plan.idle_subscriptions + 256).max(10_000).to_string();
    let redis = Redis::start_with_args(&dir, Fsync::Always, &["--maxclients", &max_clients]);
    let report = redis.map(|redis| {
        let report = run_steps(&redis, plan);
        drop(redis);
        report
    });
    let _ = std::fs::remove_dir_all(&dir);
    Ok(vec![report?])
}

fn run_steps(redis: &Redis, plan: &ConsumePlan) -> SystemReport {
    let addr = redis.addr();
    let pid = redis.pid();
    // First, on the fresh server, so no freed memory of another step is given back to the
    // system under the subscriptions being counted (`MEMORY PURGE` covers the rest).
    let idle = Some(idle_step(addr, pid, plan.idle_subscriptions));
    let latency = plan
        .stream_counts
        .iter()
        .map(|&streams| {
            let step = live_step(addr, pid, plan, streams);
            let cleanup = delete_keys(addr, &(0..streams).map(key_name).collect::<Vec<_>>());
            step.and_then(|step| cleanup.map(|()| step))
        })
        .collect();
    let catch_up = catch_up_steps(addr, pid, plan);
    SystemReport {
        system: SYSTEM.into(),
        durability: DURABILITY.into(),
        latency,
        catch_up,
        idle,
    }
}

pub fn key_name(index: usize) -> String {
    format!("w5_{index:04}")
}

/// One RESP connection: commands buffered until [`Conn::flush`], replies read in order.
struct Conn {
    writer: BufWriter<TcpStream>,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let reader = stream.try_clone()?;
        Ok(Conn {
            writer: BufWriter::with_capacity(256 << 10, stream),
            reader: BufReader::with_capacity(1 << 20, reader),
        })
    }

    /// A handle on the socket, to end a blocked read from another thread.
    fn socket(&self) -> std::io::Result<TcpStream> {
        self.writer.get_ref().try_clone()
    }

    fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        write_command(&mut self.writer, args)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }

    /// The next reply; a Redis error reply is an error.
    fn reply(&mut self) -> std::io::Result<Reply> {
        match read_reply(&mut self.reader)? {
            Reply::Error(e) => Err(std::io::Error::other(format!("redis: {e}"))),
            reply => Ok(reply),
        }
    }

    fn command(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.flush()?;
        self.reply()
    }
}

fn delete_keys(addr: SocketAddr, keys: &[String]) -> Result<(), String> {
    let mut conn = Conn::connect(addr).map_err(|e| format!("connecting: {e}"))?;
    // In slices: one DEL of 100 000 keys would be a large command for nothing.
    for chunk in keys.chunks(1000) {
        let mut args: Vec<&[u8]> = vec![b"DEL"];
        args.extend(chunk.iter().map(|k| k.as_bytes()));
        conn.command(&args)
            .map_err(|e| format!("deleting the keys: {e}"))?;
    }
    Ok(())
}

/// The entries of an `XREAD` reply: per key, its name and its (id, payload) entries, each
/// payload the value of the entry's field `d`.
type KeyEntries = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

fn xread_entries(reply: Reply) -> Result<KeyEntries, String> {
    let bad = |what: &str| format!("unexpected XREAD reply: {what}");
    let keys = match reply {
        Reply::Array(keys) => keys,
        // Nothing (a timed-out block; BLOCK 0 never times out).
        Reply::Bulk(None) => return Ok(Vec::new()),
        other => return Err(bad(&format!("{other:?}"))),
    };
    let mut result = Vec::with_capacity(keys.len());
    for key in keys {
        let Reply::Array(pair) = key else {
            return Err(bad("a key that is not an array"));
        };
        let mut pair = pair.into_iter();
        let (Some(Reply::Bulk(Some(name))), Some(Reply::Array(entries)), None) =
            (pair.next(), pair.next(), pair.next())
        else {
            return Err(bad("a key without [name, entries]"));
        };
        let mut list = Vec::with_capacity(entries.len());
        for entry in entries {
            let Reply::Array(entry) = entry else {
                return Err(bad("an entry that is not an array"));
            };
            let mut entry = entry.into_iter();
            let (Some(Reply::Bulk(Some(id))), Some(Reply::Array(fields))) =
                (entry.next(), entry.next())
            else {
                return Err(bad("an entry without [id, fields]"));
            };
            let mut fields = fields.into_iter();
            let payload = loop {
                match (fields.next(), fields.next()) {
                    (Some(Reply::Bulk(Some(field))), Some(Reply::Bulk(Some(value))))
                        if field == b"d" =>
                    {
                        break value
                    }
                    (Some(_), Some(_)) => {}
                    _ => return Err(bad("an entry without its field d")),
                }
            };
            list.push((id, payload));
        }
        result.push((name, list));
    }
    Ok(result)
}

/// One live-latency step on `streams` keys.
fn live_step(
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
    streams: usize,
) -> Result<LatencyStep, String> {
    if streams == 0 {
        return Err("a step of 0 streams".into());
    }
    let keys: Vec<String> = (0..streams).map(key_name).collect();
    delete_keys(addr, &keys)?;
    let batches_per_second = plan.batches_per_second();
    let retained = (batches_per_second * RETAINED.as_secs_f64()).ceil() as u64;
    fits_in_memory(retained, "the live step's last 10 s")?;
    let producers = (0..driver::IN_FLIGHT)
        .map(|_| Conn::connect(addr))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("connecting the producers: {e}"))?;
    let window = Window::new(plan);
    let following = follow(addr, keys.clone(), Arrivals::new(window))
        .map_err(|e| format!("starting the consumer: {e}"))?;
    let produced = driver::produce(
        producers,
        streams,
        &window,
        batches_per_second,
        pid,
        |conn, stream, payload| {
            let min_id = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(RETAINED)
                .as_millis()
                .to_string();
            conn.command(&[
                b"XADD",
                keys[stream].as_bytes(),
                b"MINID",
                b"~",
                min_id.as_bytes(),
                b"*",
                b"d",
                payload,
            ])
            .map(drop)
        },
    );
    // The consumer is stopped whatever the producers did.
    let arrivals = following.finish(&window, produced.as_ref().map_or(0, |p| p.acknowledged));
    driver::latency_step(streams, plan, &window, produced?, arrivals?)
}

/// Starts the consumer: its first `XREAD` is sent before this returns, so it waits on every
/// key before the first message is due.
fn follow(addr: SocketAddr, keys: Vec<String>, arrivals: Arrivals) -> std::io::Result<Following> {
    let mut conn = Conn::connect(addr)?;
    let socket = conn.socket()?;
    let stopping = Arc::new(AtomicBool::new(false));
    let index: std::collections::HashMap<Vec<u8>, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_bytes().to_vec(), i))
        .collect();
    // The keys were just deleted: `0-0` is where they start, and unlike `$` it cannot miss
    // an entry added before the first call.
    let mut ids: Vec<Vec<u8>> = vec![b"0-0".to_vec(); keys.len()];
    let send_xread = move |conn: &mut Conn, ids: &[Vec<u8>]| {
        let mut args: Vec<&[u8]> = Vec::with_capacity(6 + 2 * keys.len());
        args.extend([
            &b"XREAD"[..],
            b"BLOCK",
            b"0",
            b"COUNT",
            XREAD_COUNT.as_bytes(),
            b"STREAMS",
        ]);
        args.extend(keys.iter().map(|k| k.as_bytes()));
        args.extend(ids.iter().map(|id| &id[..]));
        conn.send(&args)?;
        conn.flush()
    };
    send_xread(&mut conn, &ids)?;
    let seen = arrivals.seen();
    let handle = std::thread::spawn({
        let stopping = stopping.clone();
        move || {
            let mut arrivals = arrivals;
            loop {
                let reply = match conn.reply() {
                    Ok(reply) => reply,
                    Err(_) if stopping.load(Ordering::Relaxed) => return Ok(arrivals),
                    Err(e) => return Err(format!("consumer: {e}")),
                };
                let at = Instant::now();
                for (key, entries) in xread_entries(reply)? {
                    let Some(&i) = index.get(&key) else {
                        return Err(format!(
                            "XREAD answered an unknown key {:?}",
                            String::from_utf8_lossy(&key)
                        ));
                    };
                    for (id, payload) in entries {
                        arrivals.record(&payload, at)?;
                        ids[i] = id;
                    }
                }
                if let Err(e) = send_xread(&mut conn, &ids) {
                    if stopping.load(Ordering::Relaxed) {
                        return Ok(arrivals);
                    }
                    return Err(format!("consumer: {e}"));
                }
            }
        }
    });
    Ok(Following {
        handle,
        stopping,
        socket,
        seen,
    })
}

/// Fills the catch-up key (if it fits in memory), then runs every consumer count on it.
fn catch_up_steps(
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
) -> Vec<Result<CatchUpStep, String>> {
    let batches = plan.catch_up_batches();
    let filled = fits_in_memory(batches, "the catch-up stream").and_then(|()| fill(addr, batches));
    let steps = plan
        .consumer_counts
        .iter()
        .map(|&consumers| {
            let filled = filled.clone()?;
            catch_up_step(addr, pid, plan, consumers, filled)
        })
        .collect();
    let _ = delete_keys(addr, &[CATCH_UP_KEY.into()]);
    steps
}

/// Redis keeps every stream in memory: `batches` entries that would take most of the free
/// memory are an error, not a swap storm or the OOM killer.
fn fits_in_memory(batches: u64, what: &str) -> Result<(), String> {
    let needed = batches * BYTES_PER_ENTRY_IN_MEMORY;
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kib| kib * 1024);
    match available {
        Some(available) if needed > available / 10 * 7 => Err(format!(
            "redis keeps streams in memory: {what} would take about {:.1} GB of the {:.1} GB \
             available",
            needed as f64 / 1e9,
            available as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// XADDs `batches` entries to the catch-up key, pipelined (untimed); returns the last id.
fn fill(addr: SocketAddr, batches: u64) -> Result<Vec<u8>, String> {
    let failed = |e: std::io::Error| format!("filling the catch-up stream: {e}");
    let mut conn = Conn::connect(addr).map_err(failed)?;
    let pool = driver::payload_pool();
    let mut rng = fastrand::Rng::with_seed(5);
    let mut last = Vec::new();
    let mut sent = 0;
    while sent < batches {
        let round = (batches - sent).min(FILL_PIPELINE as u64);
        for _ in 0..round {
            let at = rng.usize(..pool.len() - BATCH_BYTES);
            conn.send(&[
                b"XADD",
                CATCH_UP_KEY.as_bytes(),
                b"*",
                b"d",
                &pool[at..at + BATCH_BYTES],
            ])
            .map_err(failed)?;
        }
        conn.flush().map_err(failed)?;
        for _ in 0..round {
            match conn.reply().map_err(failed)? {
                Reply::Bulk(Some(id)) => last = id,
                other => return Err(format!("XADD answered {other:?}")),
            }
        }
        sent += round;
    }
    Ok(last)
}

fn catch_up_step(
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
    consumers: usize,
    last_id: Vec<u8>,
) -> Result<CatchUpStep, String> {
    let batches = plan.catch_up_batches();
    let (elapsed, usage, _) = driver::catch_up(
        consumers,
        pid,
        |_| Conn::connect(addr).map_err(|e| format!("connecting a consumer: {e}")),
        |conn| read_to_end(conn, batches, &last_id),
    )?;
    Ok(driver::catch_up_report(plan, consumers, elapsed, usage))
}

/// Reads the catch-up key from its start until `batches` entries, the last `last_id`.
fn read_to_end(conn: &mut Conn, batches: u64, last_id: &[u8]) -> Result<(), String> {
    let mut id = b"0-0".to_vec();
    let mut read = 0u64;
    while read < batches {
        let reply = conn
            .command(&[
                b"XREAD",
                b"COUNT",
                XREAD_COUNT.as_bytes(),
                b"STREAMS",
                CATCH_UP_KEY.as_bytes(),
                &id,
            ])
            .map_err(|e| format!("XREAD: {e}"))?;
        let mut any = false;
        for (_, entries) in xread_entries(reply)? {
            for (entry_id, payload) in entries {
                if payload.len() != BATCH_BYTES {
                    return Err(format!("an entry of {} bytes", payload.len()));
                }
                read += 1;
                any = true;
                id = entry_id;
            }
        }
        if !any {
            return Err(format!(
                "the stream ended after {read} of {batches} entries"
            ));
        }
    }
    if id != last_id {
        return Err("read more entries than were added".into());
    }
    Ok(())
}

/// `subscriptions` connections each blocked in `XREAD BLOCK 0 … $` on an empty key: the
/// server's RSS before (settled) and after (all blocked, settled), over the number that
/// blocked — fewer than asked if the file-descriptor limit stopped the connections.
fn idle_step(addr: SocketAddr, pid: u32, subscriptions: usize) -> Result<IdleMemory, String> {
    if subscriptions == 0 {
        return Err("0 idle subscriptions asked".into());
    }
    let mut admin = Conn::connect(addr).map_err(|e| format!("connecting: {e}"))?;
    let blocked_at_start = blocked_clients(&mut admin)?;
    let before = settled_rss(&mut admin, pid)?;
    let mut command = Vec::new();
    write_command(
        &mut command,
        &[
            b"XREAD",
            b"BLOCK",
            b"0",
            b"STREAMS",
            IDLE_KEY.as_bytes(),
            b"$",
        ],
    )
    .map_err(|e| e.to_string())?;
    let mut idle = Vec::with_capacity(subscriptions);
    for _ in 0..subscriptions {
        // Out of file descriptors (or refused): measure with those open.
        let Ok(mut stream) = TcpStream::connect(addr) else {
            break;
        };
        if stream.write_all(&command).is_ok() {
            idle.push(stream);
        }
    }
    let deadline =
        Instant::now() + Duration::from_secs(10) + Duration::from_millis(idle.len() as u64);
    let mut blocked = 0;
    while Instant::now() < deadline {
        blocked = blocked_clients(&mut admin)?.saturating_sub(blocked_at_start);
        if blocked >= idle.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = settled_rss(&mut admin, pid)?;
    for stream in &idle {
        let _ = stream.shutdown(Shutdown::Both);
    }
    if blocked == 0 {
        return Err(format!(
            "none of {} connections blocked in XREAD",
            idle.len()
        ));
    }
    Ok(IdleMemory {
        subscriptions: blocked,
        bytes_per_subscription: (after as f64 - before as f64) / blocked as f64,
    })
}

/// The server's RSS once the allocator gave back what it had freed: jemalloc returns freed
/// pages to the system lazily, which would shrink the RSS *during* the idle step, so
/// `MEMORY PURGE` first.
fn settled_rss(admin: &mut Conn, pid: u32) -> Result<u64, String> {
    admin
        .command(&[b"MEMORY", b"PURGE"])
        .map_err(|e| format!("MEMORY PURGE: {e}"))?;
    driver::settled_rss(pid)
}

/// `blocked_clients` of `INFO clients`.
fn blocked_clients(conn: &mut Conn) -> Result<usize, String> {
    let reply = conn
        .command(&[b"INFO", b"clients"])
        .map_err(|e| format!("INFO: {e}"))?;
    let Reply::Bulk(Some(text)) = reply else {
        return Err(format!("INFO answered {reply:?}"));
    };
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "INFO clients without blocked_clients".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::w5::tiny_plan;

    /// Checks every step of a report and prints its figures.
    pub(crate) fn check_and_print(report: &SystemReport) {
        println!("{} ({})", report.system, report.durability);
        for step in &report.latency {
            let step = step.as_ref().expect("latency step");
            let latency = step.latency.expect("latencies recorded");
            println!(
                "  live {:>3} streams: target {:.1} MB/s, delivered {:.1} MB/s, behind {}, \
                 n {}, avg {:.2} p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} ms, usage {:?}",
                step.streams,
                step.target_mb_per_s,
                step.delivered_mb_per_s,
                step.behind,
                latency.count,
                latency.avg_ms,
                latency.p50_ms,
                latency.p99_ms,
                latency.p999_ms,
                latency.max_ms,
                step.usage
            );
            assert!(latency.count > 0 && latency.p99_ms > 0.0, "{step:?}");
        }
        for step in &report.catch_up {
            let step = step.as_ref().expect("catch-up step");
            println!(
                "  catch-up {:>3} consumers of {:.1} MB: {:.1} MB/s aggregate, usage {:?}",
                step.consumers,
                step.stream_bytes as f64 / 1e6,
                step.aggregate_mb_per_s,
                step.usage
            );
            assert!(step.aggregate_mb_per_s > 0.0, "{step:?}");
        }
        let idle = report.idle.as_ref().expect("idle step").as_ref();
        let idle = idle.expect("idle step ran");
        println!(
            "  idle: {} subscriptions, {:.0} bytes each",
            idle.subscriptions, idle.bytes_per_subscription
        );
        assert!(idle.subscriptions > 0);
    }

    #[test]
    fn parses_xread_replies() {
        let entry = |id: &str, payload: &[u8]| {
            Reply::Array(vec![
                Reply::Bulk(Some(id.as_bytes().to_vec())),
                Reply::Array(vec![
                    Reply::Bulk(Some(b"d".to_vec())),
                    Reply::Bulk(Some(payload.to_vec())),
                ]),
            ])
        };
        let reply = Reply::Array(vec![Reply::Array(vec![
            Reply::Bulk(Some(b"w5_0001".to_vec())),
            Reply::Array(vec![entry("1-0", b"ab"), entry("1-1", b"cd")]),
        ])]);
        assert_eq!(
            xread_entries(reply).unwrap(),
            vec![(
                b"w5_0001".to_vec(),
                vec![
                    (b"1-0".to_vec(), b"ab".to_vec()),
                    (b"1-1".to_vec(), b"cd".to_vec())
                ]
            )]
        );
        assert_eq!(xread_entries(Reply::Bulk(None)).unwrap(), vec![]);
        assert!(xread_entries(Reply::Integer(1)).is_err());
        let no_field = Reply::Array(vec![Reply::Array(vec![
            Reply::Bulk(Some(b"k".to_vec())),
            Reply::Array(vec![Reply::Array(vec![
                Reply::Bulk(Some(b"1-0".to_vec())),
                Reply::Array(vec![Reply::Bulk(Some(b"x".to_vec()))]),
            ])]),
        ])]);
        assert!(xread_entries(no_field).is_err());
    }

    #[test]
    #[ignore = "starts redis-server and runs W5 for about half a minute"]
    fn smoke() {
        let dir = tempfile::tempdir().unwrap();
        let reports = run(dir.path(), &tiny_plan()).expect("redis-server is installed");
        assert_eq!(reports.len(), 1);
        check_and_print(&reports[0]);
        assert!(!dir.path().join("redis-w5").exists());
    }
}
