//! `bench lines`: W1's events as InfluxDB line protocol, posted in requests of a few thousand
//! lines over several connections, to every system that takes line protocol over HTTP
//! (Tidemark's `/write`, QuestDB's ILP/HTTP endpoint, InfluxDB 1.6's `/write`). A trial is
//! timed from the first request until the last one is acknowledged; each system's
//! acknowledgement means what its docs say (Tidemark: fsync'd; QuestDB with
//! `cairo.commit.mode=sync`: committed and fsync'd; InfluxDB 1.6: in its WAL, fsync'd
//! before the answer with the default `wal-fsync-delay = 0s`). Afterwards each system is
//! asked how many events it holds, so a trial that lost events fails.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tidemark_core::EventBatch;

/// One W1 event as a line: SYMBOL a tag, the two numbers fields, tstart in nanoseconds.
pub fn write_line(
    out: &mut Vec<u8>,
    measurement: &str,
    symbol: &[u8],
    security_type: i32,
    price: f32,
    ts: i64,
) {
    out.extend_from_slice(measurement.as_bytes());
    out.extend_from_slice(b",SYMBOL=");
    out.extend_from_slice(symbol);
    // Writing to a Vec cannot fail.
    let _ = writeln!(
        out,
        " SECURITYTYPE={security_type}i,LASTTRADEPRICE={price} {ts}"
    );
}

/// The events of `batches` as lines of `measurement`, in request bodies of
/// `lines_per_request` lines each (the last may have fewer). Made before a trial's clock
/// starts.
pub fn bodies(
    batches: &[EventBatch],
    measurement: &str,
    lines_per_request: usize,
) -> Result<Vec<Vec<u8>>, String> {
    assert!(lines_per_request > 0, "a request holds at least one line");
    let mut bodies = Vec::new();
    let mut body = Vec::new();
    let mut lines = 0;
    for batch in batches {
        let (symbols, types, prices) = crate::w1::columns(batch).ok_or("not a W1 batch")?;
        for row in 0..batch.len() {
            write_line(
                &mut body,
                measurement,
                symbols.get(row),
                types[row],
                prices[row],
                batch.tstart()[row],
            );
            lines += 1;
            if lines == lines_per_request {
                bodies.push(std::mem::take(&mut body));
                lines = 0;
            }
        }
    }
    if lines > 0 {
        bodies.push(body);
    }
    Ok(bodies)
}

/// Where a system takes line protocol: a URL to POST to (path and query included) and the
/// headers it needs (a token).
#[derive(Debug, Clone)]
pub struct LineEndpoint {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

/// The longest a trial waits on one request refused for back-pressure before it gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// Posts every body to `endpoint` over `connections` connections (each takes the next body
/// not yet sent); returns the time until the last was acknowledged. A body refused with
/// 429 or 503 (back-pressure) is sent again after the server's `Retry-After` (or 100 ms);
/// any other answer than 2xx ends the trial with it.
pub fn post_all(
    endpoint: &LineEndpoint,
    bodies: &[Vec<u8>],
    connections: usize,
) -> Result<Duration, String> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..connections.max(1))
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .timeout_global(Some(GIVE_UP_AFTER))
                        .build()
                        .into();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = bodies.get(i) else {
                            return Ok(());
                        };
                        post_one(&agent, endpoint, body)?;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| "a sender thread panicked".to_string())??;
        }
        Ok(started.elapsed())
    })
}

fn post_one(agent: &ureq::Agent, endpoint: &LineEndpoint, body: &[u8]) -> Result<(), String> {
    let first = Instant::now();
    loop {
        let mut request = agent.post(&endpoint.url);
        for (name, value) in &endpoint.headers {
            request = request.header(name, value);
        }
        let mut answer = request
            .header("Content-Type", "text/plain; charset=utf-8")
            .send(body)
            .map_err(|e| format!("POST {}: {e}", endpoint.url))?;
        let status = answer.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let text = answer.body_mut().read_to_string().unwrap_or_default();
        if (status == 429 || status == 503) && first.elapsed() < GIVE_UP_AFTER {
            let wait = answer
                .headers()
                .get("Retry-After")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(Duration::from_millis(100), Duration::from_secs)
                // A trial gives up after GIVE_UP_AFTER whatever the server asks.
                .min(Duration::from_secs(5));
            std::thread::sleep(wait);
            continue;
        }
        let text: String = text.chars().take(300).collect();
        return Err(format!("POST {}: {status} {text}", endpoint.url));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_is_one_line_and_requests_hold_at_most_their_share() {
        let batches = crate::w1::generate(12_345, 1_000, 1_700_000_000_000_000_000, 7);
        let bodies = bodies(&batches, "m", 5_000).unwrap();
        assert_eq!(bodies.len(), 3);
        let lines: Vec<&str> = bodies
            .iter()
            .flat_map(|b| std::str::from_utf8(b).unwrap().lines())
            .collect();
        assert_eq!(lines.len(), 12_345);
        assert_eq!(bodies[2].iter().filter(|&&b| b == b'\n').count(), 2_345);
        // Every line parses as line protocol with the event's time, in order.
        let (symbols, types, prices) = crate::w1::columns(&batches[0]).unwrap();
        let expected = format!(
            "m,SYMBOL={} SECURITYTYPE={}i,LASTTRADEPRICE={} {}",
            std::str::from_utf8(symbols.get(0)).unwrap(),
            types[0],
            prices[0],
            batches[0].tstart()[0]
        );
        assert_eq!(lines[0], expected);
    }
}
