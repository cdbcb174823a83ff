// The Tail view: a stream's newest events as they arrive, followed through the subscription
// route (`GET /v1/streams/{s}/events?follow=true`, NDJSON over fetch, so the token goes in a
// header as everywhere else). Pausing closes the follow; resuming follows again after the
// last position shown, so nothing appended in between is skipped.

import { getJson, lines, parseJson, request, streamPath } from "./api.js";
import { element, instantNs } from "./format.js";

/** The newest events shown when a tail starts. */
const BACKLOG = 20;
/** Rows kept on screen, newest first. */
const MAX_ROWS = 500;
/** A follow the server ended (a restart, a network drop) is taken up again after this. */
const RETRY_MS = 2000;

const $ = (id) => document.getElementById(id);
let following = null; // {stream, controller}
let lastPosition = null; // of the last event shown
let paused = false;
let columns = [];
/** Counts showings: a showing's late answers are ignored once another began, or the view
 * was left (a follow must not outlive its view: it holds one of the server's slots). */
let showing = 0;
let visible = false;

export async function show(stream) {
  visible = true;
  const mine = ++showing;
  let streams = [];
  try {
    streams = await getJson("/v1/streams");
  } catch (e) {
    setStatus(`Could not list the streams: ${e.message}`);
  }
  if (mine !== showing || !visible) return;
  const select = $("tail-stream");
  const chosen = stream || select.value || (streams[0] && streams[0].name) || "";
  select.replaceChildren(...streams.map((s) => element("option", s.name, { value: s.name })));
  select.value = chosen;
  const info = streams.find((s) => s.name === chosen);
  if (!info) {
    stop();
    $("tail-table").tHead.replaceChildren();
    $("tail-table").tBodies[0].replaceChildren();
    setStatus(!streams.length ? "No streams to tail." : chosen ? `There is no stream ${chosen}.` : "");
    return;
  }
  if (following && following.stream === chosen) return;
  start(info);
}

export function hide() {
  visible = false;
  showing += 1;
  stop();
}

function setStatus(text) {
  $("tail-status").textContent = text;
}

function start(info) {
  stop();
  columns = [];
  $("tail-table").tHead.replaceChildren(element("tr"));
  addColumns(["position", "tstart", ...info.schema.map((f) => f.name)]);
  $("tail-table").tBodies[0].replaceChildren();
  lastPosition = info.nextPosition > BACKLOG ? info.nextPosition - BACKLOG - 1 : null;
  setPaused(false);
  follow(info.name);
}

/** Columns of the header (an evolving stream can add fields while it is followed). */
function addColumns(names) {
  const head = $("tail-table").tHead.rows[0];
  for (const name of names) {
    columns.push(name);
    head.append(element("th", name, { scope: "col" }));
  }
}

function stop() {
  if (following) following.controller.abort();
  following = null;
}

function setPaused(value) {
  paused = value;
  $("tail-pause").textContent = paused ? "Resume" : "Pause";
  $("tail-pause").setAttribute("aria-pressed", String(paused));
}

async function follow(stream) {
  const controller = new AbortController();
  following = { stream, controller };
  const after = lastPosition === null ? "earliest" : String(lastPosition);
  setStatus(`following ${stream}`);
  let ended;
  try {
    const response = await request("GET", streamPath(stream, `/events?follow=true&after=${after}`), {
      accept: "application/x-ndjson",
      signal: controller.signal,
    });
    for await (const line of lines(response)) {
      const item = parseJson(line);
      if (item.heartbeat) setStatus(`following ${stream}: nothing new (next position ${item.nextPosition})`);
      else if (item.error) throw new Error(item.message || item.error);
      else add(item);
    }
    ended = "the server ended the follow";
  } catch (e) {
    if (e.name === "AbortError") return;
    if (e.code === "unknown_stream" || e.status === 404) {
      following = null;
      setStatus(`${stream}: ${e.message}`);
      return;
    }
    ended = e.message === "Failed to fetch" ? "the server is unreachable" : e.message;
  }
  // Still this follow's view and stream, not paused: follow again after the last event
  // shown, so that nothing is skipped or shown twice.
  if (!following || following.controller !== controller) return;
  following = null;
  setStatus(`${stream}: ${ended}; following again in ${RETRY_MS / 1000} s`);
  setTimeout(() => {
    if (visible && !paused && !following && $("tail-stream").value === stream) follow(stream);
  }, RETRY_MS);
}

function add({ position, event }) {
  lastPosition = position;
  const added = Object.keys(event).filter((name) => !columns.includes(name));
  if (added.length) addColumns(added);
  const tr = element("tr");
  tr.append(element("td", position));
  for (const name of columns.slice(1)) {
    const value = event[name];
    tr.append(element("td", name === "tstart" ? instantNs(value) : value === undefined || value === null ? "NULL" : value));
  }
  const body = $("tail-table").tBodies[0];
  body.prepend(tr);
  while (body.rows.length > MAX_ROWS) body.lastElementChild.remove();
  setStatus(`following ${following ? following.stream : ""}: last position ${position}`);
}

$("tail-stream").addEventListener("change", (e) => {
  location.hash = `#tail/${encodeURIComponent(e.target.value)}`;
});

$("tail-pause").addEventListener("click", () => {
  const stream = $("tail-stream").value;
  setPaused(!paused);
  if (paused) {
    stop();
    setStatus(`paused after position ${lastPosition ?? "—"}`);
  } else if (stream) {
    follow(stream);
  }
});
