//! `tidemark bench lines`: W1's events as InfluxDB line protocol over HTTP, to Tidemark and
//! to the peers that take it (QuestDB's ILP/HTTP endpoint, InfluxDB 1.6), in one run.

use std::path::PathBuf;

use crate::chart::{self, Bar};
use crate::lines::{bodies, post_all, LineEndpoint};
use crate::peers::influxdb::InfluxDb;
use crate::peers::questdb::{CommitMode, QuestDb};
use crate::peers::{parse_selection, Skipped};
use crate::process::cpu_seconds;
use crate::stats::median;
use crate::summary::{append_summary, Figure};
use crate::w1;
use anyhow::{bail, Context, Result};
use tidemark_client::HttpClient;
use tidemark_query::time::now_ns;

use super::with_server_process;

const PEERS: [&str; 2] = ["questdb", "influxdb"];

#[derive(clap::Args)]
pub struct LinesArgs {
    /// Events per trial [default: 1000000; with --quick: 200000].
    #[arg(long)]
    events: Option<usize>,
    /// Trials per system [default: 3; with --quick: 2].
    #[arg(long)]
    trials: Option<usize>,
    /// Smaller defaults: the run takes a minute or two.
    #[arg(long)]
    quick: bool,
    /// Lines per request.
    #[arg(long, default_value_t = 5_000)]
    lines_per_request: usize,
    /// Connections posting at once.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Peers to run next to Tidemark: questdb, influxdb, all or none. A peer that is not
    /// installed is skipped with the reason (peers/install.sh questdb; apt-get install
    /// influxdb).
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for lines.csv, lines.png and summary.csv.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

/// One trial's outcome.
struct Trial {
    system: &'static str,
    trial: usize,
    seconds: f64,
    /// CPU time the system's server process spent in the trial (user and system): on two
    /// shared cores the sender takes its part, so events/s alone would flatter whoever
    /// needs less of the client.
    cpu_seconds: Option<f64>,
}

impl LinesArgs {
    /// The defaults of `bench lines`, for `bench all`: of `peers`, those this workload has.
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> LinesArgs {
        let peers = match peers.trim() {
            "all" | "none" => peers.trim().to_string(),
            list => {
                let ours: Vec<&str> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|p| PEERS.contains(p))
                    .collect();
                if ours.is_empty() {
                    "none".into()
                } else {
                    ours.join(",")
                }
            }
        };
        LinesArgs {
            events: None,
            trials: None,
            quick,
            lines_per_request: 5_000,
            connections: 4,
            peers,
            out,
        }
    }

    fn events(&self) -> usize {
        self.events
            .unwrap_or(if self.quick { 200_000 } else { 1_000_000 })
    }

    fn trials(&self) -> usize {
        self.trials.unwrap_or(if self.quick { 2 } else { 3 })
    }
}

pub fn run(args: LinesArgs) -> Result<()> {
    // "all" is this workload's peers, not every peer the harness knows.
    let peers = match args.peers.trim() {
        "all" => PEERS.map(String::from).to_vec(),
        selection => parse_selection(selection).map_err(anyhow::Error::msg)?,
    };
    if let Some(unknown) = peers.iter().find(|p| !PEERS.contains(&p.as_str())) {
        bail!("bench lines has no peer {unknown:?}: say questdb, influxdb, all or none");
    }
    let (events, trials) = (args.events(), args.trials());
    if events == 0 || trials == 0 || args.lines_per_request == 0 || args.connections == 0 {
        bail!("--events, --trials, --lines-per-request and --connections must be above 0");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    println!(
        "bench lines: {events} W1 events per trial as line protocol, {} lines per request, \
         {} connections, {trials} trials per system",
        args.lines_per_request, args.connections
    );
    let batches = w1::generate(events, 10_000, now_ns(), 42);
    // Each trial writes its own measurement: nothing to clear between trials.
    let measurement = |trial: usize| format!("w1_lines_{trial}");
    let prepare = |trial| bodies(&batches, &measurement(trial), args.lines_per_request);
    let mut results: Vec<Trial> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut run_trials = |system: &'static str,
                          pid: Option<u32>,
                          endpoint: &LineEndpoint,
                          count: &dyn Fn(&str) -> Result<u64, String>|
     -> Result<()> {
        for trial in 1..=trials {
            let bodies = prepare(trial).map_err(anyhow::Error::msg)?;
            let cpu_before = pid.and_then(cpu_seconds);
            let took = post_all(endpoint, &bodies, args.connections)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("{system}, trial {trial}"))?;
            let cpu = pid
                .and_then(cpu_seconds)
                .zip(cpu_before)
                .map(|(after, before)| after - before);
            // Acknowledged is durable; visible may come later (QuestDB applies its WAL to
            // the table after the answer): wait for every event, outside the timed part.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            let held = loop {
                let held = count(&measurement(trial)).map_err(anyhow::Error::msg)?;
                if held >= events as u64 || std::time::Instant::now() > deadline {
                    break held;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            if held != events as u64 {
                bail!("{system}, trial {trial}: {events} events acknowledged, {held} held");
            }
            let rate = events as f64 / took.as_secs_f64();
            let cpu_text = cpu.map_or(String::new(), |c| format!(", server CPU {c:.2} s"));
            println!("  {system:<10} trial {trial}: {took:.2?}, {rate:.0} events/s{cpu_text}");
            results.push(Trial {
                system,
                trial,
                seconds: took.as_secs_f64(),
                cpu_seconds: cpu,
            });
        }
        Ok(())
    };
    with_server_process(&args.out.join("data"), |target| {
        let mut headers = Vec::new();
        if let Some(token) = &target.token {
            headers.push(("Authorization".to_string(), format!("Bearer {token}")));
        }
        let endpoint = LineEndpoint {
            url: format!("{}/write?precision=ns", target.http),
            headers,
        };
        let client = HttpClient::new(&target.http, target.token.as_deref());
        let count = |stream: &str| -> Result<u64, String> {
            let query = serde_json::json!({ "sql": format!("SELECT count(*) FROM {stream}") });
            client
                .request(
                    "POST",
                    "/v1/query",
                    Some(("application/json", query.to_string().into_bytes())),
                )
                .map_err(|e| e.to_string())
                .and_then(|answer| {
                    answer["rows"][0][0]
                        .as_u64()
                        .ok_or_else(|| format!("unexpected answer {answer}"))
                })
        };
        run_trials("tidemark", target.pid, &endpoint, &count)
    })?;
    for peer in &peers {
        let dir = args.out.join(format!("data-{peer}"));
        let outcome = match peer.as_str() {
            "questdb" => match QuestDb::start(&dir, CommitMode::Sync) {
                Ok(questdb) => run_trials(
                    "questdb",
                    Some(questdb.pid()),
                    &questdb.line_endpoint(),
                    &|t| questdb.count(t),
                ),
                Err(skip) => {
                    skipped.push(skip);
                    Ok(())
                }
            },
            _ => match InfluxDb::start(&dir) {
                Ok(influx) => run_trials(
                    "influxdb",
                    Some(influx.pid()),
                    &influx.line_endpoint(),
                    &|m| influx.count(m),
                ),
                Err(skip) => {
                    skipped.push(skip);
                    Ok(())
                }
            },
        };
        std::fs::remove_dir_all(&dir).ok();
        outcome?;
    }
    for skip in &skipped {
        println!("  skipped {skip}");
    }
    report(&args, events, &results)
}

/// lines.csv (every trial), summary.csv (each system's median) and lines.png.
fn report(args: &LinesArgs, events: usize, results: &[Trial]) -> Result<()> {
    let mut csv = String::from(
        "system,trial,events,lines_per_request,connections,seconds,events_per_second,\
         server_cpu_seconds\n",
    );
    for t in results {
        let cpu = t.cpu_seconds.map_or(String::new(), |c| format!("{c:.3}"));
        csv.push_str(&format!(
            "{},{},{events},{},{},{:.6},{:.0},{cpu}\n",
            t.system,
            t.trial,
            args.lines_per_request,
            args.connections,
            t.seconds,
            events as f64 / t.seconds
        ));
    }
    let csv_path = args.out.join("lines.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let variant = format!(
        "{events} events, {} lines/request, {} connections, acknowledged durable",
        args.lines_per_request, args.connections
    );
    let mut figures = Vec::new();
    let mut bars = Vec::new();
    let mut systems: Vec<&str> = results.iter().map(|t| t.system).collect();
    systems.dedup();
    for (group, system) in systems.iter().enumerate() {
        let rates: Vec<f64> = results
            .iter()
            .filter(|t| t.system == *system)
            .map(|t| events as f64 / t.seconds)
            .collect();
        let Some(rate) = median(&rates) else { continue };
        figures.push(Figure::new(
            "lines",
            system,
            &variant,
            "median_events_per_second",
            rate.round(),
            "events/s",
        ));
        // Server CPU per million events: what the same rate would cost on a machine whose
        // client runs elsewhere.
        let cpu: Vec<f64> = results
            .iter()
            .filter(|t| t.system == *system)
            .filter_map(|t| t.cpu_seconds)
            .map(|c| c * 1e6 / events as f64)
            .collect();
        if let Some(cpu) = median(&cpu) {
            figures.push(Figure::new(
                "lines",
                system,
                &variant,
                "median_server_cpu_seconds_per_million_events",
                (cpu * 1000.0).round() / 1000.0,
                "s",
            ));
        }
        bars.push(Bar {
            label: system.to_string(),
            group,
            value: rate,
        });
    }
    // Each figure beside Tidemark's: how many times Tidemark's rate, or its CPU per event.
    for figure in &figures {
        let Some(tidemark) = figures
            .iter()
            .find(|f| f.system == "tidemark" && f.metric == figure.metric)
        else {
            continue;
        };
        println!(
            "{:<10} {:<46} {:>12} {:>6.2}× Tidemark's",
            figure.system,
            figure.metric,
            figure.value,
            figure.value / tidemark.value
        );
    }
    append_summary(&args.out, &figures).context("writing summary.csv")?;
    let chart_path = args.out.join("lines.png");
    chart::draw_bars(
        &chart_path,
        &format!("Line protocol over HTTP: {variant}"),
        "events/s (median)",
        &bars,
    )?;
    println!(
        "wrote {}, {} and summary.csv",
        csv_path.display(),
        chart_path.display()
    );
    Ok(())
}
