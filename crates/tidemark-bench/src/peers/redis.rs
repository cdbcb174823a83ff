//! Redis Streams as a W1 peer: each event is an `XADD` (tstart and the three fields), sent
//! pipelined a buffer at a time over one connection, with the append-only file at
//! `appendfsync always` (an fsync before every reply: Tidemark's durability) or `everysec`
//! (the OS cache; up to a second lost on a crash).
//!
//! The RESP encoding is written here (a dozen lines) rather than pulling a Redis client
//! crate with its async runtime for one command.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tidemark_core::EventBatch;

use super::{find_program, free_port, PeerProcess, Skipped};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    Always,
    EverySec,
}

impl Fsync {
    pub fn name(self) -> &'static str {
        match self {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
        }
    }
}

/// A redis-server started for the benchmark, with a connection to it.
pub struct Redis {
    process: PeerProcess,
    addr: SocketAddr,
    writer: BufWriter<TcpStream>,
    reader: BufReader<TcpStream>,
}

impl Redis {
    /// Starts redis-server on a free port with its files in `dir`.
    pub fn start(dir: &Path, fsync: Fsync) -> Result<Redis, Skipped> {
        Redis::start_with_args(dir, fsync, &[])
    }

    /// [`Redis::start`] with more `--option value` arguments after the benchmark's own
    /// (W5 raises `--maxclients` for its idle subscribers, each a connection).
    pub fn start_with_args(dir: &Path, fsync: Fsync, extra: &[&str]) -> Result<Redis, Skipped> {
        let program = find_program("redis-server").ok_or_else(|| {
            Skipped::new(
                "redis",
                "redis-server is not installed (peers/install.sh redis)",
            )
        })?;
        let port = free_port().map_err(|e| Skipped::new("redis", e.to_string()))?;
        std::fs::create_dir_all(dir).map_err(|e| Skipped::new("redis", e.to_string()))?;
        let mut command = Command::new(program);
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", fsync.name()])
            .args(extra)
            .arg("--dir")
            .arg(dir);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = PeerProcess::start(
            "redis",
            command,
            &dir.join("redis.log"),
            addr,
            Duration::from_secs(10),
        )?;
        let stream = TcpStream::connect(addr).map_err(|e| Skipped::new("redis", e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let reader = stream
            .try_clone()
            .map_err(|e| Skipped::new("redis", e.to_string()))?;
        Ok(Redis {
            process,
            addr,
            writer: BufWriter::with_capacity(1 << 20, stream),
            reader: BufReader::with_capacity(1 << 20, reader),
        })
    }

    /// Where the server listens, for more connections (W5's producers and consumers).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's PID, for its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs one command and returns its reply.
    pub fn command(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        write_command(&mut self.writer, args)?;
        self.writer.flush()?;
        read_reply(&mut self.reader)
    }

    /// XADDs every event of `batches` to `key`, `per_round_trip` events per pipelined round
    /// trip, and returns the time until the last reply (durable with `appendfsync always`).
    pub fn xadd_w1(
        &mut self,
        key: &str,
        batches: &[EventBatch],
        per_round_trip: usize,
    ) -> std::io::Result<Duration> {
        let started = Instant::now();
        let mut pipeline = super::Pipeline::new(per_round_trip);
        for batch in batches {
            let Some((symbols, types, prices)) = crate::w1::columns(batch) else {
                return Err(std::io::Error::other("not a W1 batch"));
            };
            for row in 0..batch.len() {
                let tstart = batch.tstart()[row].to_string();
                let kind = types[row].to_string();
                let price = prices[row].to_string();
                write_command(
                    &mut self.writer,
                    &[
                        b"XADD",
                        key.as_bytes(),
                        b"*",
                        b"tstart",
                        tstart.as_bytes(),
                        b"SYMBOL",
                        symbols.get(row),
                        b"SECURITYTYPE",
                        kind.as_bytes(),
                        b"LASTTRADEPRICE",
                        price.as_bytes(),
                    ],
                )?;
                pipeline.sent(|n| self.collect(n))?;
            }
        }
        pipeline.finish(|n| self.collect(n))?;
        Ok(started.elapsed())
    }

    fn collect(&mut self, replies: usize) -> std::io::Result<()> {
        self.writer.flush()?;
        for _ in 0..replies {
            if let Reply::Error(e) = read_reply(&mut self.reader)? {
                return Err(std::io::Error::other(format!("redis: {e}")));
            }
        }
        Ok(())
    }
}

/// A RESP reply, as far as the benchmark needs to look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

pub fn write_command(out: &mut impl Write, args: &[&[u8]]) -> std::io::Result<()> {
    write!(out, "*{}\r\n", args.len())?;
    for arg in args {
        write!(out, "${}\r\n", arg.len())?;
        out.write_all(arg)?;
        out.write_all(b"\r\n")?;
    }
    Ok(())
}

/// Reads one reply; bulk strings and arrays are bounded by what the header says, which a
/// benchmark against a local server can trust up to a sanity limit.
pub fn read_reply(input: &mut impl BufRead) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::other(format!("bad RESP reply: {what}"));
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "redis closed the connection",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("empty line"))?;
    let number = || rest.parse::<i64>().map_err(|_| bad(line));
    Ok(match kind {
        "+" => Reply::Simple(rest.into()),
        "-" => Reply::Error(rest.into()),
        ":" => Reply::Integer(number()?),
        "$" => match number()? {
            -1 => Reply::Bulk(None),
            n if (0..=512 << 20).contains(&n) => {
                let mut data = vec![0; n as usize + 2];
                input.read_exact(&mut data)?;
                data.truncate(n as usize);
                Reply::Bulk(Some(data))
            }
            _ => return Err(bad(line)),
        },
        "*" => match number()? {
            -1 => Reply::Array(Vec::new()),
            n if (0..=1 << 20).contains(&n) => Reply::Array(
                (0..n)
                    .map(|_| read_reply(input))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return Err(bad(line)),
        },
        _ => return Err(bad(line)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_round_trips() {
        let mut out = Vec::new();
        write_command(&mut out, &[b"XADD", b"s", b"*", b"f", b"a b"]).unwrap();
        assert_eq!(
            out,
            b"*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nf\r\n$3\r\na b\r\n"
        );
        let replies =
            b"$15\r\n1700000000000-0\r\n-ERR wrong\r\n:3\r\n+OK\r\n*2\r\n$1\r\na\r\n$-1\r\n"
                .to_vec();
        let mut input = &replies[..];
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Bulk(Some(b"1700000000000-0".to_vec()))
        );
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Error("ERR wrong".into())
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Integer(3));
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Array(vec![Reply::Bulk(Some(b"a".to_vec())), Reply::Bulk(None)])
        );
        assert!(read_reply(&mut input).is_err(), "end of input");
        assert!(read_reply(&mut &b"$99999999999\r\n"[..]).is_err());
        assert!(read_reply(&mut &b"?x\r\n"[..]).is_err());
    }
}
