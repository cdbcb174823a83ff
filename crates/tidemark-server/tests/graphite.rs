//! The Graphite plaintext listener against a real server: lines (whole, cut across writes,
//! tagged) read back through SQL; bad lines counted, skipped and the connection kept;
//! back-pressure that delays lines without losing one; and the real senders, netcat and
//! collectd's `write_graphite` plugin.
//!
//! Without `nc.openbsd` or `collectd` their tests fail under CI (`CI` set; `.ci/run` installs
//! `netcat-openbsd` and `collectd-core`) and are skipped with the reason elsewhere.

mod common;

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, hold_write_budget, metrics_text, TestServer};
use serde_json::{json, Value as Json};
use tidemark_server::config::Graphite;

fn graphite_server(
    stream: &str,
    configure: impl FnOnce(&mut tidemark_server::Config),
) -> TestServer {
    TestServer::start(|c| {
        c.graphite = Some(Graphite::new(
            "127.0.0.1:0".parse().unwrap(),
            stream.to_string(),
        ));
        configure(c);
    })
}

fn graphite_addr(server: &TestServer) -> SocketAddr {
    server.graphite.expect("the graphite listener is on")
}

fn sql(server: &TestServer, query: &str) -> Json {
    call(
        &server.client(),
        "POST",
        "/v1/query",
        Some(json!({"sql": query, "time": "ns"})),
    )
    .unwrap()["rows"]
        .clone()
}

/// The events of `stream`, once there are `expected` (lines have no answer: polled).
fn wait_for_count(server: &TestServer, stream: &str, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut count = 0;
    while Instant::now() < deadline {
        let answer = call(
            &server.client(),
            "POST",
            "/v1/query",
            Some(json!({"sql": format!("SELECT count(*) FROM {stream}")})),
        );
        count = answer.map_or(0, |a| a["rows"][0][0].as_u64().unwrap_or(0));
        if count >= expected {
            assert_eq!(count, expected, "more events than lines sent");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{stream}: {count} events after 20 s, {expected} expected");
}

fn bad_lines(server: &TestServer) -> u64 {
    let text = metrics_text(server);
    let line = text
        .lines()
        .find(|l| l.starts_with("tidemark_protocol_bad_lines_total{protocol=\"graphite\"}"))
        .unwrap_or_else(|| panic!("no graphite bad-line counter in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn schema_of(server: &TestServer, stream: &str) -> Vec<String> {
    let info = call(
        &server.client(),
        "GET",
        &format!("/v1/streams/{stream}"),
        None,
    )
    .unwrap();
    info["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "{}:{}",
                f["name"].as_str().unwrap(),
                f["type"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn lines_become_events_with_tags_as_fields_whatever_the_writes_cut_them_into() {
    let server = graphite_server("graphite", |_| {});
    let mut socket = TcpStream::connect(graphite_addr(&server)).unwrap();
    // Cut mid-line, mid-number and between "\r" and "\n".
    for piece in [
        "servers.web1.cpu 12.5 17000",
        "00000\r",
        "\nservers.web1.mem 1e3\t1700000001.25\n\n   \n",
        "disk.used;host=web1;mount=/var 90 1700000002\nservers.web2.cpu -3",
        " 1700000003\n",
    ] {
        socket.write_all(piece.as_bytes()).unwrap();
        socket.flush().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for_count(&server, "graphite", 4);
    assert_eq!(
        schema_of(&server, "graphite"),
        ["path:STRING", "value:DOUBLE", "host:STRING", "mount:STRING"]
    );
    let s = 1_000_000_000i64;
    assert_eq!(
        sql(
            &server,
            "SELECT ts, path, value, host, mount FROM graphite ORDER BY ts"
        ),
        json!([
            [1_700_000_000 * s, "servers.web1.cpu", 12.5, null, null],
            [
                1_700_000_001 * s + s / 4,
                "servers.web1.mem",
                1000.0,
                null,
                null
            ],
            [1_700_000_002 * s, "disk.used", 90.0, "web1", "/var"],
            [1_700_000_003 * s, "servers.web2.cpu", -3.0, null, null],
        ])
    );
    // -1 is "now"; NaN is kept (carbon drops it); a line older than the stream's
    // out-of-order window (an hour before its newest event) is skipped alone.
    let before = tidemark_query::time::now_ns();
    socket
        .write_all(b"now.metric 7 -1\nunknown.metric nan -1\ntoo.late 1 1700000004\n")
        .unwrap();
    wait_for_count(&server, "graphite", 6);
    let now_row = sql(&server, "SELECT ts FROM graphite WHERE path = 'now.metric'");
    let stored = now_row[0][0].as_i64().unwrap();
    assert!(
        stored >= before && stored - before < 60 * s,
        "{stored} vs {before}"
    );
    assert_eq!(
        sql(
            &server,
            "SELECT isnan(value) FROM graphite WHERE path = 'unknown.metric'"
        ),
        json!([[true]])
    );
    assert_eq!(bad_lines(&server), 1);
}

#[test]
fn bad_lines_are_counted_and_skipped_and_the_connection_stays_open() {
    let server = graphite_server("graphite", |_| {});
    let mut socket = TcpStream::connect(graphite_addr(&server)).unwrap();
    let long = format!("{} 1 1\n", "x".repeat(70 * 1024));
    let bad = [
        "only.two 1\n",
        "a.b notanumber 1\n",
        "a.b 1 yesterday\n",
        "a.b;tagwithoutvalue 1 1\n",
        long.as_str(),
    ];
    socket.write_all(b"good.one 1 100\n").unwrap();
    for line in bad {
        socket.write_all(line.as_bytes()).unwrap();
    }
    socket.write_all(b"a.\xff 1 1\n").unwrap();
    socket.write_all(b"good.two 2 200\n").unwrap();
    wait_for_count(&server, "graphite", 2);
    assert_eq!(bad_lines(&server), 6);
    // Lines the store refuses (a tag named as another field, or as the time column, or two
    // tags whose names differ only in case) are skipped alone.
    socket
        .write_all(
            b"c.d;value=x 3 300\nc.d;ts=x 3 300\nc.d;k=v 4 400\nc.d;K=w;k=v 5 500\ngood.three 6 600\n",
        )
        .unwrap();
    wait_for_count(&server, "graphite", 4);
    assert_eq!(bad_lines(&server), 9);
    assert_eq!(
        sql(&server, "SELECT path, value, k FROM graphite ORDER BY ts"),
        json!([
            ["good.one", 1.0, null],
            ["good.two", 2.0, null],
            ["c.d", 4.0, "v"],
            ["good.three", 6.0, null],
        ])
    );
    // A line cut by the connection's end is not taken (it may be a cut number).
    socket.write_all(b"cut.short 12").unwrap();
    drop(socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    while bad_lines(&server) < 10 {
        assert!(Instant::now() < deadline, "the cut line was not counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_for_count(&server, "graphite", 4);
}

#[test]
fn a_strict_stream_takes_the_lines_that_fit_it() {
    let server = graphite_server("metrics", |_| {});
    common::create(&server, "metrics", "path:STRING,value:DOUBLE");
    let mut socket = TcpStream::connect(graphite_addr(&server)).unwrap();
    socket
        .write_all(b"plain 1 1\ntagged;host=a 2 2\nplain 3 3\n")
        .unwrap();
    wait_for_count(&server, "metrics", 2);
    assert_eq!(bad_lines(&server), 1);
    assert_eq!(
        schema_of(&server, "metrics"),
        ["path:STRING", "value:DOUBLE"]
    );
}

#[test]
fn senders_without_a_token_grow_the_stream_to_at_most_max_fields() {
    let server = graphite_server("metrics", |c| {
        if let Some(g) = c.graphite.as_mut() {
            g.max_fields = 4;
        }
    });
    let mut socket = TcpStream::connect(graphite_addr(&server)).unwrap();
    // Each line names new tags; path and value are two fields, so two tags fit.
    let mut lines = String::new();
    for i in 0..50 {
        lines.push_str(&format!("m;t{i}=x 1 {}\n", i + 1));
    }
    lines.push_str("m;t0=y;t1=z 2 100\n");
    socket.write_all(lines.as_bytes()).unwrap();
    wait_for_count(&server, "metrics", 3);
    while bad_lines(&server) < 48 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(bad_lines(&server), 48);
    let schema = schema_of(&server, "metrics");
    assert_eq!(schema.len(), 4, "{schema:?}");
}

#[test]
fn pushed_back_lines_wait_unread_and_are_all_stored_when_the_budget_frees() {
    let server = graphite_server("graphite", |c| {
        c.limits.max_body_bytes = 64 << 10;
        c.limits.max_in_flight_bytes = 64 << 10;
        c.limits.retry_after_ms = 20;
    });
    // A slow HTTP writer holds the whole write budget with a body still arriving.
    let slow = hold_write_budget(&server, (64 << 10) - 1);
    let lines: String = (0..5000)
        .map(|i| format!("bp.metric {i} {}\n", i + 1))
        .collect();
    let mut socket = TcpStream::connect(graphite_addr(&server)).unwrap();
    socket.write_all(lines.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let count = |server: &TestServer| {
        call(
            &server.client(),
            "POST",
            "/v1/query",
            Some(json!({"sql": "SELECT count(*) FROM graphite"})),
        )
        .map_or(0, |a| a["rows"][0][0].as_u64().unwrap_or(0))
    };
    assert_eq!(count(&server), 0, "stored while the budget was full");
    drop(slow);
    wait_for_count(&server, "graphite", 5000);
    assert_eq!(
        sql(&server, "SELECT sum(value), min(ts), max(ts) FROM graphite"),
        json!([[
            (0..5000).sum::<i64>() as f64,
            1_000_000_000i64,
            5_000_000_000_000i64
        ]])
    );
    assert_eq!(bad_lines(&server), 0);
}

fn program(path: &str, package: &str) -> Option<PathBuf> {
    let found = Path::new(path).exists().then(|| PathBuf::from(path));
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{path} is missing: .ci/run installs Debian's {package} package"
        );
        eprintln!("skipped: no {path} (apt-get install {package})");
    }
    found
}

#[test]
fn netcat_sends_a_file_of_lines_and_every_line_is_stored() {
    let Some(nc) = program("/bin/nc.openbsd", "netcat-openbsd") else {
        return;
    };
    let server = graphite_server("graphite", |_| {});
    let addr = graphite_addr(&server);
    let lines: String = (0..20_000)
        .map(|i| format!("nc.series{} {}.5 {}\n", i % 7, i, 1_700_000_000 + i))
        .collect();
    let mut child = Command::new(nc)
        // -N: shut the socket down for writing at the end of the input (netcat-openbsd).
        .args(["-N", &addr.ip().to_string(), &addr.port().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    wait_for_count(&server, "graphite", 20_000);
    let expected_sum: f64 = (0..20_000).map(|i| i as f64 + 0.5).sum();
    assert_eq!(
        sql(
            &server,
            "SELECT count(DISTINCT path), sum(value) FROM graphite"
        ),
        json!([[7, expected_sum]])
    );
}

/// collectd, stopped (by its PID) when dropped.
struct Collectd(std::process::Child);

impl Drop for Collectd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn collectd_write_graphite_sends_its_readings_over_one_kept_connection() {
    let Some(collectd) = program("/usr/sbin/collectd", "collectd-core") else {
        return;
    };
    let server = graphite_server("collectd", |_| {});
    let addr = graphite_addr(&server);
    let dir = tempfile::tempdir().unwrap();
    // The table plugin reads numbers from a file: readings known to the test.
    let values = dir.path().join("values");
    std::fs::write(&values, "42.5 7\n").unwrap();
    let config = dir.path().join("collectd.conf");
    std::fs::write(
        &config,
        format!(
            r#"Hostname "testhost"
FQDNLookup false
Interval 1
BaseDir "{dir}"
PIDFile "{dir}/collectd.pid"
PluginDir "/usr/lib/collectd"
TypesDB "/usr/share/collectd/types.db"
LoadPlugin table
LoadPlugin load
LoadPlugin write_graphite
<Plugin table>
  <Table "{values}">
    Instance "fixed"
    Separator " "
    <Result>
      Type gauge
      InstancePrefix "reading"
      ValuesFrom 0
    </Result>
  </Table>
</Plugin>
<Plugin write_graphite>
  <Node "tidemark">
    Host "{host}"
    Port "{port}"
    Protocol "tcp"
    Prefix "collectd."
    StoreRates true
  </Node>
</Plugin>
"#,
            dir = dir.path().display(),
            values = values.display(),
            host = addr.ip(),
            port = addr.port(),
        ),
    )
    .unwrap();
    let _collectd = Collectd(
        Command::new(collectd)
            .args(["-f", "-C"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let reading = "collectd.testhost.table-fixed.gauge-reading";
    let deadline = Instant::now() + Duration::from_secs(30);
    let readings = loop {
        let rows = call(
            &server.client(),
            "POST",
            "/v1/query",
            Some(json!({"sql": format!(
                "SELECT value, ts FROM collectd WHERE path = '{reading}' ORDER BY ts"
            ), "time": "ns"})),
        )
        .map(|a| a["rows"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default();
        if rows.len() >= 3 {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "3 readings of {reading} within 30 s: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let now = tidemark_query::time::now_ns();
    for row in &readings {
        assert_eq!(row[0], json!(42.5));
        let ts = row[1].as_i64().unwrap();
        assert!((now - ts).abs() < 60_000_000_000, "{ts} is not near {now}");
    }
    let load = sql(
        &server,
        "SELECT count(*), min(value) >= 0 FROM collectd WHERE path = 'collectd.testhost.load.load.shortterm'",
    );
    assert!(load[0][0].as_u64().unwrap() >= 1, "{load}");
    assert_eq!(load[0][1], json!(true));
    assert_eq!(bad_lines(&server), 0);
}
