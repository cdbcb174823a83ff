//! NATS JetStream as a W1 peer: a `nats-server -js` with file storage; each event is one
//! message published to a stream's subject with a reply inbox, so the server acknowledges
//! it once stored; `batch` publishes are pipelined per round trip, then their acks read.
//!
//! The client protocol is written here (text commands over one TCP connection: CONNECT,
//! PUB, SUB, MSG, PING/PONG) rather than pulling `async-nats` and its runtime for one
//! publish loop, as for Redis. Durability: NATS 2.9 JetStream writes to the OS cache and
//! syncs its files every 2 minutes; it has no fsync-per-publish setting.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tidemark_core::EventBatch;

use super::{find_program, free_port, PeerProcess, Skipped};

/// The JetStream stream and the subject it stores.
pub const STREAM: &str = "W1";
const SUBJECT: &str = "w1.events";
const INBOX: &str = "_INBOX.tidemark";

/// A nats-server started for the benchmark, with a connection to it.
pub struct Nats {
    process: PeerProcess,
    addr: SocketAddr,
    writer: BufWriter<TcpStream>,
    reader: BufReader<TcpStream>,
}

/// A message the server sent.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// A message delivered to our subscription: its subject and payload.
    Msg {
        subject: String,
        payload: Vec<u8>,
    },
    Ping,
    Pong,
    Ok,
    Err(String),
    Info,
}

impl Nats {
    /// Starts nats-server with JetStream on a free port, storing in `dir`.
    pub fn start(dir: &Path) -> Result<Nats, Skipped> {
        let skipped = |reason: String| Skipped::new("nats", reason);
        let program = find_program("nats-server").ok_or_else(|| {
            skipped("nats-server is not installed (peers/install.sh nats)".into())
        })?;
        let port = free_port().map_err(|e| skipped(e.to_string()))?;
        std::fs::create_dir_all(dir).map_err(|e| skipped(e.to_string()))?;
        let mut command = Command::new(program);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = PeerProcess::start(
            "nats",
            command,
            &dir.join("nats.log"),
            addr,
            Duration::from_secs(10),
        )?;
        let stream = TcpStream::connect(addr).map_err(|e| skipped(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let reader = stream.try_clone().map_err(|e| skipped(e.to_string()))?;
        let mut nats = Nats {
            process,
            addr,
            writer: BufWriter::with_capacity(1 << 20, stream),
            reader: BufReader::with_capacity(1 << 20, reader),
        };
        nats.handshake()
            .map_err(|e| skipped(format!("handshake: {e}")))?;
        Ok(nats)
    }

    /// Where the server listens, for more connections (W5's producers and consumers).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's PID, for its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn handshake(&mut self) -> std::io::Result<()> {
        if read_message(&mut self.reader)? != ServerMessage::Info {
            return Err(std::io::Error::other("no INFO from the server"));
        }
        write!(
            self.writer,
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"lang\":\"rust\",\"version\":\"0\",\"protocol\":1}}\r\nSUB {INBOX}.* 1\r\nPING\r\n"
        )?;
        self.writer.flush()?;
        match self.next_message()? {
            ServerMessage::Pong => Ok(()),
            other => Err(std::io::Error::other(format!(
                "expected PONG, got {other:?}"
            ))),
        }
    }

    /// The next message that is not a keep-alive (PINGs are answered).
    fn next_message(&mut self) -> std::io::Result<ServerMessage> {
        loop {
            match read_message(&mut self.reader)? {
                ServerMessage::Ping => {
                    self.writer.write_all(b"PONG\r\n")?;
                    self.writer.flush()?;
                }
                ServerMessage::Ok | ServerMessage::Info => {}
                ServerMessage::Err(e) => return Err(std::io::Error::other(format!("nats: {e}"))),
                other => return Ok(other),
            }
        }
    }

    /// A JetStream API request (`$JS.API.<api>`); answers its JSON, or the API's error.
    pub fn api(&mut self, api: &str, body: &str) -> std::io::Result<Json> {
        publish(
            &mut self.writer,
            &format!("$JS.API.{api}"),
            Some("api"),
            body.as_bytes(),
        )?;
        self.writer.flush()?;
        let ServerMessage::Msg { payload, .. } = self.next_message()? else {
            return Err(std::io::Error::other("expected the API's answer"));
        };
        let answer: Json = serde_json::from_slice(&payload)
            .map_err(|e| std::io::Error::other(format!("API answer: {e}")))?;
        match answer.get("error") {
            Some(error) => Err(std::io::Error::other(format!("{api}: {error}"))),
            None => Ok(answer),
        }
    }

    /// Creates the W1 stream (file storage) for the benchmark's subject.
    pub fn create_stream(&mut self) -> std::io::Result<()> {
        let config = serde_json::json!({
            "name": STREAM, "subjects": [SUBJECT], "storage": "file",
            "retention": "limits", "discard": "old", "num_replicas": 1,
        });
        self.api(&format!("STREAM.CREATE.{STREAM}"), &config.to_string())
            .map(drop)
    }

    pub fn purge(&mut self) -> std::io::Result<()> {
        self.api(&format!("STREAM.PURGE.{STREAM}"), "").map(drop)
    }

    /// Messages the stream holds.
    pub fn stored_messages(&mut self) -> std::io::Result<u64> {
        let info = self.api(&format!("STREAM.INFO.{STREAM}"), "")?;
        info["state"]["messages"]
            .as_u64()
            .ok_or_else(|| std::io::Error::other(format!("stream info without a count: {info}")))
    }

    /// Publishes every event of `batches` (tstart, SECURITYTYPE, LASTTRADEPRICE, SYMBOL
    /// packed in binary, the W1 payload bytes), `per_round_trip` at a time, and returns the
    /// time until the last acknowledgement.
    pub fn publish_w1(
        &mut self,
        batches: &[EventBatch],
        per_round_trip: usize,
    ) -> std::io::Result<Duration> {
        let started = Instant::now();
        let mut pipeline = super::Pipeline::new(per_round_trip);
        let mut payload = Vec::with_capacity(64);
        for batch in batches {
            let Some((symbols, types, prices)) = crate::w1::columns(batch) else {
                return Err(std::io::Error::other("not a W1 batch"));
            };
            for row in 0..batch.len() {
                payload.clear();
                payload.extend_from_slice(&batch.tstart()[row].to_le_bytes());
                payload.extend_from_slice(&types[row].to_le_bytes());
                payload.extend_from_slice(&prices[row].to_le_bytes());
                payload.extend_from_slice(symbols.get(row));
                publish(&mut self.writer, SUBJECT, Some("ack"), &payload)?;
                pipeline.sent(|n| self.collect_acks(n))?;
            }
        }
        pipeline.finish(|n| self.collect_acks(n))?;
        Ok(started.elapsed())
    }

    fn collect_acks(&mut self, acks: usize) -> std::io::Result<()> {
        self.writer.flush()?;
        for _ in 0..acks {
            let ServerMessage::Msg { payload, .. } = self.next_message()? else {
                return Err(std::io::Error::other("expected a publish acknowledgement"));
            };
            // {"stream":"W1","seq":N} when stored; {"error":{...}} when not.
            if payload.windows(7).any(|w| w == b"\"error\"") {
                return Err(std::io::Error::other(format!(
                    "publish refused: {}",
                    String::from_utf8_lossy(&payload)
                )));
            }
        }
        Ok(())
    }
}

/// `PUB subject [reply] len\r\npayload\r\n`, the reply under our inbox.
fn publish(
    out: &mut impl Write,
    subject: &str,
    reply: Option<&str>,
    payload: &[u8],
) -> std::io::Result<()> {
    match reply {
        Some(reply) => write!(out, "PUB {subject} {INBOX}.{reply} {}\r\n", payload.len())?,
        None => write!(out, "PUB {subject} {}\r\n", payload.len())?,
    }
    out.write_all(payload)?;
    out.write_all(b"\r\n")
}

/// The most payload bytes a message may claim (nats-server's default max_payload is 1 MB).
const MAX_PAYLOAD: usize = 8 << 20;

/// A server message as W5 reads it: a delivery keeps its subscription id, its reply subject
/// (JetStream's `$JS.ACK...` or a request's inbox) and its headers (`HMSG`: JetStream's
/// status messages such as `408 Request Timeout` come as headers without a payload).
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Msg {
        subject: String,
        sid: String,
        reply: Option<String>,
        headers: Option<Vec<u8>>,
        payload: Vec<u8>,
    },
    Ping,
    Pong,
    Ok,
    Err(String),
    Info,
}

/// Reads one server message.
pub fn read_message(input: &mut impl BufRead) -> std::io::Result<ServerMessage> {
    Ok(match read_frame(input)? {
        Frame::Msg {
            subject, payload, ..
        } => ServerMessage::Msg { subject, payload },
        Frame::Ping => ServerMessage::Ping,
        Frame::Pong => ServerMessage::Pong,
        Frame::Ok => ServerMessage::Ok,
        Frame::Err(e) => ServerMessage::Err(e),
        Frame::Info => ServerMessage::Info,
    })
}

/// Reads one server message, `MSG` or `HMSG` (headers are only sent to a connection that
/// announced `"headers":true`); sizes are checked against `MAX_PAYLOAD` before reading.
pub fn read_frame(input: &mut impl BufRead) -> std::io::Result<Frame> {
    let bad = |what: &str| std::io::Error::other(format!("bad NATS message: {what}"));
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "nats closed the connection",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let mut words = line.split(' ');
    Ok(match words.next().unwrap_or_default() {
        "PING" => Frame::Ping,
        "PONG" => Frame::Pong,
        "+OK" => Frame::Ok,
        "INFO" => Frame::Info,
        "-ERR" => Frame::Err(line[4..].trim().trim_matches('\'').to_string()),
        kind @ ("MSG" | "HMSG") => {
            // MSG <subject> <sid> [reply-to] <#bytes>
            // HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
            let parts: Vec<&str> = words.collect();
            let sizes = if kind == "MSG" { 1 } else { 2 };
            if !(2 + sizes..=3 + sizes).contains(&parts.len()) {
                return Err(bad(line));
            }
            let (names, sizes) = parts.split_at(parts.len() - sizes);
            let number = |text: &str| text.parse::<usize>().map_err(|_| bad(line));
            let total = number(sizes[sizes.len() - 1])?;
            let header_bytes = if sizes.len() == 2 {
                number(sizes[0])?
            } else {
                0
            };
            if total > MAX_PAYLOAD || header_bytes > total {
                return Err(bad(line));
            }
            let mut payload = vec![0; total + 2];
            input.read_exact(&mut payload)?;
            if !payload.ends_with(b"\r\n") {
                return Err(bad("payload not followed by CRLF"));
            }
            payload.truncate(total);
            let headers = (kind == "HMSG").then(|| payload.drain(..header_bytes).collect());
            Frame::Msg {
                subject: names[0].to_string(),
                sid: names[1].to_string(),
                reply: names.get(2).map(|r| r.to_string()),
                headers,
                payload,
            }
        }
        _ => return Err(bad(line)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_server_messages() {
        let mut input: &[u8] = b"INFO {\"server_id\":\"x\"}\r\nPING\r\nMSG _INBOX.tidemark.ack 1 23\r\n{\"stream\":\"W1\",\"seq\":7}\r\n-ERR 'Unknown Protocol Operation'\r\n";
        assert_eq!(read_message(&mut input).unwrap(), ServerMessage::Info);
        assert_eq!(read_message(&mut input).unwrap(), ServerMessage::Ping);
        assert_eq!(
            read_message(&mut input).unwrap(),
            ServerMessage::Msg {
                subject: "_INBOX.tidemark.ack".into(),
                payload: b"{\"stream\":\"W1\",\"seq\":7}".to_vec(),
            }
        );
        assert_eq!(
            read_message(&mut input).unwrap(),
            ServerMessage::Err("Unknown Protocol Operation".into())
        );
        assert!(read_message(&mut input).is_err(), "end of input");
    }

    #[test]
    fn refuses_malformed_messages() {
        for bad in [
            &b"HELLO\r\n"[..],
            b"MSG a 1 x\r\n",
            b"MSG a 1 5\r\nabc\r\n",
            b"MSG a 1 999999999999\r\n",
            b"MSG a 1 3\r\nabcXY",
        ] {
            let mut input = bad;
            assert!(
                read_message(&mut input).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn reads_deliveries_with_reply_and_headers() {
        let mut input: &[u8] = b"MSG w5.3 2 $JS.ACK.W5.c.1.6.1.17.0 3\r\nabc\r\nHMSG _INBOX.q.r 1 32 32\r\nNATS/1.0 408 Request Timeout\r\n\r\n\r\nHMSG a 1 b 4 6\r\nhhhhxy\r\n";
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Msg {
                subject: "w5.3".into(),
                sid: "2".into(),
                reply: Some("$JS.ACK.W5.c.1.6.1.17.0".into()),
                headers: None,
                payload: b"abc".to_vec(),
            }
        );
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Msg {
                subject: "_INBOX.q.r".into(),
                sid: "1".into(),
                reply: None,
                headers: Some(b"NATS/1.0 408 Request Timeout\r\n\r\n".to_vec()),
                payload: Vec::new(),
            }
        );
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Msg {
                subject: "a".into(),
                sid: "1".into(),
                reply: Some("b".into()),
                headers: Some(b"hhhh".to_vec()),
                payload: b"xy".to_vec(),
            }
        );
        for bad in [
            &b"HMSG a 1 5 3\r\nabc\r\n"[..],
            b"HMSG a 1 3\r\nabc\r\n",
            b"MSG a 1 b c 3\r\nabc\r\n",
            b"HMSG a 1 0 999999999999\r\n",
        ] {
            let mut input = bad;
            assert!(
                read_frame(&mut input).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn publishes_with_the_reply_inbox() {
        let mut out = Vec::new();
        publish(&mut out, "w1.events", Some("ack"), b"abc").unwrap();
        assert_eq!(out, b"PUB w1.events _INBOX.tidemark.ack 3\r\nabc\r\n");
    }
}
