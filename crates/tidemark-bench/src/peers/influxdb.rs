//! InfluxDB 1.6 (Debian's `influxdb` package) as a `bench lines` peer: started on free
//! loopback ports over a fresh directory, one database `bench`, written through its 1.x
//! `/write` route. Its WAL is fsync'd before each write is answered (`wal-fsync-delay`
//! left at its default, 0s): an acknowledged write is durable, as Tidemark's.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tidemark_client::{percent_encode, HttpClient};

use super::{find_program, free_port, PeerProcess, Skipped};
use crate::lines::LineEndpoint;

const DATABASE: &str = "bench";

pub struct InfluxDb {
    _process: PeerProcess,
    http_addr: SocketAddr,
    http: HttpClient,
}

impl InfluxDb {
    pub fn start(dir: &Path) -> Result<InfluxDb, Skipped> {
        let skip = |reason: String| Skipped::new("influxdb", reason);
        let influxd = find_program("influxd")
            .ok_or_else(|| skip("influxd is not installed (apt-get install influxdb)".into()))?;
        let port = || free_port().map_err(|e| skip(e.to_string()));
        let (http_port, rpc_port) = (port()?, port()?);
        std::fs::create_dir_all(dir).map_err(|e| skip(e.to_string()))?;
        let root = dir.display();
        let config = format!(
            "reporting-disabled = true\nbind-address = \"127.0.0.1:{rpc_port}\"\n\
             [meta]\ndir = \"{root}/meta\"\n\
             [data]\ndir = \"{root}/data\"\nwal-dir = \"{root}/wal\"\nquery-log-enabled = false\n\
             [http]\nbind-address = \"127.0.0.1:{http_port}\"\nlog-enabled = false\n\
             max-body-size = 0\n\
             [monitor]\nstore-enabled = false\n[continuous_queries]\nenabled = false\n"
        );
        let config_path = dir.join("influxdb.conf");
        std::fs::write(&config_path, config).map_err(|e| skip(e.to_string()))?;
        let mut command = Command::new(influxd);
        command.arg("-config").arg(&config_path);
        let http_addr = SocketAddr::from(([127, 0, 0, 1], http_port));
        let process = PeerProcess::start(
            "influxdb",
            command,
            &dir.join("influxdb.log"),
            http_addr,
            Duration::from_secs(30),
        )?;
        let influx = InfluxDb {
            _process: process,
            http_addr,
            http: HttpClient::new(&format!("http://{http_addr}"), None),
        };
        influx
            .query(&format!("CREATE DATABASE {DATABASE}"))
            .map_err(skip)?;
        Ok(influx)
    }

    pub fn pid(&self) -> u32 {
        self._process.pid()
    }

    pub fn line_endpoint(&self) -> LineEndpoint {
        LineEndpoint {
            url: format!("http://{}/write?db={DATABASE}&precision=n", self.http_addr),
            headers: Vec::new(),
        }
    }

    fn query(&self, q: &str) -> Result<serde_json::Value, String> {
        self.http
            .request(
                "POST",
                &format!("/query?db={DATABASE}&q={}", percent_encode(q)),
                None,
            )
            .map_err(|e| e.to_string())
    }

    /// Points in `measurement` (0 when it does not exist).
    pub fn count(&self, measurement: &str) -> Result<u64, String> {
        let answer = self.query(&format!(
            "SELECT count(SECURITYTYPE) FROM \"{measurement}\""
        ))?;
        let series = &answer["results"][0]["series"];
        if series.is_null() {
            return Ok(0);
        }
        series[0]["values"][0][1]
            .as_u64()
            .ok_or_else(|| format!("unexpected answer {answer}"))
    }

    /// Drops `measurement` (between trials).
    pub fn drop_measurement(&self, measurement: &str) -> Result<(), String> {
        self.query(&format!("DROP MEASUREMENT \"{measurement}\""))
            .map(|_| ())
            .or_else(|e| {
                if e.contains("not found") {
                    Ok(())
                } else {
                    Err(e)
                }
            })
    }
}
