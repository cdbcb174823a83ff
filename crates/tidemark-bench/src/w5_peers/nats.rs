//! W5 on NATS JetStream (file storage): one stream `W5` on the subjects `w5.>`, each batch
//! one 64 KiB message, and every step read through JetStream consumers, the API a NATS user
//! follows a stream with.
//!
//! - **Live latency**: S subjects `w5.<i>` of the one stream; 16 producer connections, each
//!   with one publish in flight that waits for its JetStream acknowledgement (the message
//!   is stored); one consumer connection with an ephemeral **push** consumer on `w5.>`
//!   (deliver policy new, `ack_policy: none`). Push with no acks is what NATS's own
//!   clients use for the lowest latency (their "ordered consumer"): the server sends each
//!   message the moment it is stored, with no request round trip as a pull would need and
//!   no ack traffic; at a fixed rate a reader keeps up, so the flow control that bounds a
//!   push consumer's backlog is not needed.
//! - **Catch-up**: the stream filled beforehand on `w5.catchup`; N connections each with an
//!   ephemeral **pull** consumer (deliver policy all, `ack_policy: none`) fetching batches
//!   of 100 messages with two requests outstanding, so the server always has a request
//!   to fill while the last batch is read: pull is JetStream's API for reading a backlog
//!   at the reader's own pace (a push consumer would need flow control to not overrun it).
//! - **Idle**: N ephemeral push consumers on `w5.idle`, which gets no messages, each with
//!   its own deliver subject and its own subscription to it, all on one connection (NATS
//!   multiplexes subscriptions over a connection, as its clients do): each is a
//!   JetStream consumer, server-side state that waits for events, as a Tidemark
//!   subscription is. (A core-NATS subscription would be cheaper, but it is not a stream
//!   consumer: it cannot resume from a position.)
//!
//! Durability: NATS 2.9 JetStream acknowledges once the message is in the OS cache; it
//! syncs its files every 2 minutes and has no setting to fsync each publish.
//!
//! The protocol is spoken by hand as in [`crate::peers::nats`]; the schedule, the
//! producer slots and the consumer's bookkeeping are `w5_peers::driver`'s, shared so
//! both adapters measure the same way.

use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

use super::driver::{self, Arrivals, Following, Window};
use crate::peers::nats::{read_frame, Frame, Nats};
use crate::peers::Skipped;
use crate::w5::{CatchUpStep, ConsumePlan, IdleMemory, LatencyStep, SystemReport, BATCH_BYTES};

pub const SYSTEM: &str = "nats";
pub const DURABILITY: &str =
    "OS cache (JetStream 2.9 syncs every 2 min; no fsync-per-publish setting)";

const STREAM: &str = "W5";
const CATCH_UP_SUBJECT: &str = "w5.catchup";
const IDLE_SUBJECT: &str = "w5.idle";
/// Messages per pull request: 100 × 64 KiB = 6.5 MB, so a request's round trip is a small
/// part of reading its answer (the same count as Redis's `XREAD COUNT`).
const PULL_BATCH: u64 = 100;
/// Pull requests each catch-up reader keeps outstanding.
const PULLS_OUTSTANDING: u64 = 2;
/// Publishes per round trip while filling the catch-up subject (untimed).
const FILL_PIPELINE: usize = 32;
/// How long a producer waits for an acknowledgement before the step fails (a publish to a
/// subject no stream stores is never answered).
const ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// The deliver subjects: outside the stream's `w5.>`, and outside every connection's
/// reply inbox `_INBOX.w5.<name>.*`.
const LIVE_DELIVER: &str = "_DELIVER.w5.live";
const IDLE_DELIVER: &str = "_DELIVER.w5.idle";

/// Runs every W5 step against a nats-server started in `work_dir/nats-w5`.
pub fn run(work_dir: &Path, plan: &ConsumePlan) -> Result<Vec<SystemReport>, Skipped> {
    let dir = work_dir.join("nats-w5");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Skipped::new(SYSTEM, e.to_string()))?;
    }
    let report = Nats::start(&dir).map(|mut nats| {
        let report = run_steps(&mut nats, plan);
        drop(nats);
        report
    });
    let _ = std::fs::remove_dir_all(&dir);
    Ok(vec![report?])
}

fn run_steps(nats: &mut Nats, plan: &ConsumePlan) -> SystemReport {
    let addr = nats.addr();
    let pid = nats.pid();
    // First, on the fresh server: after the other steps the Go runtime returns their
    // freed memory to the system over minutes, which would shrink the RSS under the
    // subscriptions being counted.
    let idle = Some(
        create_stream(nats)
            .and_then(|()| idle_step(addr, pid, plan.idle_subscriptions))
            .and_then(|idle| delete_stream(nats).map(|()| idle)),
    );
    let mut latency = Vec::new();
    for &streams in &plan.stream_counts {
        let step = create_stream(nats).and_then(|()| live_step(addr, pid, plan, streams));
        // A fresh stream per step: what the last one stored is dropped with it.
        latency.push(step.and_then(|step| delete_stream(nats).map(|()| step)));
    }
    let catch_up = catch_up_steps(nats, addr, pid, plan);
    SystemReport {
        system: SYSTEM.into(),
        durability: DURABILITY.into(),
        latency,
        catch_up,
        idle,
    }
}

fn create_stream(nats: &mut Nats) -> Result<(), String> {
    // Left over from a failed step: a new step starts empty.
    let _ = nats.api(&format!("STREAM.DELETE.{STREAM}"), "");
    let config = json!({
        "name": STREAM, "subjects": ["w5.>"], "storage": "file",
        "retention": "limits", "discard": "old", "num_replicas": 1,
    });
    nats.api(&format!("STREAM.CREATE.{STREAM}"), &config.to_string())
        .map(drop)
        .map_err(|e| format!("creating the stream: {e}"))
}

fn delete_stream(nats: &mut Nats) -> Result<(), String> {
    nats.api(&format!("STREAM.DELETE.{STREAM}"), "")
        .map(drop)
        .map_err(|e| format!("deleting the stream: {e}"))
}

/// One client connection that announces header support (JetStream's status messages are
/// headers) and subscribes to its own reply inbox `_INBOX.w5.<name>.*` as sid 1.
struct Conn {
    writer: BufWriter<TcpStream>,
    reader: BufReader<TcpStream>,
    inbox: String,
}

impl Conn {
    fn connect(addr: SocketAddr, name: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let reader = stream.try_clone()?;
        let mut conn = Conn {
            writer: BufWriter::with_capacity(256 << 10, stream),
            reader: BufReader::with_capacity(1 << 20, reader),
            inbox: format!("_INBOX.w5.{name}"),
        };
        if conn.next()? != Frame::Info {
            return Err(std::io::Error::other("no INFO from the server"));
        }
        write!(
            conn.writer,
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"lang\":\"rust\",\"version\":\"0\",\"protocol\":1}}\r\nSUB {}.* 1\r\nPING\r\n",
            conn.inbox
        )?;
        conn.writer.flush()?;
        match conn.next()? {
            Frame::Pong => Ok(conn),
            other => Err(std::io::Error::other(format!(
                "expected PONG, got {other:?}"
            ))),
        }
    }

    /// A handle on the socket, to end a blocked read from another thread.
    fn socket(&self) -> std::io::Result<TcpStream> {
        self.writer.get_ref().try_clone()
    }

    /// `PUB subject [inbox.reply] len`, buffered until [`Conn::flush`].
    fn publish(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        payload: &[u8],
    ) -> std::io::Result<()> {
        match reply {
            Some(reply) => write!(
                self.writer,
                "PUB {subject} {}.{reply} {}\r\n",
                self.inbox,
                payload.len()
            )?,
            None => write!(self.writer, "PUB {subject} {}\r\n", payload.len())?,
        }
        self.writer.write_all(payload)?;
        self.writer.write_all(b"\r\n")
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }

    /// The next frame that is not a keep-alive or an `+OK` (PINGs are answered); `-ERR` is
    /// an error.
    fn next(&mut self) -> std::io::Result<Frame> {
        loop {
            match read_frame(&mut self.reader)? {
                Frame::Ping => {
                    self.writer.write_all(b"PONG\r\n")?;
                    self.writer.flush()?;
                }
                Frame::Ok => {}
                Frame::Err(e) => return Err(std::io::Error::other(format!("nats: {e}"))),
                frame => return Ok(frame),
            }
        }
    }

    /// The payload of the next message to the reply inbox (sid 1); deliveries to other
    /// subscriptions met meanwhile are skipped (there are none while a caller waits).
    fn reply(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Frame::Msg { sid, payload, .. } = self.next()? {
                if sid == "1" {
                    return Ok(payload);
                }
            }
        }
    }

    /// A JetStream API request; its JSON answer, or the API's error.
    fn api(&mut self, api: &str, body: &Json) -> std::io::Result<Json> {
        self.publish(
            &format!("$JS.API.{api}"),
            Some("api"),
            body.to_string().as_bytes(),
        )?;
        self.flush()?;
        api_answer(api, &self.reply()?)
    }

    /// Reads one publish acknowledgement: `{"stream":"W5","seq":N}` once stored.
    fn ack(&mut self) -> std::io::Result<()> {
        let payload = self.reply()?;
        if payload.windows(7).any(|w| w == b"\"error\"") {
            return Err(std::io::Error::other(format!(
                "publish refused: {}",
                String::from_utf8_lossy(&payload)
            )));
        }
        Ok(())
    }
}

fn api_answer(api: &str, payload: &[u8]) -> std::io::Result<Json> {
    let answer: Json = serde_json::from_slice(payload)
        .map_err(|e| std::io::Error::other(format!("{api} answer: {e}")))?;
    match answer.get("error") {
        Some(error) => Err(std::io::Error::other(format!("{api}: {error}"))),
        None => Ok(answer),
    }
}

/// An ephemeral consumer on the stream; answers its name.
fn create_consumer(conn: &mut Conn, config: Json) -> Result<String, String> {
    let answer = conn
        .api(
            &format!("CONSUMER.CREATE.{STREAM}"),
            &json!({ "stream_name": STREAM, "config": config }),
        )
        .map_err(|e| format!("creating a consumer: {e}"))?;
    answer["name"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("a consumer without a name: {answer}"))
}

/// One live-latency step on `streams` subjects of the (fresh) stream.
fn live_step(
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
    streams: usize,
) -> Result<LatencyStep, String> {
    if streams == 0 {
        return Err("a step of 0 streams".into());
    }
    let subjects: Vec<String> = (0..streams).map(|i| format!("w5.{i}")).collect();
    let producers = (0..driver::IN_FLIGHT)
        .map(|i| {
            let conn = Conn::connect(addr, &format!("p{i}"))?;
            conn.writer.get_ref().set_read_timeout(Some(ACK_TIMEOUT))?;
            Ok(conn)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| format!("connecting the producers: {e}"))?;
    let window = Window::new(plan);
    let following = follow(addr, Arrivals::new(window))?;
    let produced = driver::produce(
        producers,
        streams,
        &window,
        plan.batches_per_second(),
        pid,
        |conn, stream, payload| {
            conn.publish(&subjects[stream], Some("a"), payload)?;
            conn.flush()?;
            conn.ack()
        },
    );
    let arrivals = following.finish(&window, produced.as_ref().map_or(0, |p| p.acknowledged));
    driver::latency_step(streams, plan, &window, produced?, arrivals?)
}

/// Starts the consumer: subscribed to its deliver subject and its push consumer created
/// (deliver policy new) before this returns, so it gets every message published after.
fn follow(addr: SocketAddr, arrivals: Arrivals) -> Result<Following, String> {
    let failed = |e: std::io::Error| format!("starting the consumer: {e}");
    let mut conn = Conn::connect(addr, "live").map_err(failed)?;
    write!(conn.writer, "SUB {LIVE_DELIVER} 2\r\n").map_err(failed)?;
    create_consumer(
        &mut conn,
        json!({
            "deliver_subject": LIVE_DELIVER, "deliver_policy": "new", "ack_policy": "none",
            "filter_subject": "w5.>", "replay_policy": "instant",
        }),
    )?;
    let socket = conn.socket().map_err(failed)?;
    let stopping = Arc::new(AtomicBool::new(false));
    let seen = arrivals.seen();
    let handle = std::thread::spawn({
        let stopping = stopping.clone();
        move || {
            let mut arrivals = arrivals;
            loop {
                match conn.next() {
                    Ok(Frame::Msg { sid, payload, .. }) if sid == "2" => {
                        arrivals.record(&payload, Instant::now())?;
                    }
                    Ok(_) => {}
                    Err(_) if stopping.load(Ordering::Relaxed) => return Ok(arrivals),
                    Err(e) => return Err(format!("consumer: {e}")),
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

/// Fills the stream's catch-up subject, then runs every consumer count on it.
fn catch_up_steps(
    nats: &mut Nats,
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
) -> Vec<Result<CatchUpStep, String>> {
    let batches = plan.catch_up_batches();
    let filled = create_stream(nats).and_then(|()| fill(addr, batches));
    let steps = plan
        .consumer_counts
        .iter()
        .map(|&consumers| {
            filled.clone()?;
            catch_up_step(nats, addr, pid, plan, consumers)
        })
        .collect();
    let _ = delete_stream(nats);
    steps
}

/// Publishes `batches` messages to the catch-up subject, pipelined (untimed).
fn fill(addr: SocketAddr, batches: u64) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("filling the catch-up stream: {e}");
    let mut conn = Conn::connect(addr, "fill").map_err(failed)?;
    let pool = driver::payload_pool();
    let mut rng = fastrand::Rng::with_seed(5);
    let mut sent = 0;
    while sent < batches {
        let round = (batches - sent).min(FILL_PIPELINE as u64);
        for _ in 0..round {
            let at = rng.usize(..pool.len() - BATCH_BYTES);
            conn.publish(CATCH_UP_SUBJECT, Some("a"), &pool[at..at + BATCH_BYTES])
                .map_err(failed)?;
        }
        conn.flush().map_err(failed)?;
        for _ in 0..round {
            conn.ack().map_err(failed)?;
        }
        sent += round;
    }
    Ok(())
}

fn catch_up_step(
    nats: &mut Nats,
    addr: SocketAddr,
    pid: u32,
    plan: &ConsumePlan,
    consumers: usize,
) -> Result<CatchUpStep, String> {
    let batches = plan.catch_up_batches();
    let outcome = driver::catch_up(
        consumers,
        pid,
        |i| {
            let mut conn = Conn::connect(addr, &format!("r{i}"))
                .map_err(|e| format!("connecting a consumer: {e}"))?;
            let name = create_consumer(
                &mut conn,
                json!({
                    "deliver_policy": "all", "ack_policy": "none",
                    "filter_subject": CATCH_UP_SUBJECT, "replay_policy": "instant",
                    // Not dropped while the other readers connect (the default is 5 s).
                    "inactive_threshold": 120_000_000_000u64,
                }),
            )?;
            Ok((conn, name))
        },
        |(conn, name)| read_to_end(conn, name, batches),
    );
    let (elapsed, usage, readers) = outcome?;
    for (_, name) in readers {
        nats.api(&format!("CONSUMER.DELETE.{STREAM}.{name}"), "")
            .map_err(|e| format!("deleting consumer {name}: {e}"))?;
    }
    Ok(driver::catch_up_report(plan, consumers, elapsed, usage))
}

/// Pulls every message of pull consumer `name`: requests of [`PULL_BATCH`], never more
/// than the stream holds (so none waits for messages that will not come), with up to
/// [`PULLS_OUTSTANDING`] of them unanswered.
fn read_to_end(conn: &mut Conn, name: &str, batches: u64) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("pulling: {e}");
    let next = format!("$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{name}");
    let (mut requested, mut received) = (0u64, 0u64);
    while received < batches {
        while requested < batches && requested - received < PULL_BATCH * PULLS_OUTSTANDING {
            let batch = PULL_BATCH.min(batches - requested);
            // Expiry only as a safety: the messages are all there.
            let body = json!({ "batch": batch, "expires": 60_000_000_000u64 }).to_string();
            conn.publish(&next, Some("pull"), body.as_bytes())
                .map_err(failed)?;
            requested += batch;
        }
        conn.flush().map_err(failed)?;
        match conn.next().map_err(failed)? {
            Frame::Msg {
                headers: Some(headers),
                ..
            } => {
                // A status (408 Request Timeout, 409 …): the pull ended without its messages.
                let status = String::from_utf8_lossy(&headers);
                return Err(format!(
                    "pull ended after {received} of {batches} messages: {}",
                    status.lines().next().unwrap_or_default()
                ));
            }
            Frame::Msg { payload, .. } => {
                if payload.len() != BATCH_BYTES {
                    return Err(format!("a message of {} bytes", payload.len()));
                }
                received += 1;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `subscriptions` push consumers waiting on a subject that gets nothing: the server's RSS
/// before (settled) and after (all created, settled), over the number created.
fn idle_step(addr: SocketAddr, pid: u32, subscriptions: usize) -> Result<IdleMemory, String> {
    if subscriptions == 0 {
        return Err("0 idle subscriptions asked".into());
    }
    let failed = |e: std::io::Error| format!("idle subscriptions: {e}");
    let mut conn = Conn::connect(addr, "idle").map_err(failed)?;
    let before = driver::settled_rss(pid)?;
    // Every consumer's deliver subject subscribed, then every consumer created, the
    // requests pipelined (their answers come in order) in rounds of 256.
    for i in 0..subscriptions {
        write!(conn.writer, "SUB {IDLE_DELIVER}.{i} {}\r\n", i + 10).map_err(failed)?;
    }
    let api = format!("CONSUMER.CREATE.{STREAM}");
    let mut created = 0;
    let mut first_error = None;
    for round in (0..subscriptions).collect::<Vec<_>>().chunks(256) {
        for &i in round {
            let request = json!({ "stream_name": STREAM, "config": {
                "deliver_subject": format!("{IDLE_DELIVER}.{i}"), "deliver_policy": "new",
                "ack_policy": "none", "filter_subject": IDLE_SUBJECT,
            }});
            conn.publish(
                &format!("$JS.API.{api}"),
                Some("api"),
                request.to_string().as_bytes(),
            )
            .map_err(failed)?;
        }
        conn.flush().map_err(failed)?;
        for _ in round {
            match api_answer(&api, &conn.reply().map_err(failed)?) {
                Ok(_) => created += 1,
                Err(e) => {
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    let after = driver::settled_rss(pid)?;
    if created == 0 {
        return Err(format!(
            "no idle consumer created: {}",
            first_error.unwrap_or_default()
        ));
    }
    Ok(IdleMemory {
        subscriptions: created,
        bytes_per_subscription: (after as f64 - before as f64) / created as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::w5::tiny_plan;
    use crate::w5_peers::redis::tests::check_and_print;

    #[test]
    #[ignore = "starts nats-server and runs W5 for about half a minute"]
    fn smoke() {
        let dir = tempfile::tempdir().unwrap();
        let reports = run(dir.path(), &tiny_plan()).expect("nats-server is installed");
        assert_eq!(reports.len(), 1);
        check_and_print(&reports[0]);
        assert!(!dir.path().join("nats-w5").exists());
    }
}
