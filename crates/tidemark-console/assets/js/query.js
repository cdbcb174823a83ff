// The Query view: an SQL editor (CodeMirror 5, with completion of stream and field names),
// the answer as a table and, for a time series, a chart; CSV download; history kept in this
// browser; a running query can be cancelled (closing its request stops it on the server).

import { ApiError, getJson, parseJson, request } from "./api.js";
import { element } from "./format.js";
import * as chart from "./chart.js";

/** An answer larger than this is not shown (the page would crawl): download it as CSV. */
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;
/** Rows put in the table; the rest are counted. */
const MAX_TABLE_ROWS = 2000;
const HISTORY_KEY = "tidemark.history";
const HISTORY_SIZE = 50;

const $ = (id) => document.getElementById(id);
let editor = null;
let running = null; // the AbortController of the query in flight
let answer = null; // {columns, rows} of the last answer

export function show(sql) {
  if (!editor) setUp();
  if (sql) editor.setValue(sql);
  editor.refresh(); // CodeMirror measures itself only when visible
  loadCompletions();
  editor.focus();
}

export function hide() {}

function setUp() {
  editor = CodeMirror.fromTextArea($("sql"), {
    mode: "text/x-pgsql", // DataFusion's dialect is PostgreSQL's: "quoted" identifiers
    lineNumbers: true,
    screenReaderLabel: "SQL",
    // Tab leaves the editor, as everywhere else on the page (no keyboard trap).
    extraKeys: { "Ctrl-Enter": run, "Cmd-Enter": run, "Ctrl-Space": "autocomplete", Esc: cancel, Tab: false, "Shift-Tab": false },
    hintOptions: { tables: {}, completeSingle: false },
  });
  editor.on("inputRead", (cm, change) => {
    if (/^[\w.]$/.test(change.text[0] || "")) cm.showHint({ completeSingle: false });
  });
  $("run").addEventListener("click", run);
  $("cancel").addEventListener("click", cancel);
  $("csv").addEventListener("click", downloadCsv);
  $("chart-kind").addEventListener("change", () => answer && chart.draw($("chart"), chart.series(answer.columns, answer.rows), $("chart-kind").value));
  $("history").addEventListener("change", (e) => {
    if (e.target.value) editor.setValue(e.target.value);
    e.target.value = "";
    editor.focus();
  });
  fillHistory();
}

/** Stream and field names for completion (`tables` of CodeMirror's sql-hint). */
async function loadCompletions() {
  try {
    const streams = await getJson("/v1/streams");
    const tables = {};
    for (const s of streams) tables[identifier(s.name)] = ["tstart", "tend", ...s.schema.map((f) => identifier(f.name))];
    editor.setOption("hintOptions", { tables, completeSingle: false });
  } catch {
    // Completion is a help; the query still runs without it.
  }
}

/** `name` as SQL must write it: quoted when it is not letters, digits and _ (Tidemark
 * finds an unquoted name whatever its case). */
function identifier(name) {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? name : `"${name.replaceAll('"', '""')}"`;
}

function setStatus(text) {
  $("query-status").textContent = text;
}

function showError(message) {
  $("query-error").textContent = message || "";
  $("query-error").hidden = !message;
  if (!message) return;
  // DataFusion's parser says "at Line: L, Column: C": put the cursor there.
  const at = /Line: (\d+), Column: (\d+)/.exec(message);
  if (at) editor.setCursor({ line: Number(at[1]) - 1, ch: Number(at[2]) - 1 });
}

async function run() {
  const sql = editor.getValue().trim();
  if (!sql || running) return;
  remember(sql);
  running = new AbortController();
  $("run").disabled = true;
  $("cancel").disabled = false;
  showError("");
  setStatus("running…");
  const started = performance.now();
  try {
    const response = await request("POST", "/v1/query", { body: { sql }, accept: "application/json", signal: running.signal });
    const text = await readCapped(response, running);
    answer = parseJson(text);
    const ms = Math.round(performance.now() - started);
    const charted = render(answer);
    const shown = answer.rows.length > MAX_TABLE_ROWS ? ` (the first ${MAX_TABLE_ROWS} shown)` : "";
    setStatus(`${answer.rows.length} row${answer.rows.length === 1 ? "" : "s"} in ${ms} ms${shown}${charted}`);
  } catch (e) {
    answer = null;
    render({ columns: [], rows: [] });
    if (e.name === "AbortError") setStatus("cancelled");
    else {
      setStatus("");
      // A body cut short after it began (a timeout, a failed read) reaches fetch as a
      // network error; the server's reason is in its log.
      const cut = e instanceof TypeError ? "the answer was cut short after it began (the query's time limit, or a failed read: see the server's log)" : e.message;
      showError(e instanceof ApiError ? `${e.code}: ${e.message}` : cut);
    }
  } finally {
    running = null;
    $("run").disabled = false;
    $("cancel").disabled = true;
  }
}

/** The body as text, or an error (and the request closed) once it passes the cap. */
async function readCapped(response, controller) {
  const reader = response.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > MAX_ANSWER_BYTES) {
      controller.abort();
      throw new Error(`the answer is over ${MAX_ANSWER_BYTES >> 20} MiB: add a LIMIT, or download it as CSV`);
    }
    chunks.push(value);
  }
  return new TextDecoder().decode(await new Blob(chunks).arrayBuffer());
}

function cancel() {
  if (running) running.abort();
}

function render({ columns, rows }) {
  const head = element("tr");
  for (const name of columns) head.append(element("th", name, { scope: "col" }));
  $("result").tHead.replaceChildren(head);
  const body = document.createDocumentFragment();
  for (const values of rows.slice(0, MAX_TABLE_ROWS)) {
    const tr = element("tr");
    for (const value of values) {
      const td = element("td", value === null ? "NULL" : typeof value === "object" ? JSON.stringify(value) : value);
      if (value === null) td.className = "muted";
      else if (typeof value === "number" || typeof value === "bigint") td.className = "num";
      tr.append(td);
    }
    body.append(tr);
  }
  if (rows.length > MAX_TABLE_ROWS) {
    const tr = element("tr");
    tr.append(element("td", `… ${rows.length - MAX_TABLE_ROWS} more rows (download the CSV for all)`, { colspan: String(columns.length) }));
    body.append(tr);
  }
  $("result").tBodies[0].replaceChildren(body);
  const drawn = chart.series(columns, rows);
  chart.draw($("chart"), drawn, $("chart-kind").value);
  if (!drawn || drawn.names.length === drawn.numericColumns) return "";
  return ` (the chart shows the first ${drawn.names.length} of ${drawn.numericColumns} number columns)`;
}

/** Runs the statement again for CSV and saves it; Cancel (or Esc) stops it as it stops a run. */
async function downloadCsv() {
  const sql = editor.getValue().trim();
  if (!sql || running) return;
  running = new AbortController();
  $("run").disabled = true;
  $("csv").disabled = true;
  $("cancel").disabled = false;
  showError("");
  try {
    setStatus("downloading…");
    const response = await request("POST", "/v1/query", { body: { sql }, accept: "text/csv", signal: running.signal });
    const link = element("a", null, { href: URL.createObjectURL(await response.blob()), download: "tidemark-query.csv" });
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    setStatus("downloaded");
  } catch (e) {
    setStatus(e.name === "AbortError" ? "cancelled" : "");
    if (e.name !== "AbortError") showError(e instanceof ApiError ? `${e.code}: ${e.message}` : e.message);
  } finally {
    running = null;
    $("run").disabled = false;
    $("csv").disabled = false;
    $("cancel").disabled = true;
  }
}

function history() {
  try {
    const saved = JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]");
    return Array.isArray(saved) ? saved.filter((s) => typeof s === "string") : [];
  } catch {
    return [];
  }
}

function remember(sql) {
  const kept = [sql, ...history().filter((s) => s !== sql)].slice(0, HISTORY_SIZE);
  localStorage.setItem(HISTORY_KEY, JSON.stringify(kept));
  fillHistory();
}

function fillHistory() {
  const select = $("history");
  const options = history().map((sql) => element("option", sql.length > 80 ? `${sql.slice(0, 77)}…` : sql, { value: sql }));
  select.replaceChildren(element("option", "—", { value: "" }), ...options);
}
