//! Line protocol as the real InfluxDB reads it: a corpus of tricky lines (escapes, quoted
//! strings with spaces and unicode, empty and duplicate fields, bad lines, type conflicts)
//! is sent, line by line, to Debian's InfluxDB 1.6 (`influxd`, started here on 127.0.0.1)
//! and to Tidemark. Both must give the same verdict for every line, and every accepted line
//! must read back with the same values — except the differences Tidemark makes on purpose,
//! each listed with its reason (docs/protocols.md lists the same).
//!
//! Without `influxd` the test fails under CI (`CI` set) and is skipped with the reason
//! elsewhere: `.ci/run` installs the package.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, free_port, TestServer};
use serde_json::{json, Value as Json};

/// What the two servers are expected to make of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The same verdict and, when accepted, the same values.
    Same,
    /// A difference on purpose: InfluxDB's verdict, then Tidemark's, and why.
    Differs(bool, bool, &'static str),
}

use Expect::{Differs, Same};

const CORPUS: &[(&str, Expect)] = &[
    // Escapes in measurement, tag key and tag value; quotes are literal in names.
    (r"esc\ m,ta\ g=v\,1 f=1 1", Same),
    (r"tk,tag\=k=v\=w f=1 2", Same),
    (r#""q" f=1 3"#, Same),
    (r"comma\,m,t=a\ b f=2 4", Same),
    // Quoted strings: spaces, unicode, escaped quotes and backslashes, empty.
    (r#"strs s="hello world ü 🚀" 5"#, Same),
    (r#"strs2 s="say \"hi\"",t="back\\slash" 6"#, Same),
    (r#"strs3 s="" 7"#, Same),
    (r#"strs4 s="a,b=c d" 8"#, Same),
    ("uni,tåg=vä f=1 9", Same),
    // Numbers and booleans in every form.
    ("nums f=1.5e3,g=-0.0,h=1e-3,j=-1,k=7i,l=-9223372036854775808i 10", Same),
    ("bools a=t,b=T,c=true,d=True,e=TRUE,f=f,g=F,h=false,i=False,j=FALSE 11", Same),
    ("maxint f=9223372036854775807i 12", Same),
    ("negtime f=1 -1", Same),
    // A field written twice in one line: the last value.
    ("dup f=1,f=2 13", Same),
    // A comment and a blank line store nothing.
    ("# just a comment", Same),
    ("", Same),
    // Bad lines.
    ("nofields", Same),
    ("nofields2 14", Same),
    ("emptyval f= 15", Same),
    ("emptytag,t= f=1 16", Same),
    ("duptags,t=1,t=2 f=1 17", Same),
    ("extra f=1 18 extra", Same),
    ("badts f=1 1.5", Same),
    ("badnum f=1.2.3 19", Same),
    ("nan f=NaN 20", Same),
    ("inf f=inf 34", Same),
    // Past a DOUBLE's range: refused, not stored as infinity.
    ("huge f=1e309 35", Same),
    ("tiny f=-1e309 36", Same),
    ("overflow f=9223372036854775808i 21", Same),
    ("unclosed s=\"open 22", Same),
    // A type conflict with an earlier line.
    ("conflict f=1 23", Same),
    ("conflict f=\"text\" 24", Same),
    ("conflict2 f=1i 25", Same),
    ("conflict2 f=true 26", Same),
    // Where Tidemark differs on purpose.
    (
        "unsigned f=1u 27",
        Differs(
            false,
            true,
            "`u` integers are taken (as LONG, refused above i64::MAX); InfluxDB 1.6 predates them",
        ),
    ),
    (
        "tagfield,load=x load=1 28",
        Differs(
            true,
            false,
            "tags and fields are both columns: a tag and a field of one name would be one column",
        ),
    ),
    (
        "casefold f=1,F=2 29",
        Differs(true, false, "field names are case-insensitive, as in SQL"),
    ),
    (
        "colon a:b=1 30",
        Differs(true, false, "field names cannot hold ',' or ':' (the schema spec syntax)"),
    ),
    (
        "reserved tstart=1 31",
        Differs(true, false, "tstart and tend are every event's timestamps"),
    ),
    (
        "leadingdot f=.5 33",
        Differs(
            true,
            false,
            "InfluxData's own parser of InfluxDB 3, which Tidemark runs, wants a digit before the point",
        ),
    ),
    (
        "timefield time=1 32",
        Differs(false, true, "a field named time is taken (queries call the time column ts)"),
    ),
];

fn influxd() -> Option<PathBuf> {
    ["/usr/bin/influxd", "/usr/local/bin/influxd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A real InfluxDB 1.x on loopback, stopped (by its PID) when dropped.
struct Influx {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Influx {
    fn start(binary: &PathBuf) -> Influx {
        let dir = tempfile::tempdir().unwrap();
        let (http, rpc) = (free_port(), free_port());
        let root = dir.path().display();
        let config = format!(
            "reporting-disabled = true\nbind-address = \"127.0.0.1:{rpc}\"\n\
             [meta]\ndir = \"{root}/meta\"\n\
             [data]\ndir = \"{root}/data\"\nwal-dir = \"{root}/wal\"\nquery-log-enabled = false\n\
             [http]\nbind-address = \"127.0.0.1:{http}\"\nlog-enabled = false\n\
             [monitor]\nstore-enabled = false\n[continuous_queries]\nenabled = false\n"
        );
        let path = dir.path().join("influxdb.conf");
        std::fs::write(&path, config).unwrap();
        let child = Command::new(binary)
            .arg("-config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let influx = Influx {
            child,
            url: format!("http://127.0.0.1:{http}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while send(&format!("{}/ping", influx.url), b"", "GET").0 != 204 {
            assert!(Instant::now() < deadline, "influxd did not answer /ping");
            std::thread::sleep(Duration::from_millis(50));
        }
        let created = send(
            &format!("{}/query?q=CREATE%20DATABASE%20c", influx.url),
            b"",
            "POST",
        );
        assert_eq!(created.0, 200, "{}", created.1);
        influx
    }

    /// The rows of measurement `m`: time → column → value.
    fn rows(&self, measurement: &str) -> BTreeMap<i64, BTreeMap<String, Json>> {
        let query = format!("SELECT * FROM \"{}\"", measurement.replace('"', "\\\""));
        let url = format!(
            "{}/query?db=c&epoch=ns&q={}",
            self.url,
            form_urlencoded::byte_serialize(query.as_bytes()).collect::<String>()
        );
        let (status, body) = send(&url, b"", "GET");
        assert_eq!(status, 200, "{body}");
        let answer: Json = serde_json::from_str(&body).unwrap();
        let mut rows = BTreeMap::new();
        for series in answer["results"][0]["series"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let columns: Vec<&str> = series["columns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            for values in series["values"].as_array().unwrap() {
                let values = values.as_array().unwrap();
                let time = values[0].as_i64().unwrap();
                let row = columns[1..]
                    .iter()
                    .zip(&values[1..])
                    .filter(|(_, v)| !v.is_null())
                    .map(|(c, v)| (c.to_string(), v.clone()))
                    .collect();
                rows.insert(time, row);
            }
        }
        rows
    }
}

impl Drop for Influx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status and body of a request.
fn send(url: &str, body: &[u8], method: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let answer = match method {
        "GET" => agent.get(url).call(),
        _ => agent.post(url).send(body),
    };
    match answer {
        Ok(mut response) => (
            response.status().as_u16(),
            response.body_mut().read_to_string().unwrap_or_default(),
        ),
        Err(e) => (0, e.to_string()),
    }
}

/// Tidemark's rows of stream `m`, as [`Influx::rows`] gives InfluxDB's.
fn tidemark_rows(server: &TestServer, measurement: &str) -> BTreeMap<i64, BTreeMap<String, Json>> {
    let sql = format!("SELECT * FROM \"{}\"", measurement.replace('"', "\"\""));
    let answer = call(
        &server.client(),
        "POST",
        "/v1/query",
        Some(json!({"sql": sql, "time": "ns"})),
    )
    .unwrap();
    let columns: Vec<&str> = answer["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let mut rows = BTreeMap::new();
    for values in answer["rows"].as_array().unwrap() {
        let values = values.as_array().unwrap();
        let mut time = None;
        let mut row = BTreeMap::new();
        for (column, value) in columns.iter().zip(values) {
            match *column {
                "ts" | "tstart" => time = value.as_i64(),
                "tend" => {}
                _ if value.is_null() => {}
                _ => {
                    row.insert(column.to_string(), value.clone());
                }
            }
        }
        rows.insert(time.expect("a time column"), row);
    }
    rows
}

/// JSON values compared as InfluxDB and Tidemark write them: numbers by value (InfluxDB
/// writes 1500.0 as 1500).
fn same_value(a: &Json, b: &Json) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y && x.is_sign_negative() == y.is_sign_negative(),
        _ => a == b,
    }
}

/// The measurement a corpus line writes to (its unescaped first part).
fn measurement(line: &str) -> String {
    let mut name = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.extend(chars.next()),
            ',' | ' ' => break,
            c => name.push(c),
        }
    }
    name
}

#[test]
fn tidemark_reads_line_protocol_as_influxdb_does() {
    let Some(binary) = influxd() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "influxd is missing: .ci/run installs Debian's influxdb package"
        );
        eprintln!("skipped: no influxd (apt-get install influxdb)");
        return;
    };
    let influx = Influx::start(&binary);
    let server = TestServer::start(|_| {});
    let mut compared = 0;
    let mut accepted: Vec<String> = Vec::new();
    for &(line, expect) in CORPUS {
        let body = format!("{line}\n");
        let (theirs, their_body) = send(
            &format!("{}/write?db=c", influx.url),
            body.as_bytes(),
            "POST",
        );
        let (ours, our_body) = send(
            &format!("{}/write?db=c", server.url()),
            body.as_bytes(),
            "POST",
        );
        let (their_ok, our_ok) = (theirs == 204, ours == 204);
        assert!(
            theirs == 204 || theirs == 400,
            "{line:?}: InfluxDB {theirs} {their_body}"
        );
        assert!(
            ours == 204 || ours == 400,
            "{line:?}: Tidemark {ours} {our_body}"
        );
        match expect {
            Same => assert_eq!(
                our_ok, their_ok,
                "{line:?}: InfluxDB {theirs} {their_body}, Tidemark {ours} {our_body}"
            ),
            Differs(influx_ok, tidemark_ok, why) => assert_eq!(
                (their_ok, our_ok),
                (influx_ok, tidemark_ok),
                "{line:?} ({why}): InfluxDB {theirs} {their_body}, Tidemark {ours} {our_body}"
            ),
        }
        if !our_ok {
            let error: Json = serde_json::from_str(&our_body).unwrap();
            assert!(
                error["error"].as_str().unwrap().contains("line 1"),
                "{line:?}: {our_body}"
            );
        }
        if their_ok && our_ok && !line.trim().is_empty() && !line.starts_with('#') {
            let m = measurement(line);
            if !accepted.contains(&m) {
                accepted.push(m);
            }
        }
        compared += 1;
    }
    assert_eq!(compared, CORPUS.len());
    for m in &accepted {
        let theirs = influx.rows(m);
        let ours = tidemark_rows(&server, m);
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{m:?}: times"
        );
        for (time, their_row) in &theirs {
            let our_row = &ours[time];
            assert_eq!(
                our_row.keys().collect::<Vec<_>>(),
                their_row.keys().collect::<Vec<_>>(),
                "{m:?} at {time}: columns"
            );
            for (column, value) in their_row {
                assert!(
                    same_value(&our_row[column], value),
                    "{m:?} at {time}, {column}: Tidemark {} InfluxDB {value}",
                    our_row[column]
                );
            }
        }
    }
    assert!(accepted.len() >= 15, "{accepted:?}");
}
