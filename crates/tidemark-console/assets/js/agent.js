// The agent's page: its spool and its upstream, from `GET /agent/status`, every two seconds.

import { getJson } from "./api.js";
import { bytes, count, duration, facts, plural } from "./format.js";
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
      ["upstream", upstream(s)],
      ["spooled", `${plural(s.spooledBatches, "batch")}, ${bytes(s.spooledBytes)}`],
      ["oldest spooled", s.spooledBatches ? `${duration(s.oldestSpooledAgeMs * 1e6)} old` : "—"],
      ["forwarded", `${plural(s.forwardedBatches, "batch")}, ${bytes(s.forwardedBytes)}`],
      ["dead letters", `${count(s.deadLetters)}${s.lastDeadLetter ? ` (last: ${s.lastDeadLetter})` : ""}`],
    ]);
  } catch (e) {
    facts(dl, [["error", e.message]]);
  }
}

/** The upstream's state as the agent last found it; before its first attempt it has none
 * (it contacts the upstream once it has something to forward: docs/pipeline.md). */
function upstream(s) {
  if (s.upstreamError) return `${s.upstream}: ${s.upstreamError}`;
  if (s.upstream === "down") return "not contacted yet (the agent contacts it once it has something to forward)";
  return s.upstream;
}
