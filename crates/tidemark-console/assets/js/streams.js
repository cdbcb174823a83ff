// The Streams view: every stream with its events, time range, bytes, compression, ingest
// rate (with a sparkline of the last two minutes), retention, window and consumers, refreshed
// every two seconds from `GET /v1/streams`; create, clear and drop, each destructive action
// confirmed by typing the stream's name.

import { ApiError, getJson, request, sendJson, streamPath } from "./api.js";
import { bytes, count, duration, element, instant, plural, rate } from "./format.js";
import { poller } from "./poll.js";

const POLL_MS = 2000;
/** Rate samples kept per stream for its sparkline: two minutes at one per poll. */
const SPARK_SAMPLES = 60;
/** Bytes per value of each fixed-width type, for the compression ratio. */
const WIDTH = { BOOLEAN: 1, BYTE: 1, SHORT: 2, INTEGER: 4, LONG: 8, FLOAT: 4, DOUBLE: 8 };

const table = document.querySelector("#streams-table tbody");
const rows = new Map(); // stream name -> its row's cells, kept across refreshes
const seen = new Map(); // stream name -> {at, events, rates[]}
const polling = poller(refresh, POLL_MS);
/** Whether the server tiers, once asked in this showing (asking each poll would count a
 * 404 `tiering_off` in its refusals every two seconds). */
let tiers = null;

export function show() {
  tiers = null;
  polling.start();
}

export function hide() {
  polling.stop();
}

async function refresh() {
  try {
    const streams = await getJson("/v1/streams");
    setStatus("");
    render(streams);
    if (tiers !== false) await describeTiering();
  } catch (e) {
    setStatus(`Could not list the streams: ${e.message}`);
  }
}

/** Why the list could not be read (cleared by the next refresh that can). */
function setStatus(message) {
  const p = document.getElementById("notice");
  p.textContent = message;
  p.hidden = !message;
}

/** What the last action did or why it failed: stays until the next action. */
function setOutcome(message, failed) {
  const p = document.getElementById("streams-outcome");
  p.textContent = message;
  p.className = failed ? "error" : "ok";
  p.hidden = !message;
}

function render(streams) {
  const now = performance.now();
  const names = new Set(streams.map((s) => s.name));
  for (const [name, cells] of rows) {
    if (!names.has(name)) {
      cells.tr.remove();
      rows.delete(name);
      seen.delete(name);
    }
  }
  for (const stream of streams) {
    const cells = rows.get(stream.name) || addRow(stream.name);
    fill(cells, stream, ingestRate(stream, now));
  }
  document.getElementById("streams-empty").hidden = streams.length > 0;
}

/** Events per second since the last poll (a clear or retention makes the count fall: 0). */
function ingestRate(stream, now) {
  const last = seen.get(stream.name);
  const rates = last ? last.rates : [];
  let perSecond = null;
  if (last) {
    perSecond = Math.max(0, ((stream.eventCount - last.events) * 1000) / (now - last.at));
    rates.push(perSecond);
    if (rates.length > SPARK_SAMPLES) rates.shift();
  }
  seen.set(stream.name, { at: now, events: stream.eventCount, rates });
  return { perSecond, rates };
}

function addRow(name) {
  const tr = document.createElement("tr");
  tr.dataset.stream = name;
  const cells = { tr };
  for (const key of ["name", "events", "range", "disk", "compressed", "ingest", "retention", "consumers", "actions"]) {
    cells[key] = document.createElement(key === "name" ? "th" : "td");
    cells[key].dataset.cell = key;
    tr.append(cells[key]);
  }
  cells.name.scope = "row";
  cells.schema = element("div", null, { class: "schema" });
  cells.name.append(element("span", name), cells.schema);
  for (const key of ["events", "disk", "ingest"]) cells[key].className = "num";
  cells.spark = element("canvas", null, { class: "sparkline", width: "90", height: "20", role: "img" });
  cells.rateText = element("span");
  cells.ingest.append(cells.rateText, " ", cells.spark);
  cells.actions.append(...actions(name, cells));
  // Keep the table in name order, as the server lists it.
  const after = [...rows.keys()].filter((n) => n > name).sort()[0];
  table.insertBefore(tr, after ? rows.get(after).tr : null);
  rows.set(name, cells);
  return cells;
}

function fill(cells, stream, ingest) {
  cells.schema.textContent = `${stream.schema.map((f) => `${f.name} ${f.type}`).join(", ")}${stream.evolving ? " (evolving)" : ""}`;
  cells.events.textContent = count(stream.eventCount);
  if (stream.timeRange) {
    cells.range.replaceChildren(element("span", `${instant(stream.timeRange.first)} …`), element("span", instant(stream.timeRange.last)));
  } else {
    cells.range.textContent = "empty";
  }
  const tiered = stream.tieredBytes ? `, ${bytes(stream.tieredBytes)} of it in the bucket` : "";
  cells.disk.textContent = `${bytes(stream.bytesOnDisk)} in ${plural(stream.segments, "segment")}${tiered}`;
  cells.compressed.textContent = compression(stream);
  // Bytes per second as they land on disk: the rate at the stream's bytes per stored event.
  const perEvent = stream.flushedEvents > 0 ? stream.bytesOnDisk / stream.flushedEvents : null;
  const onDisk = perEvent && ingest.perSecond != null ? ` · ${bytes(ingest.perSecond * perEvent)}/s` : "";
  cells.rateText.textContent = `${rate(ingest.perSecond, " ev/s")}${onDisk}`;
  cells.ingest.title = onDisk ? `on disk, at ${perEvent.toFixed(1)} bytes per stored event` : "";
  cells.spark.setAttribute("aria-label", `ingest rate of the last ${ingest.rates.length * 2} seconds`);
  sparkline(cells.spark, ingest.rates);
  const retention = [];
  if (stream.retention.maxAgeNs != null) retention.push(`keeps ${duration(stream.retention.maxAgeNs)}`);
  if (stream.retention.maxBytes != null) retention.push(`at most ${bytes(stream.retention.maxBytes)}`);
  cells.retention.textContent = `${retention.join(", ") || "keeps all"} · window ${stream.outOfOrderWindow.text}`;
  cells.consumers.textContent = stream.consumers.length
    ? stream.consumers.map((c) => `${c.name} at ${count(c.position)} (${count(c.behind)})`).join(", ")
    : "none";
}

/** Bytes per stored event, and the ratio to the same events as fixed-width columns when
 * every field has a width (a STRING's plain size is not kept, so no ratio is claimed). */
function compression(stream) {
  if (!(stream.flushedEvents > 0)) return "— (not flushed yet)";
  const perEvent = stream.bytesOnDisk / stream.flushedEvents;
  const widths = stream.schema.map((f) => WIDTH[f.type]);
  const text = `${perEvent.toFixed(1)} B/event`;
  if (widths.some((w) => w === undefined)) return text;
  const plain = 8 + widths.reduce((a, b) => a + b, 0); // 8: the timestamp
  return `${text}, ${(plain / perEvent).toFixed(1)}×`;
}

function sparkline(canvas, values) {
  const context = canvas.getContext("2d");
  context.clearRect(0, 0, canvas.width, canvas.height);
  if (values.length < 2) return;
  const top = Math.max(...values, 1);
  context.strokeStyle = "#0b5cad";
  context.lineWidth = 1.5;
  context.beginPath();
  values.forEach((v, i) => {
    const x = (i / (SPARK_SAMPLES - 1)) * canvas.width;
    const y = canvas.height - 1 - (v / top) * (canvas.height - 2);
    if (i === 0) context.moveTo(x, y);
    else context.lineTo(x, y);
  });
  context.stroke();
}

function actions(name, cells) {
  const link = (text, href) => element("a", text, { href });
  const clear = element("button", "Clear", { type: "button", class: "danger" });
  const drop = element("button", "Drop", { type: "button", class: "danger" });
  clear.addEventListener("click", () => confirm(cells, name, "clear"));
  drop.addEventListener("click", () => confirm(cells, name, "drop"));
  return [
    link("Query", `#query/${encodeURIComponent(`SELECT * FROM "${name.replaceAll('"', '""')}" ORDER BY tstart DESC LIMIT 100`)}`),
    " ", link("Tail", `#tail/${encodeURIComponent(name)}`), " ", clear, " ", drop,
  ];
}

/** The second step of a clear or drop: the stream's name typed, then the button. */
function confirm(cells, name, action) {
  const box = element("span", null, { class: "confirm" });
  const what = action === "clear" ? "removes every event of the stream" : "removes the stream and its events";
  const label = element("label", `${action === "clear" ? "Clear" : "Drop"} ${what}: type its name to confirm`);
  const input = element("input", null, { autocomplete: "off", size: "12" });
  label.append(" ", input);
  const go = element("button", `${action === "clear" ? "Clear" : "Drop"} ${name}`, { type: "button", class: "danger" });
  const cancel = element("button", "Cancel", { type: "button" });
  go.disabled = true;
  const restore = () => {
    cells.actions.replaceChildren(...actions(name, cells));
    cells.actions.querySelector(`button.danger`)?.focus();
  };
  const act = async () => {
    if (input.value !== name) return;
    go.disabled = true;
    try {
      if (action === "clear") await request("POST", streamPath(name, "/clear"));
      else await request("DELETE", streamPath(name));
      setOutcome(`${action === "clear" ? "Cleared" : "Dropped"} ${name}.`, false);
      restore();
      polling.now();
    } catch (e) {
      setOutcome(`Could not ${action} ${name}: ${e.message}`, true);
      go.disabled = false;
    }
  };
  input.addEventListener("input", () => { go.disabled = input.value !== name; });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") act();
    else if (e.key === "Escape") restore();
  });
  cancel.addEventListener("click", restore);
  go.addEventListener("click", act);
  box.append(label, go, cancel);
  cells.actions.replaceChildren(box);
  input.focus();
}

async function describeTiering() {
  const p = document.getElementById("streams-tiered");
  try {
    const tier = await getJson("/v1/tier");
    tiers = true;
    p.textContent = `Tiered to ${tier.url}: ${bytes(tier.tieredBytes)} in ${count(tier.tieredSegments)} segments; `
      + `${bytes(tier.pendingBytes)} waiting (segments move after ${duration(tier.afterSeconds * 1e9)}).`;
    p.hidden = false;
  } catch (e) {
    if (e instanceof ApiError && e.code === "tiering_off") tiers = false;
    p.hidden = tiers === false;
    if (!p.hidden) p.textContent = `Tiering: ${e.message}`;
  }
}

document.getElementById("create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const field = (name) => form.elements.namedItem(name);
  const body = {
    name: field("name").value.trim(),
    schema: field("schema").value.trim(),
    evolving: field("evolving").checked,
  };
  const partition = field("partition").value.trim();
  if (partition) body.partition = partition;
  try {
    await sendJson("POST", "/v1/streams", body);
    setOutcome(`Created ${body.name}.`, false);
    form.reset();
    polling.now();
  } catch (e) {
    setOutcome(`Could not create ${body.name}: ${e.message}`, true);
  }
});
