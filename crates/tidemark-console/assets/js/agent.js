// The agent's page: its spool and its upstream, from `GET /agent/status`, every two seconds.

import { getJson } from "./api.js";
import { bytes, count, duration, facts } from "./format.js";
import { poller } from "./poll.js";

const POLL_MS = 2000;
const polling = poller(refresh, POLL_MS);

export function show() {
  polling.start();
}

export function hide() {
  polling.stop();
}

async function refresh() {
  const dl = document.getElementById("agent-facts");
  try {
    const s = await getJson("/agent/status");
    facts(dl, [
      ["upstream", s.upstreamError ? `${s.upstream}: ${s.upstreamError}` : s.upstream],
      ["spooled", `${count(s.spooledBatches)} batches, ${bytes(s.spooledBytes)}`],
      ["oldest spooled", s.spooledBatches ? `${duration(s.oldestSpooledAgeMs * 1e6)} old` : "—"],
      ["forwarded", `${count(s.forwardedBatches)} batches, ${bytes(s.forwardedBytes)}`],
      ["dead letters", `${count(s.deadLetters)}${s.lastDeadLetter ? ` (last: ${s.lastDeadLetter})` : ""}`],
    ]);
  } catch (e) {
    facts(dl, [["error", e.message]]);
  }
}
