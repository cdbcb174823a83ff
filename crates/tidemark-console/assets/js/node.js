// The Node view: this server's role and, on a cluster, the Raft group as it sees it (term,
// leader, each node's matched index and lag); writes in flight, ingest rates, the fsync
// latency histogram and refusals by reason from `/metrics`; tiering. Refreshed every two
// seconds.

import { ApiError, getJson, request } from "./api.js";
import { bytes, count, duration, element, facts, rate, row } from "./format.js";
import * as metrics from "./metrics.js";
import { poller } from "./poll.js";

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
const polling = poller(refresh, POLL_MS);
let previous = null; // {at, events, bytes} of the last poll, for rates
/** Whether this server is in a cluster and tiers, once a showing has asked: asked again
 * each poll, a 404 would count among its refusals every two seconds. */
let clustered = null;
let tiers = null;

export function show() {
  clustered = null;
  tiers = null;
  polling.start();
}

export function hide() {
  polling.stop();
}

async function refresh() {
  await Promise.all([describeNode(), describeMetrics(), tiers === false ? null : describeTier()]);
}

async function describeNode() {
  try {
    const info = await getJson("/api/sys-info");
    const pairs = [["role", info.role === "standalone" ? "standalone (embedded: no cluster)" : info.role], ["node", info.nodeId], ["version", info.version],
      ["host", `${info.hostname} (${info.os})`], ["data directory", info.dataDirectory],
      ["up", duration(info.uptimeMs * 1e6)]];
    const cluster = clustered === false ? null : await clusterStatus();
    $("cluster-none").hidden = cluster !== null;
    $("cluster-table").hidden = cluster === null;
    if (cluster) {
      pairs.push(["raft state", cluster.state], ["term", cluster.term], ["leader", cluster.leader ?? "none known"],
        ["last log index", cluster.last_log_index ?? "—"], ["committed", cluster.committed ?? "—"],
        ["applied", cluster.applied ?? "—"], ["snapshot", cluster.snapshot ?? "—"]);
      $("cluster-table").tBodies[0].replaceChildren(...cluster.nodes.map((n) => row([
        n.id === cluster.leader ? `${n.id} (leader)` : String(n.id), n.voter ? "yes" : "no",
        n.matched ?? "—", n.lag ?? "—", n.unreachable_ms != null ? `${Math.round(n.unreachable_ms / 1000)} s` : "no",
        n.addrs.http,
      ], [2, 3])));
    }
    facts($("node-facts"), pairs);
  } catch (e) {
    facts($("node-facts"), [["error", e.message]]);
  }
}

/** `/v1/cluster`, or null on a server that runs embedded (remembered for this visit). */
async function clusterStatus() {
  try {
    const cluster = await getJson("/v1/cluster");
    clustered = true;
    return cluster;
  } catch (e) {
    if (!(e instanceof ApiError) || e.code !== "not_a_cluster") throw e;
    clustered = false;
    return null;
  }
}

async function describeMetrics() {
  let samples;
  try {
    samples = metrics.parse(await (await request("GET", "/metrics")).text());
  } catch (e) {
    facts($("ingest-facts"), [["error", e.message]]);
    return;
  }
  const now = performance.now();
  const events = metrics.value(samples, "tidemark_events_appended_total") ?? 0;
  const received = metrics.value(samples, "tidemark_append_bytes_received_total") ?? 0;
  const since = previous && (now - previous.at) / 1000;
  facts($("ingest-facts"), [
    ["events appended", count(events)],
    ["events per second", since ? rate((events - previous.events) / since) : "—"],
    ["bytes received per second", since ? `${bytes((received - previous.bytes) / since)}/s` : "—"],
    ["bytes in flight", bytes(metrics.value(samples, "tidemark_ingest_bytes_in_flight"))],
    ["requests in flight", count(metrics.value(samples, "tidemark_ingest_requests_in_flight"))],
    ["follows and long polls", count(metrics.value(samples, "tidemark_subscriptions"))],
    ["SQL queries running", count(metrics.value(samples, "tidemark_sql_queries_running"))],
  ]);
  previous = { at: now, events, bytes: received };
  fsyncHistogram(metrics.histogram(samples, "tidemark_log_fsync_seconds"));
  $("rejections").tBodies[0].replaceChildren(...(samples.get("tidemark_rejected_requests_total") || [])
    .map((s) => row([s.labels.reason, count(s.value)], [1])));
}

/** The histogram as labelled bars (a `meter`-like row per bucket: readable without colour). */
function fsyncHistogram(buckets) {
  const box = $("fsync-chart");
  const total = buckets.reduce((sum, b) => sum + b.count, 0);
  if (!total) {
    box.replaceChildren(element("p", "No fsync yet.", { class: "muted" }));
    return;
  }
  const top = Math.max(...buckets.map((b) => b.count));
  const table = element("table", null, { class: "histogram" });
  for (const b of buckets) {
    const label = b.le === Infinity ? "slower" : `≤ ${b.le * 1000 >= 1 ? `${+(b.le * 1000).toFixed(3)} ms` : `${+(b.le * 1e6).toFixed(0)} µs`}`;
    const bar = element("span", null, { class: "bar", "aria-hidden": "true" });
    bar.style.width = `${Math.round((b.count / top) * 240)}px`; // CSSOM: allowed by the page's CSP
    const tr = row([label, count(b.count), bar], [1]);
    table.append(tr);
  }
  box.replaceChildren(table);
}

async function describeTier() {
  try {
    const tier = await getJson("/v1/tier");
    tiers = true;
    facts($("tier-facts"), [
      ["bucket", tier.url], ["moves segments after", duration(tier.afterSeconds * 1e9)],
      ["tiered", `${bytes(tier.tieredBytes)} in ${count(tier.tieredSegments)} segments`],
      ["waiting", `${bytes(tier.pendingBytes)} in ${count(tier.pendingSegments)} segments`],
      ["reads", `${count(tier.readRequests)} requests, ${bytes(tier.readBytes)}, ${count(tier.cacheHits)} cache hits`],
      ["cache", `${bytes(tier.cacheBytes)} of ${bytes(tier.cacheCapacityBytes)}`],
      ["failures", `${count(tier.failures)}${tier.lastError ? `: ${tier.lastError}` : ""}`],
    ]);
  } catch (e) {
    if (e instanceof ApiError && e.code === "tiering_off") tiers = false;
    facts($("tier-facts"), [["tiering", tiers === false ? "off (no [tier] section)" : e.message]]);
  }
}
