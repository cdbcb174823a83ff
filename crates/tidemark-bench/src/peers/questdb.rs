//! QuestDB as a W1 peer: events sent as InfluxDB line protocol over TCP (SYMBOL as a symbol
//! column, the two numbers as fields, tstart as the designated timestamp), timed until a
//! `count()` over HTTP sees every row. ILP over TCP has no acknowledgement, so "visible to a
//! query" is the end of a trial. Durability follows `cairo.commit.mode`: `sync` fsyncs each
//! commit (Tidemark's level), `nosync` leaves it to the OS cache (QuestDB's default).

use std::io::{BufWriter, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tidemark_client::{percent_encode, HttpClient};
use tidemark_core::EventBatch;

use super::{find_program, free_port, PeerProcess, Skipped};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    Sync,
    NoSync,
}

impl CommitMode {
    pub fn name(self) -> &'static str {
        match self {
            CommitMode::Sync => "sync",
            CommitMode::NoSync => "nosync",
        }
    }
}

/// The QuestDB jar that `peers/install.sh questdb` puts in `.peers/questdb/libs`.
pub fn find_jar() -> Option<PathBuf> {
    let libs = Path::new(".peers/questdb/libs");
    std::fs::read_dir(libs)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("questdb-") && n.ends_with(".jar"))
        })
}

/// A QuestDB server started for the benchmark.
pub struct QuestDb {
    _process: PeerProcess,
    ilp: SocketAddr,
    http: HttpClient,
    http_addr: SocketAddr,
}

impl QuestDb {
    pub fn start(dir: &Path, mode: CommitMode) -> Result<QuestDb, Skipped> {
        let skip = |reason: String| Skipped::new("questdb", reason);
        let jar = find_jar()
            .ok_or_else(|| skip("QuestDB is not installed (peers/install.sh questdb)".into()))?;
        let java = find_program("java").ok_or_else(|| skip("no java on PATH".into()))?;
        let port = || free_port().map_err(|e| skip(e.to_string()));
        let (http_port, ilp_port, pg_port, min_port) = (port()?, port()?, port()?, port()?);
        std::fs::create_dir_all(dir).map_err(|e| skip(e.to_string()))?;
        let bind = |p: u16| format!("127.0.0.1:{p}");
        let mut command = Command::new(java);
        command
            .env("QDB_HTTP_BIND_TO", bind(http_port))
            .env("QDB_LINE_TCP_NET_BIND_TO", bind(ilp_port))
            .env("QDB_PG_NET_BIND_TO", bind(pg_port))
            .env("QDB_HTTP_MIN_NET_BIND_TO", bind(min_port))
            .env("QDB_TELEMETRY_ENABLED", "false")
            .env("QDB_CAIRO_COMMIT_MODE", mode.name())
            .args(["-Xmx2g", "-p"])
            .arg(&jar)
            .args(["-m", "io.questdb/io.questdb.ServerMain", "-d"])
            .arg(dir);
        let ilp = SocketAddr::from(([127, 0, 0, 1], ilp_port));
        let process = PeerProcess::start(
            "questdb",
            command,
            &dir.join("questdb.log"),
            ilp,
            Duration::from_secs(90),
        )?;
        let http = HttpClient::new(&format!("http://127.0.0.1:{http_port}"), None);
        if !super::wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], http_port)),
            Duration::from_secs(30),
        ) {
            return Err(skip("its HTTP port did not open".into()));
        }
        Ok(QuestDb {
            _process: process,
            ilp,
            http,
            http_addr: SocketAddr::from(([127, 0, 0, 1], http_port)),
        })
    }

    pub fn pid(&self) -> u32 {
        self._process.pid()
    }

    /// Its HTTP address (the `/exec` SQL route, and line protocol over HTTP).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// QuestDB's line-protocol-over-HTTP endpoint (nanosecond timestamps): it answers 204
    /// once the request's rows are committed.
    pub fn line_endpoint(&self) -> crate::lines::LineEndpoint {
        crate::lines::LineEndpoint {
            url: format!("http://{}/write?precision=n", self.http_addr),
            headers: Vec::new(),
        }
    }

    /// Runs a SQL statement over HTTP and returns QuestDB's JSON answer.
    pub fn sql(&self, query: &str) -> Result<serde_json::Value, String> {
        self.http
            .request(
                "GET",
                &format!("/exec?query={}", percent_encode(query)),
                None,
            )
            .map_err(|e| e.to_string())
    }

    /// Rows in `table` (0 when it does not exist yet).
    pub fn count(&self, table: &str) -> Result<u64, String> {
        match self.sql(&format!("select count() from '{table}'")) {
            Ok(answer) => answer["dataset"][0][0]
                .as_u64()
                .ok_or_else(|| format!("unexpected answer {answer}")),
            Err(e) if e.contains("does not exist") => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Sends every event as ILP lines, then waits until `count()` sees `expected` rows.
    pub fn insert_w1(
        &self,
        table: &str,
        batches: &[EventBatch],
        expected: u64,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        let socket = TcpStream::connect(self.ilp).map_err(|e| e.to_string())?;
        let _ = socket.set_nodelay(true);
        let mut out = BufWriter::with_capacity(1 << 20, socket);
        let mut line = Vec::with_capacity(128);
        for batch in batches {
            let Some((symbols, types, prices)) = crate::w1::columns(batch) else {
                return Err("not a W1 batch".into());
            };
            for row in 0..batch.len() {
                line.clear();
                crate::lines::write_line(
                    &mut line,
                    table,
                    symbols.get(row),
                    types[row],
                    prices[row],
                    batch.tstart()[row],
                );
                out.write_all(&line).map_err(|e| e.to_string())?;
            }
        }
        out.flush().map_err(|e| e.to_string())?;
        drop(out);
        loop {
            if self.count(table)? >= expected {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return Err(format!("{expected} rows not visible after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
