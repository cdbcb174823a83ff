//! The `tidemark` command as a user runs it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn tidemark(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `tidemark streams create NAME --schema SCHEMA` on `dir`, which must succeed.
fn create(dir: &Path, name: &str, schema: &str) {
    ok(tidemark(
        dir,
        &["streams", "create", name, "--schema", schema],
        None,
    ));
}

fn fails(output: Output) -> String {
    assert!(
        !output.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn streams_put_scan_agg() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tidemark(
        dir,
        &[
            "streams",
            "create",
            "ticks",
            "--schema",
            "SYMBOL:STRING,SECURITYTYPE:INTEGER,LASTTRADEPRICE:FLOAT",
        ],
        None,
    ));
    let jsonl = (0..250)
        .map(|i| {
            format!(
                r#"{{"tstart": {}, "symbol": "{}", "SecurityType": {}, "LASTTRADEPRICE": {}}}"#,
                i as i64 * 1_000_000_000,
                ["A", "B"][i % 2],
                i % 4,
                i as f32 / 2.0
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(ok(tidemark(
        dir,
        &["put", "ticks", "--batch", "100"],
        Some(&jsonl)
    ))
    .contains("stored 250 events"));

    let csv_path = dir.join("more.csv");
    std::fs::write(
        &csv_path,
        "tstart,tend,SYMBOL,SECURITYTYPE,LASTTRADEPRICE\n250000000000,250000000005,\"C,1\",1,\n",
    )
    .unwrap();
    assert!(ok(tidemark(
        dir,
        &["put", "ticks", csv_path.to_str().unwrap()],
        None
    ))
    .contains("stored 1 events"));

    assert_eq!(ok(tidemark(dir, &["streams", "list"], None)), "ticks\n");
    let info = ok(tidemark(dir, &["streams", "info", "ticks"], None));
    assert!(info.contains("events:      251"), "{info}");
    // tstart and tend are timestamps, as SQL, Arrow and psql show them (issue 43, 9).
    assert!(
        info.contains("schema:      tstart:TIMESTAMP,tend:TIMESTAMP?,SYMBOL:STRING,"),
        "{info}"
    );

    let scan = ok(tidemark(
        dir,
        &[
            "scan",
            "ticks",
            "--from",
            "240000000000",
            "--where",
            "SYMBOL = 'B'",
            "--fields",
            "LASTTRADEPRICE",
        ],
        None,
    ));
    let lines: Vec<&str> = scan.lines().collect();
    assert_eq!(lines.len(), 5, "{scan}");
    assert_eq!(
        lines[0],
        r#"{"tstart":241000000000,"LASTTRADEPRICE":120.5}"#
    );
    let csv = ok(tidemark(
        dir,
        &["scan", "ticks", "--from", "250000000000", "--format", "csv"],
        None,
    ));
    assert_eq!(
        csv,
        "tstart,tend,SYMBOL,SECURITYTYPE,LASTTRADEPRICE\n250000000000,250000000005,\"C,1\",1,\n"
    );
    assert_eq!(
        ok(tidemark(dir, &["scan", "ticks", "--limit", "3"], None))
            .lines()
            .count(),
        3
    );

    let agg = ok(tidemark(
        dir,
        &[
            "agg",
            "ticks",
            "--fn",
            "count",
            "--fn",
            "max:LASTTRADEPRICE",
            "--bucket",
            "1m",
            "--format",
            "jsonl",
        ],
        None,
    ));
    let rows: Vec<serde_json::Value> = agg
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 5);
    // JSON lines print nanoseconds, as scan's and query's do (issue 43, 7).
    assert_eq!(rows[0]["bucket"], 0);
    assert_eq!(rows[1]["bucket"], 60_000_000_000i64);
    assert_eq!(rows[0]["count(*)"], 60);
    assert_eq!(rows[0]["max(LASTTRADEPRICE)"], 29.5);
    assert_eq!(rows[4]["count(*)"], 11);
    let table = ok(tidemark(
        dir,
        &["agg", "ticks", "--fn", "sum:SECURITYTYPE"],
        None,
    ));
    assert!(
        table.contains("sum(SECURITYTYPE)") && table.contains("374"),
        "{table}"
    );

    ok(tidemark(
        dir,
        &["streams", "retention", "ticks", "--max-age", "1d"],
        None,
    ));
    let info = ok(tidemark(dir, &["streams", "info", "ticks"], None));
    assert!(
        info.contains("events:      0"),
        "events from 1970 are past a 1-day retention: {info}"
    );
    ok(tidemark(dir, &["put", "ticks"], Some(&jsonl)));
    ok(tidemark(dir, &["streams", "clear", "ticks"], None));
    assert_eq!(ok(tidemark(dir, &["scan", "ticks"], None)), "");
    ok(tidemark(dir, &["streams", "drop", "ticks"], None));
    assert_eq!(ok(tidemark(dir, &["streams", "list"], None)), "");
}

#[test]
fn bad_input_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(fails(tidemark(
        dir,
        &["streams", "create", "a/b", "--schema", "X:LONG"],
        None
    ))
    .contains("must not contain '/'"));
    assert!(fails(tidemark(
        dir,
        &["streams", "create", "s", "--schema", "X:WHAT"],
        None
    ))
    .contains("unknown field type"));
    create(dir, "s", "X:LONG");
    assert!(fails(tidemark(
        dir,
        &["streams", "create", "s", "--schema", "X:DOUBLE"],
        None
    ))
    .contains("already exists"));
    let err = fails(tidemark(
        dir,
        &["put", "s"],
        Some("{\"tstart\": 1, \"X\": 1}\n{\"tstart\": 2, \"X\": \"two\"}\n"),
    ));
    assert!(
        err.contains("line 2")
            && err.contains("expects LONG")
            && err.contains("0 events were stored"),
        "{err}"
    );
    assert!(fails(tidemark(dir, &["put", "s"], Some("not json\n"))).contains("line 1: not JSON"));
    assert!(fails(tidemark(dir, &["put", "nope"], Some(""))).contains("no stream named"));
    assert!(fails(tidemark(dir, &["agg", "s", "--fn", "max"], None)).contains("needs a field"));
    assert!(fails(tidemark(dir, &["scan", "s", "--where", "Y > 1"], None)).contains("no field"));
    assert!(
        fails(tidemark(dir, &["scan", "s", "--last", "soon"], None)).contains("invalid duration")
    );
}

#[test]
fn verify_reports_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir, "s", "X:LONG");
    let events: String = (0..5000)
        .map(|i| format!("{{\"tstart\": {i}, \"X\": {}}}\n", i * 7))
        .collect();
    ok(tidemark(dir, &["put", "s"], Some(&events)));
    // Retention forces a flush on close, so the events are in a segment (none is old enough to go).
    ok(tidemark(
        dir,
        &["streams", "retention", "s", "--max-bytes", "1000000000"],
        None,
    ));
    assert!(ok(tidemark(dir, &["verify"], None)).contains("ok       s: 5000 events, 1 segments"));

    let segment = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[20] ^= 0x40; // inside the first block
    std::fs::write(&segment, bytes).unwrap();
    let out = tidemark(dir, &["verify"], None);
    assert!(!out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("DAMAGED  s") && stdout.contains("checksum"),
        "{stdout}"
    );
}

/// A damaged record in the middle of the log with acknowledged records after it (issue 42:
/// they were cut silently): opening the directory is refused with the file, the place and
/// the way out; `verify --repair` saves every byte it cuts beside the log, says what was
/// lost, and the database opens again with the events before the damage.
#[test]
fn verify_repair_cuts_a_corrupt_log_and_saves_what_it_cuts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir, "s", "X:LONG");
    let events: String = (0..500)
        .map(|i| format!("{{\"tstart\": {i}, \"X\": {}}}\n", i * 7))
        .collect();
    ok(tidemark(
        dir,
        &["put", "s", "--batch", "100"],
        Some(&events),
    ));
    // The stream's creation and five batches, each written (and fsync'd) by itself.
    let log = dir.join("wal").join("00000000000000000000.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let mut frames = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        frames.push(at);
        // frame := u32 length | u32 CRC32C | u64 LSN | payload
        at += 16 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    assert_eq!(frames.len(), 6);
    let damaged = frames[3]; // the third batch; the log's first byte is LSN 0
    bytes[damaged + 16 + 10] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();

    let repair = format!("tidemark verify --repair --data-dir {}", dir.display());
    for command in [&["verify"][..], &["scan", "s"]] {
        let err = fails(tidemark(dir, command, None));
        assert!(
            err.contains("corrupt")
                && err.contains(&log.display().to_string())
                && err.contains(&format!("at byte {damaged}"))
                && err.contains(&repair),
            "{command:?}: {err}"
        );
    }
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "nothing was cut");

    let out = ok(tidemark(dir, &["verify", "--repair"], None));
    assert!(
        out.contains("REPAIRED log")
            && out.contains("2 valid records")
            && out.contains("NOT restored")
            && out.contains("ok       s: 200 events"),
        "{out}"
    );
    let saved = dir.join("wal").join(format!("damaged-{damaged:020}.bin"));
    assert_eq!(std::fs::read(&saved).unwrap(), &bytes[damaged..]);
    let note = std::fs::read_to_string(dir.join("wal").join(format!("damaged-{damaged:020}.txt")))
        .unwrap();
    assert!(note.contains("NOT in the database"), "{note}");

    let out = ok(tidemark(dir, &["verify", "--repair"], None));
    assert!(
        out.contains("nothing to repair") && out.contains("ok       s: 200 events"),
        "{out}"
    );
    // Writes go on after the cut.
    ok(tidemark(
        dir,
        &["put", "s"],
        Some("{\"tstart\": 1000, \"X\": 1}\n"),
    ));
    assert!(ok(tidemark(dir, &["verify"], None)).contains("ok       s: 201 events"));
}

/// An agent's spool is verified and repaired as a spool (as a plain database a checkpoint
/// could delete records never forwarded), and the repair says what forwarding loses.
#[test]
fn verify_repair_opens_an_agents_spool_as_a_spool() {
    use std::sync::Arc;
    use tidemark_core::{BatchBuilder, Schema, Value};
    use tidemark_engine::{Options, Spool, SpoolOptions};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let limits = SpoolOptions {
        max_bytes: 1 << 30,
        min_free_bytes: 0,
    };
    let db = Spool::open(dir, Options::default(), limits).unwrap();
    let schema = Arc::new(Schema::parse_spec("X:LONG").unwrap());
    db.create_stream("s", (*schema).clone()).unwrap();
    let mut lsns = Vec::new();
    for batch in 0..4i64 {
        let mut b = BatchBuilder::new(schema.clone(), 0);
        for ts in batch * 10..batch * 10 + 10 {
            b.push_row(ts, None, &[Value::Long(ts)]).unwrap();
        }
        lsns.push(db.append("s", b.finish()).unwrap().lsn);
    }
    drop(db);
    // Forwarding had reached the third batch.
    std::fs::write(
        dir.join("forwarding.json"),
        format!(
            r#"{{"producer": 7, "forwarded": {}, "in_flight": null}}"#,
            lsns[2]
        ),
    )
    .unwrap();
    let log = dir.join("wal").join("00000000000000000000.log");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[lsns[1] as usize + 20] ^= 1; // the second batch
    std::fs::write(&log, &bytes).unwrap();

    let err = fails(tidemark(dir, &["verify"], None));
    assert!(
        err.contains("corrupt") && err.contains("verify --repair"),
        "{err}"
    );
    let out = ok(tidemark(dir, &["verify", "--repair"], None));
    assert!(
        out.contains("REPAIRED log")
            && out.contains("an agent's spool")
            && out.contains(&format!("forwarding reached LSN {}", lsns[2]))
            && out.contains("ok       spool: 2 records"),
        "{out}"
    );
    let saved = dir.join("wal").join(format!("damaged-{:020}.bin", lsns[1]));
    assert_eq!(std::fs::read(saved).unwrap(), &bytes[lsns[1] as usize..]);
}

#[test]
fn sql_on_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    create(dir.path(), "t", "S:STRING,N:LONG");
    let events = "{\"tstart\": 1, \"S\": \"a\", \"N\": 5}\n{\"tstart\": 2, \"S\": \"b\", \"N\": 7}\n{\"tstart\": 3, \"S\": \"a\", \"N\": null}\n";
    ok(tidemark(dir.path(), &["put", "t"], Some(events)));
    let csv = ok(tidemark(
        dir.path(),
        &[
            "query",
            "--format",
            "csv",
            "SELECT S, count(*), sum(N) FROM t GROUP BY S ORDER BY S",
        ],
        None,
    ));
    assert_eq!(csv, "S,count(*),sum(N)\na,2,5\nb,1,7\n");
    let jsonl = ok(tidemark(
        dir.path(),
        &[
            "query",
            "--format",
            "jsonl",
            "SELECT ts, N FROM t WHERE N > 6 OR S = 'a' ORDER BY N DESC NULLS LAST",
        ],
        None,
    ));
    assert_eq!(
        jsonl,
        "{\"ts\":2,\"N\":7}\n{\"ts\":1,\"N\":5}\n{\"ts\":3,\"N\":null}\n"
    );
    let err = fails(tidemark(
        dir.path(),
        &["query", "DELETE FROM t WHERE N > 1"],
        None,
    ));
    assert!(err.contains("not supported: DELETE"), "{err}");
}

/// The W1 server target end to end: a server in the process, the binary protocol, a CSV.
#[test]
fn bench_insert_against_a_server() {
    let out = tempfile::tempdir().unwrap();
    // An earlier run's figures in the same folder must not mix with this run's.
    let stale = "workload,system,variant,metric,value,unit\nW3,stale,x,throughput,1,MB/s\n";
    std::fs::write(out.path().join("summary.csv"), stale).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "bench",
            "insert",
            "--target",
            "server",
            "--events",
            "1000,5000",
            "--trials",
            "2",
        ])
        .args([
            "--buffer-size",
            "1KB,64KB",
            "--buffer",
            "non-blocking",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = ok(output);
    assert!(stdout.contains("server-binary"), "{stdout}");
    let csv = std::fs::read_to_string(out.path().join("insert.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 2 * 2 * 2, "{csv}");
    assert!(
        rows.iter()
            .all(|r| r.starts_with("server-binary,1,non-blocking,")),
        "{csv}"
    );
    assert!(
        !out.path().join("data").exists(),
        "the benchmark's data is removed"
    );
    let summary = std::fs::read_to_string(out.path().join("summary.csv")).unwrap();
    assert!(summary.starts_with("workload,system,"), "{summary}");
    assert!(!summary.contains("stale"), "{summary}");
    assert!(summary.contains("\nW1,tidemark,"), "{summary}");
}

/// W5 on Tidemark end to end, small: a consumer follows 1 and 3 streams, 1 and 2 consumers
/// catch up on one stream, 8 subscriptions idle; every step gives its figures, each catch-up
/// consumer having read every event once and in order (the run checks it, and fails if not).
#[test]
fn bench_consume_runs_every_step_on_tidemark() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["bench", "consume", "--streams", "1,3", "--rate", "5"])
        .args(["--duration", "1", "--warmup", "0", "--catch-up-mb", "2"])
        .args(["--consumers", "1,2", "--idle", "8", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = ok(output);
    assert!(!stdout.contains("failed"), "{stdout}");
    let csv = std::fs::read_to_string(out.path().join("consume.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|r| r.split(',').collect())
        .collect();
    let steps: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[2], r[3], r[4])).collect();
    assert_eq!(
        steps,
        [
            ("latency", "1", "1"),
            ("latency", "3", "1"),
            ("catch_up", "1", "1"),
            ("catch_up", "1", "2"),
            ("idle", "1", "8"),
        ],
        "{csv}"
    );
    for row in &rows {
        assert_eq!(row[0], "tidemark", "{csv}");
        assert_eq!(row[18], "", "no step failed: {csv}");
    }
    for row in &rows[..2] {
        let received: u64 = row[7].parse().unwrap();
        assert!(received > 0, "batches received in the window: {csv}");
    }
    for row in &rows[2..4] {
        let mb_per_s: f64 = row[6].parse().unwrap();
        assert!(mb_per_s > 0.0, "{csv}");
    }
}

/// W4 to a cluster end to end: producers → agent → 3 nodes, with the leader killed a third
/// of the way through and started again; the bench reads every producer's messages back
/// and fails on one lost or written twice.
#[test]
fn bench_pipeline_to_a_cluster_through_a_leader_kill() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "bench",
            "pipeline",
            "--target",
            "cluster",
            "--producers",
            "2",
        ])
        .args([
            "--messages",
            "600",
            "--message-bytes",
            "100",
            "--outage",
            "1",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = ok(output);
    assert!(stdout.contains("tidemark cluster"), "{stdout}");
    let csv = std::fs::read_to_string(out.path().join("pipeline.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|r| r.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "a step and its outage step: {csv}");
    for row in &rows {
        assert_eq!(row[0], "tidemark cluster", "{csv}");
        assert_eq!(row[3], "1200", "every message counted: {csv}");
        assert_eq!((row[11], row[12]), ("0", "0"), "lost, duplicated: {csv}");
    }
    assert_eq!(rows[1][2], "1", "the outage step: {csv}");
}

/// `cluster up` on ports another cluster holds must fail with the node's error, not claim
/// the other cluster as its own.
#[test]
fn cluster_up_fails_when_its_nodes_cannot_start() {
    let base = tempfile::tempdir().unwrap();
    // Ports of this test's own, apart from the other tests' clusters.
    let port = "27300";
    let up = |dir: &str, stderr: Stdio| {
        Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args([
                "cluster",
                "up",
                "--nodes",
                "1",
                "--base-port",
                port,
                "--data-dir",
            ])
            .arg(base.path().join(dir))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap()
    };
    let wait = |child: &mut std::process::Child, what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} did not finish"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let mut first = up("first", Stdio::null());
    // The first cluster is up once it says so on its standard output.
    let mut stdout = first.stdout.take().unwrap();
    let mut said = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&said).contains("up;") {
        use std::io::Read;
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "the first cluster did not start"
        );
        said.push(byte[0]);
    }
    let mut second = up("second", Stdio::piped());
    let status = wait(&mut second, "the second cluster up");
    let mut stderr = String::new();
    use std::io::Read;
    second
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    // SAFETY: kill(2) on a child process this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    wait(&mut first, "stopping the first cluster");
    assert!(
        !status.success(),
        "the second cluster up succeeded: {stderr}"
    );
    assert!(stderr.contains("exited"), "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
}

/// `cluster up`, stopped as a user stops it (SIGTERM, which it passes on to its nodes)
/// when the test ends, a failing one too: a SIGKILL would leave its nodes running.
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child process this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while matches!(self.0.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines `from` sends, as they come, on a channel.
fn lines_of(from: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lines of `rx` up to and including the first that `wanted` accepts, within 60 s.
fn lines_until(
    rx: &std::sync::mpsc::Receiver<String>,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = wanted(&line);
                seen.push(line);
                if done {
                    return seen;
                }
            }
            Err(e) => panic!("no line {what} ({e}); seen: {seen:#?}"),
        }
    }
}

/// Issue 43, item 8: `cluster up` labels each node's lines with its id, reports a node that
/// dies at once with its status and the command that starts it again (which works), reaps
/// it, and counts only the running nodes when it stops.
#[test]
fn cluster_up_labels_its_nodes_and_reports_one_that_dies() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("cluster");
    let mut up = Up(Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "cluster",
            "up",
            "--nodes",
            "3",
            "--base-port",
            "27400",
            "--data-dir",
        ])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap());
    let stdout = lines_of(up.0.stdout.take().unwrap());
    let stderr = lines_of(up.0.stderr.take().unwrap());
    let mut said = lines_until(&stdout, "saying the cluster is up", |l| {
        l.contains("Ctrl-C stops every node")
    });
    // The cluster is up once a majority is: a node's own "serving" line may come after.
    for id in 1..=3 {
        let serving = format!("node {id} | tidemark serving");
        if !said.iter().any(|l| l.starts_with(&serving)) {
            said.extend(lines_until(&stdout, &serving, |l| l.starts_with(&serving)));
        }
    }
    // Every node logs to standard error (at least "tidemark is serving"): each line labelled.
    let logged: Vec<String> = stderr.try_iter().collect();
    assert!(!logged.is_empty(), "the nodes logged nothing");
    let labelled = |l: &String| {
        ["node 1 | ", "node 2 | ", "node 3 | "]
            .iter()
            .any(|p| l.starts_with(p))
    };
    assert!(logged.iter().all(labelled), "{logged:#?}");

    // Node 2's process, found among `up`'s children by its arguments.
    let up_pid = up.0.id();
    let children =
        std::fs::read_to_string(format!("/proc/{up_pid}/task/{up_pid}/children")).unwrap();
    let node_2: i32 = children
        .split_whitespace()
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.windows(2).any(|w| w == [&b"--node-id"[..], &b"2"[..]])
        })
        .unwrap_or_else(|| panic!("no node 2 among {children:?}"))
        .parse()
        .unwrap();
    // SAFETY: kill(2) on a grandchild process this test started.
    unsafe { libc::kill(node_2, libc::SIGKILL) };
    let said = lines_until(&stdout, "reporting node 2's exit", |l| {
        l.starts_with("node 2 exited")
    });
    let report = said.last().unwrap();
    assert!(
        report.contains("SIGKILL") || report.contains("signal: 9"),
        "{report}"
    );
    let restart = stdout
        .recv_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    assert!(
        restart.contains(" serve --node-id 2 --cluster-config "),
        "{restart}"
    );
    // Reaped: no zombie left behind (a zombie's /proc entry says state Z).
    let stat = std::fs::read_to_string(format!("/proc/{node_2}/stat")).unwrap_or_default();
    assert!(!stat.contains(") Z "), "node 2 is a zombie: {stat}");

    // The printed command starts node 2 again on its data.
    let mut again = Stopped(
        Command::new("sh")
            // `exec`: the node is the process that `stop` kills, not a shell above it.
            .args(["-c", &format!("exec {}", restart.trim())])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let again_said = lines_of(again.0.stdout.take().unwrap());
    let line = again_said
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(line.contains("as cluster node 2"), "{line}");
    again.stop();

    // SAFETY: kill(2) on a child process this test started.
    unsafe { libc::kill(up_pid as i32, libc::SIGINT) };
    lines_until(&stdout, "saying how many nodes it stops", |l| {
        l == "stopping 2 running nodes"
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = up.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cluster up did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// A server process, killed when the test ends (a failing one too).
struct Stopped(std::process::Child);

impl Stopped {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server holds its data directory: the CLI says so and points at `--server`, and talks
/// to it over TLS when given the CA. Read commands never create a database at a wrong path.
#[test]
fn the_cli_reaches_a_tls_server_and_never_opens_its_directory_behind_its_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    ok(tidemark(
        &dir,
        &["streams", "create", "s", "--schema", "N:LONG"],
        None,
    ));
    ok(tidemark(
        &dir,
        &["put", "s"],
        Some("{\"tstart\": 1, \"N\": 5}\n"),
    ));

    let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tidemark-server/tests/tls");
    let (http, binary) = (free_port(), free_port());
    let server = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["serve", "--http", &format!("127.0.0.1:{http}")])
        .args(["--binary", &format!("127.0.0.1:{binary}")])
        .arg("--tls-cert")
        .arg(tls.join("cert.pem"))
        .arg("--tls-key")
        .arg(tls.join("key.pem"))
        .arg("--data-dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Stopped(server);
    let url = format!("https://localhost:{http}");
    let ca = tls.join("ca.pem");
    let query = |extra: &[&str]| {
        let mut args = vec!["query", "--format", "csv", "--server", &url];
        args.extend_from_slice(extra);
        args.push("SELECT count(*), sum(N) FROM s");
        tidemark(&tmp.path().join("unused"), &args, None)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let answer = loop {
        let out = query(&["--ca", ca.to_str().unwrap()]);
        if out.status.success() || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let csv = ok(answer);
    assert_eq!(csv, "count(*),sum(N)\n1,5\n");
    // Without the CA the server's certificate is not trusted.
    let err = fails(query(&[]));
    assert!(err.contains(&url), "{err}");

    let err = fails(tidemark(&dir, &["streams", "list"], None));
    assert!(err.contains("in use") && err.contains("--server"), "{err}");
    // Commands that have no --server say what works for them instead (issue 43, 6): the
    // advice never names an option the command then refuses.
    for args in [&["verify"][..], &["demo", "--events", "10"]] {
        let err = fails(tidemark(&dir, args, None));
        assert!(
            err.contains("in use") && err.contains("stop it") && !err.contains("--server"),
            "{args:?}: {err}"
        );
    }

    // Every command that reads or changes streams goes through the server with --server.
    let unused = tmp.path().join("unused");
    let remote = |args: &[&str], stdin: Option<&str>| {
        let mut all = args.to_vec();
        all.extend(["--server", &url, "--ca", ca.to_str().unwrap()]);
        tidemark(&unused, &all, stdin)
    };
    ok(remote(
        &["streams", "create", "t", "--schema", "N:LONG"],
        None,
    ));
    let events =
        "{\"tstart\": 10, \"N\": 1}\n{\"tstart\": 20, \"N\": 2}\n{\"tstart\": 30, \"N\": 3}\n";
    assert!(ok(remote(&["put", "t"], Some(events))).contains("stored 3 events"));
    assert_eq!(ok(remote(&["streams", "list"], None)), "s\nt\n");
    assert!(ok(remote(&["streams", "info", "t"], None)).contains("events:      3"));
    let through_server = ok(remote(&["scan", "t"], None));
    assert_eq!(through_server.lines().count(), 3, "{through_server}");
    let csv = ok(remote(
        &[
            "scan", "t", "--format", "csv", "--where", "N > 1", "--from", "15",
        ],
        None,
    ));
    assert_eq!(csv, "tstart,tend,N\n20,,2\n30,,3\n");
    let agg = ok(remote(
        &[
            "agg", "t", "--fn", "max:N", "--fn", "count", "--format", "jsonl",
        ],
        None,
    ));
    assert_eq!(agg, "{\"max(N)\":3,\"count(*)\":3}\n");
    // Buckets through the server print as on the directory: nanoseconds in JSON lines.
    let buckets = ok(remote(
        &[
            "agg", "t", "--fn", "count", "--bucket", "10ns", "--format", "jsonl",
        ],
        None,
    ));
    assert_eq!(
        buckets,
        "{\"bucket\":10,\"count(*)\":1}\n{\"bucket\":20,\"count(*)\":1}\n{\"bucket\":30,\"count(*)\":1}\n"
    );
    let set = ok(remote(
        &["streams", "retention", "t", "--max-bytes", "1000000000"],
        None,
    ));
    assert!(set.contains("max 1000000000 bytes"), "{set}");
    ok(remote(&["streams", "drop", "s"], None));
    server.stop();
    // What the server printed is what the command prints on the directory.
    assert_eq!(ok(tidemark(&dir, &["scan", "t"], None)), through_server);
    assert_eq!(ok(tidemark(&dir, &["streams", "list"], None)), "t\n");

    let typo = tmp.path().join("tyop");
    for args in [
        &["streams", "list"][..],
        &["streams", "info", "s"],
        &["scan", "s"],
        &["query", "SELECT 1 FROM s"],
        &["verify"],
    ] {
        let err = fails(tidemark(&typo, args, None));
        assert!(err.contains("there is no database at"), "{args:?}: {err}");
    }
    assert!(!typo.exists(), "a read command created {}", typo.display());
}

/// One rule for times: RFC 3339 (UTC without a zone) or nanoseconds wherever a time is
/// typed; RFC 3339 where people read, nanoseconds where programs do unless asked.
#[test]
fn times_are_written_and_read_as_rfc3339_or_nanoseconds_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir, "s", "N:LONG");
    let empty_csv = ok(tidemark(dir, &["scan", "s", "--format", "csv"], None));
    assert_eq!(empty_csv, "tstart,tend,N\n");

    let noon = 1_767_268_800_000_000_000i64; // 2026-01-01T12:00:00Z
    let jsonl = "{\"tstart\": \"2026-01-01T12:00:00Z\", \"N\": 1}\n\
                 {\"tstart\": \"2026-01-01 13:00:00\", \"N\": 2}\n";
    ok(tidemark(dir, &["put", "s"], Some(jsonl)));
    let csv_file = dir.join("more.csv");
    std::fs::write(
        &csv_file,
        format!(
            "tstart,N\n2026-01-01T14:00:00+01:00,3\n{},4\n",
            noon + 3 * 3_600_000_000_000
        ),
    )
    .unwrap();
    ok(tidemark(
        dir,
        &["put", "s", csv_file.to_str().unwrap()],
        None,
    ));

    let scanned = ok(tidemark(
        dir,
        &[
            "scan",
            "s",
            "--from",
            "2026-01-01 12:30",
            "--to",
            "2026-01-01T15:00:00.000000001Z",
        ],
        None,
    ));
    let hour = 3_600_000_000_000i64;
    assert_eq!(
        scanned,
        format!(
            "{{\"tstart\":{},\"N\":2}}\n{{\"tstart\":{},\"N\":3}}\n{{\"tstart\":{},\"N\":4}}\n",
            noon + hour,
            noon + hour,
            noon + 3 * hour
        ),
    );
    let people = ok(tidemark(
        dir,
        &[
            "scan", "s", "--limit", "1", "--time", "rfc3339", "--format", "csv",
        ],
        None,
    ));
    assert_eq!(people, "tstart,tend,N\n2026-01-01T12:00:00Z,,1\n");

    let table = ok(tidemark(
        dir,
        &[
            "query",
            "SELECT ts, N FROM s WHERE ts >= '2026-01-01 15:00:00'",
        ],
        None,
    ));
    assert!(table.contains("2026-01-01T15:00:00Z"), "{table}");
    let raw = ok(tidemark(
        dir,
        &["query", "--format", "csv", "SELECT ts FROM s WHERE N = 4"],
        None,
    ));
    assert_eq!(raw, format!("ts\n{}\n", noon + 3 * hour));

    // agg follows the same rule and takes the same --time (issue 43, 7).
    let agg = |extra: &[&str]| {
        let mut args = vec!["agg", "s", "--fn", "count", "--bucket", "1h"];
        args.extend_from_slice(extra);
        ok(tidemark(dir, &args, None))
    };
    assert_eq!(
        agg(&["--format", "jsonl"]).lines().next(),
        Some(format!("{{\"bucket\":{noon},\"count(*)\":1}}").as_str())
    );
    assert_eq!(
        agg(&["--format", "jsonl", "--time", "rfc3339"])
            .lines()
            .next(),
        Some("{\"bucket\":\"2026-01-01T12:00:00Z\",\"count(*)\":1}")
    );
    let table = agg(&[]);
    assert!(table.contains("2026-01-01T12:00:00Z"), "{table}");
    assert!(
        agg(&["--time", "ns"]).contains(&noon.to_string()),
        "{table}"
    );

    let err = fails(tidemark(dir, &["scan", "s", "--from", "2026-02-30"], None));
    assert!(err.contains("not an RFC 3339 time"), "{err}");
}

#[test]
fn a_backfill_is_refused_with_a_way_out_and_taken_once_the_window_is_widened() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir, "s", "N:LONG");
    ok(tidemark(
        dir,
        &["put", "s"],
        Some(r#"{"tstart": "2026-11-20T10:00:00Z", "N": 1}"#),
    ));
    let backfill = r#"{"tstart": "2026-11-01T10:00:00Z", "N": 2}"#;
    let refused = fails(tidemark(dir, &["put", "s"], Some(backfill)));
    assert!(
        refused.contains("streams window s --set"),
        "the refusal says how to widen the window: {refused}"
    );
    let shown = ok(tidemark(dir, &["streams", "window", "s"], None));
    assert!(shown.contains("1h (the database's default)"), "{shown}");
    let set = ok(tidemark(
        dir,
        &["streams", "window", "s", "--set", "30d"],
        None,
    ));
    assert!(set.contains("30d (the stream's own)"), "{set}");
    ok(tidemark(dir, &["put", "s"], Some(backfill)));
    let info = ok(tidemark(dir, &["streams", "info", "s"], None));
    assert!(info.contains("events:      2"), "{info}");
    assert!(info.contains("window:      30d"), "{info}");
    let bad = fails(tidemark(
        dir,
        &["streams", "window", "s", "--set", "soon"],
        None,
    ));
    assert!(bad.contains("invalid out-of-order window"), "{bad}");
}

/// Issue 43 (1): a stream's partition is set when it is created, shown by `streams info`,
/// and a duration that is no partition is refused naming the allowed ones.
#[test]
fn a_stream_is_created_with_its_partition_and_shows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir, "daily", "N:LONG");
    let info = ok(tidemark(dir, &["streams", "info", "daily"], None));
    assert!(info.contains("partition:   1d"), "{info}");
    let args = ["streams", "create", "hourly", "--schema", "N:LONG"];
    ok(tidemark(
        dir,
        &[&args[..], &["--partition", "6h"]].concat(),
        None,
    ));
    let info = ok(tidemark(dir, &["streams", "info", "hourly"], None));
    assert!(info.contains("partition:   6h"), "{info}");
    // Again with another partition: the stream keeps its own.
    let again = fails(tidemark(dir, &args, None));
    assert!(
        again.contains("already exists with partition 6h"),
        "{again}"
    );
    // A duration that is no partition, and text that is no duration at all: both are told
    // what a partition may be.
    for text in ["5h", "abc", "1.5d", "0"] {
        let bad = fails(tidemark(
            dir,
            &[
                "streams",
                "create",
                "odd",
                "--schema",
                "N:LONG",
                "--partition",
                text,
            ],
            None,
        ));
        assert!(bad.contains("invalid partition"), "{text}: {bad}");
        assert!(bad.contains("whole hours"), "{text}: {bad}");
    }
    assert!(fails(tidemark(dir, &["streams", "info", "odd"], None)).contains("odd"));
}

/// Issue 43 (10): the command `demo` suggests runs on the directory the demo wrote, pasted
/// as printed from another working directory.
#[test]
fn the_demos_follow_up_command_runs_as_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo dir");
    let out = ok(tidemark(&dir, &["demo", "--events", "3000"], None));
    let command = out
        .lines()
        .find_map(|l| l.strip_prefix("try: "))
        .unwrap_or_else(|| panic!("no follow-up in {out}"));
    assert!(command.contains("--data-dir"), "{command}");
    let bin = Path::new(env!("CARGO_BIN_EXE_tidemark")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let elsewhere = tempfile::tempdir().unwrap();
    let ran = Command::new("sh")
        .args(["-c", command])
        .current_dir(elsewhere.path())
        .env("PATH", path)
        .output()
        .unwrap();
    let printed = ok(ran);
    assert!(printed.contains("max(LASTTRADEPRICE)"), "{printed}");
    // It read the demo's events, and created nothing where it ran.
    assert!(printed.lines().count() > 2, "{printed}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

/// `tidemark tail`: events after a position as `scan` prints them, on a data directory and
/// through a server; followed as they are appended; resumed by a consumer's name after what
/// it printed before it was stopped.
#[test]
fn tail_prints_after_a_position_follows_and_resumes_by_consumer() {
    let dir = tempfile::tempdir().unwrap();
    create(dir.path(), "t", "V:LONG");
    let lines: String = (0..5)
        .map(|i| format!("{{\"tstart\": {i}, \"V\": {i}}}\n"))
        .collect();
    ok(tidemark(dir.path(), &["put", "t"], Some(&lines)));
    let printed = ok(tidemark(dir.path(), &["tail", "t", "--after", "2"], None));
    assert_eq!(printed, "{\"tstart\":3,\"V\":3}\n{\"tstart\":4,\"V\":4}\n");
    let printed = ok(tidemark(
        dir.path(),
        &["tail", "t", "--limit", "1", "--positions"],
        None,
    ));
    assert_eq!(
        printed,
        "{\"position\":0,\"event\":{\"tstart\":0,\"V\":0}}\n"
    );
    let refused = fails(tidemark(dir.path(), &["tail", "t", "--follow"], None));
    assert!(refused.contains("--server"), "{refused}");

    let mut server = Up(Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--binary",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let banner = lines_of(server.0.stdout.take().unwrap());
    let first = lines_until(&banner, "with the server's address", |l| l.contains("HTTP"));
    let words: Vec<&str> = first[0].split_whitespace().collect();
    let at = words.iter().position(|w| *w == "HTTP").unwrap();
    let url = words[at + 1].to_string();

    let mut tail = Up(Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["tail", "t", "--follow", "--consumer", "c", "--server", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let followed = lines_of(tail.0.stdout.take().unwrap());
    let seen = lines_until(&followed, "of what was there", |l| l.contains("\"V\":4"));
    assert_eq!(seen.len(), 5, "{seen:?}");
    let put = |from: i64, to: i64| {
        let lines: String = (from..to)
            .map(|i| format!("{{\"tstart\": {i}, \"V\": {i}}}\n"))
            .collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["put", "t", "--server", &url])
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
    };
    put(5, 8);
    let seen = lines_until(&followed, "of an append", |l| l.contains("\"V\":7"));
    assert_eq!(seen.len(), 3, "{seen:?}");
    // Its position is committed at least every second while it prints.
    let client = tidemark_client::HttpClient::new(&url, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while client
        .request("GET", "/v1/streams/t/consumers/c", None)
        .map(|c| c["position"] == 7)
        .ok()
        != Some(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "position 7 never committed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(tail);
    put(8, 10);
    let resumed = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["tail", "t", "--consumer", "c", "--server", &url])
        .output()
        .unwrap();
    assert_eq!(
        ok(resumed),
        "{\"tstart\":8,\"V\":8}\n{\"tstart\":9,\"V\":9}\n"
    );
    server.0.kill().unwrap();
}

/// `bench sql` runs every query on a server and on DuckDB (the venv's, as `make test` names
/// it in TIDEMARK_TEST_PYTHON) with row counts that agree, and writes each one's times and
/// ratio. (Tiny sizes: what is checked is the harness, not the figures.)
#[test]
fn bench_sql_times_every_query_beside_duckdb() {
    let python = std::env::var("TIDEMARK_TEST_PYTHON").expect(
        "TIDEMARK_TEST_PYTHON names a Python with duckdb and the tidemark package \
         (`make test` sets it)",
    );
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["bench", "sql", "--trades", "3000", "--quotes", "600"])
        .args(["--repeat", "1", "--python", &python, "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = ok(output);
    let csv = std::fs::read_to_string(out.path().join("sql.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|r| r.split(',').collect())
        .collect();
    assert!(rows.len() >= 20, "{csv}\n{stdout}");
    for row in &rows {
        let [_, ours, theirs, ratio, _] = row[..] else {
            panic!("{row:?} in {csv}");
        };
        for value in [ours, theirs, ratio] {
            assert!(value.parse::<f64>().unwrap() > 0.0, "{row:?}");
        }
    }
    assert!(rows.iter().any(|r| r[0] == "exists"), "{csv}");
    let summary = std::fs::read_to_string(out.path().join("summary.csv")).unwrap();
    assert!(summary.contains("worst_ratio_to_duckdb"), "{summary}");
}
