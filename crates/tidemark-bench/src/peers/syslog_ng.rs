//! syslog-ng 3.38 as W4's peer agent (`apt-get install syslog-ng-core syslog-ng-mod-http`):
//! producers write their messages as lines to its TCP `network()` source; it forwards them
//! with its `http()` destination through a reliable disk buffer (`disk-buffer(reliable(yes))`:
//! every message is written to the buffer file before syslog-ng takes the next; it does not
//! fsync) to [`CountingSink`], an HTTP server in the harness that records which messages
//! arrived and when, or to Tidemark's line-protocol route.
//!
//! The sink is written by hand: it only has to read HTTP/1.1 POST bodies with a
//! Content-Length (what syslog-ng's curl-based http() sends) and answer 200 or, during an
//! outage, 503; a web framework would be more code than the sink.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{find_program, free_port, PeerProcess, Skipped};
use crate::latency::Latencies;

pub struct SyslogNg {
    process: PeerProcess,
    /// Where producers write lines (TCP).
    pub addr: SocketAddr,
}

impl SyslogNg {
    /// Starts syslog-ng in `dir` (its config, disk buffer and state) forwarding each batch
    /// of lines as one POST to `url`.
    pub fn start(dir: &Path, url: &str) -> Result<SyslogNg, Skipped> {
        let program = find_program("syslog-ng").ok_or_else(|| {
            Skipped::new(
                "syslog-ng",
                "not installed (apt-get install syslog-ng-core syslog-ng-mod-http)",
            )
        })?;
        let port = free_port().map_err(|e| Skipped::new("syslog-ng", e.to_string()))?;
        let buffer = dir.join("disk-buffer");
        std::fs::create_dir_all(&buffer).map_err(|e| Skipped::new("syslog-ng", e.to_string()))?;
        let config = format!(
            r#"@version: 3.38
options {{ time-reopen(1); log-msg-size(65536); stats-freq(0); }};
source s_producers {{
  network(transport("tcp") ip("127.0.0.1") port({port}) flags(no-parse)
          max-connections(64) log-iw-size(640000) log-fetch-limit(1000) log-msg-size(65536));
}};
destination d_sink {{
  http(url("{url}") method("POST") body("${{MSG}}") batch-lines(100)
       batch-timeout(10) workers(4) response-action(429 => retry, 503 => retry)
       disk-buffer(reliable(yes) dir("{buffer}") disk-buf-size(4294967296) mem-buf-size(67108864)));
}};
log {{ source(s_producers); destination(d_sink); flags(flow-control); }};
"#,
            buffer = buffer.display()
        );
        let config_path = dir.join("syslog-ng.conf");
        std::fs::write(&config_path, config)
            .map_err(|e| Skipped::new("syslog-ng", e.to_string()))?;
        let mut command = Command::new(program);
        command
            .arg("-F")
            .arg("-f")
            .arg(&config_path)
            .arg("-R")
            .arg(dir.join("syslog-ng.persist"))
            .arg("-p")
            .arg(dir.join("syslog-ng.pid"))
            .arg("-c")
            .arg(dir.join("syslog-ng.ctl"))
            .arg("--no-caps");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = PeerProcess::start(
            "syslog-ng",
            command,
            &dir.join("syslog-ng.log"),
            addr,
            Duration::from_secs(30),
        )?;
        Ok(SyslogNg { process, addr })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The HTTP server syslog-ng forwards to: it counts every message line `P S T …`
/// (producer, sequence, produce time in µs since `epoch`) and measures produce → arrival.
pub struct CountingSink {
    pub addr: SocketAddr,
    state: Arc<SinkState>,
}

struct SinkState {
    epoch: Instant,
    /// Per producer, how often each sequence arrived.
    seen: Mutex<Vec<Vec<u32>>>,
    arrivals: Mutex<Latencies>,
    /// While set, requests are answered 503 and nothing is recorded (an upstream outage).
    down: AtomicBool,
    stop: AtomicBool,
}

impl CountingSink {
    pub fn start(
        producers: usize,
        per_producer: u64,
        epoch: Instant,
    ) -> std::io::Result<CountingSink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(SinkState {
            epoch,
            seen: Mutex::new(vec![vec![0; per_producer as usize]; producers]),
            arrivals: Mutex::new(Latencies::new()),
            down: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let serving = state.clone();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                if serving.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(connection) = connection else { continue };
                let state = serving.clone();
                std::thread::spawn(move || {
                    let _ = serve(connection, &state);
                });
            }
        });
        Ok(CountingSink { addr, state })
    }

    /// Answers 503 (`down`) or takes messages again.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::Relaxed);
    }

    /// Messages that arrived at least once.
    pub fn distinct(&self) -> u64 {
        self.tally().0
    }

    /// (lost, duplicated) over every producer's messages.
    pub fn lost_and_duplicated(&self) -> (u64, u64) {
        let (_, lost, duplicated) = self.tally();
        (lost, duplicated)
    }

    /// (arrived at least once, never arrived, arrivals beyond the first), counted under the
    /// lock: the table is polled every 20 ms while a step drains, too large to copy each time.
    fn tally(&self) -> (u64, u64, u64) {
        let Ok(seen) = self.state.seen.lock() else {
            return (0, 0, 0);
        };
        let (mut arrived, mut lost, mut duplicated) = (0, 0, 0);
        for &n in seen.iter().flatten() {
            if n == 0 {
                lost += 1;
            } else {
                arrived += 1;
                duplicated += u64::from(n - 1);
            }
        }
        (arrived, lost, duplicated)
    }

    /// Produce → arrival latencies of every message.
    pub fn arrivals(&self) -> Latencies {
        self.state
            .arrivals
            .lock()
            .map(|l| l.clone())
            .unwrap_or_else(|_| Latencies::new())
    }
}

impl Drop for CountingSink {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

/// The largest request body the sink reads; a larger one closes the connection.
const MAX_BODY: usize = 64 << 20;

/// Serves one keep-alive connection.
fn serve(connection: TcpStream, state: &SinkState) -> std::io::Result<()> {
    let mut reader = BufReader::new(connection.try_clone()?);
    let mut writer = connection;
    loop {
        let mut length = None;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(()); // closed
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse::<usize>().ok();
                }
            }
        }
        // syslog-ng posts 100 lines of ~3 KB; anything far larger is not what this sink is for.
        let length = length.unwrap_or(0);
        if length > MAX_BODY {
            return Ok(());
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        if state.down.load(Ordering::Relaxed) {
            writer.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        }
        record(state, &body);
        writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?;
    }
}

fn record(state: &SinkState, body: &[u8]) {
    let now = state.epoch.elapsed().as_micros() as u64;
    let mut latencies = Latencies::new();
    if let Ok(mut seen) = state.seen.lock() {
        for line in body.split(|&b| b == b'\n') {
            let mut fields = line.split(|&b| b == b' ');
            let mut number =
                || -> Option<u64> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
            let (Some(producer), Some(seq), Some(produced)) = (number(), number(), number()) else {
                continue;
            };
            if let Some(count) = seen
                .get_mut(producer as usize)
                .and_then(|p| p.get_mut(seq as usize))
            {
                *count += 1;
                latencies.record(Duration::from_micros(now.saturating_sub(produced)));
            }
        }
    }
    if let Ok(mut arrivals) = state.arrivals.lock() {
        arrivals.merge(&latencies);
    }
}
