// The Tail view: a stream's newest events as they arrive, followed through the subscription
// route (`GET /v1/streams/{s}/events?follow=true`, NDJSON over fetch, so the token goes in a
// header as everywhere else). Pausing closes the follow; resuming follows again after the
// last position shown, so nothing appended in between is skipped.

import { getJson, lines, request, streamPath } from "./api.js";
import { element, instant } from "./format.js";

/** The newest events shown when a tail starts. */
const BACKLOG = 20;
/** Rows kept on screen, newest first. */
const MAX_ROWS = 500;

const $ = (id) => document.getElementById(id);
let following = null; // {stream, controller}
let lastPosition = null; // of the last event shown
let paused = false;
let columns = [];

export async function show(stream) {
  let streams = [];
  try {
    streams = await getJson("/v1/streams");
  } catch (e) {
    setStatus(`Could not list the streams: ${e.message}`);
  }
  const select = $("tail-stream");
  const chosen = stream || select.value || (streams[0] && streams[0].name) || "";
  select.replaceChildren(...streams.map((s) => element("option", s.name, { value: s.name })));
  select.value = chosen;
  const info = streams.find((s) => s.name === chosen);
  if (!info) {
    stop();
    setStatus(streams.length ? "" : "No streams to tail.");
    return;
  }
  if (following && following.stream === chosen) return;
  start(info);
}

export function hide() {
  stop();
}

function setStatus(text) {
  $("tail-status").textContent = text;
}

function start(info) {
  stop();
  columns = ["tstart", ...info.schema.map((f) => f.name)];
  const head = element("tr");
  for (const name of ["position", ...columns]) head.append(element("th", name, { scope: "col" }));
  $("tail-table").tHead.replaceChildren(head);
  $("tail-table").tBodies[0].replaceChildren();
  lastPosition = info.nextPosition > BACKLOG ? info.nextPosition - BACKLOG - 1 : null;
  paused = false;
  $("tail-pause").textContent = "Pause";
  $("tail-pause").setAttribute("aria-pressed", "false");
  follow(info.name);
}

function stop() {
  if (following) following.controller.abort();
  following = null;
}

async function follow(stream) {
  const controller = new AbortController();
  following = { stream, controller };
  const after = lastPosition === null ? "earliest" : String(lastPosition);
  setStatus(`following ${stream}`);
  try {
    const response = await request("GET", streamPath(stream, `/events?follow=true&after=${after}`), {
      accept: "application/x-ndjson",
      signal: controller.signal,
    });
    for await (const line of lines(response)) {
      const item = JSON.parse(line);
      if (item.heartbeat) setStatus(`following ${stream}: nothing new (next position ${item.nextPosition})`);
      else if (item.error) throw new Error(item.message || item.error);
      else add(item);
    }
    if (following && following.controller === controller) setStatus(`${stream}: the server ended the follow`);
  } catch (e) {
    if (e.name !== "AbortError") setStatus(`${stream}: ${e.message}`);
  }
}

function add({ position, event }) {
  lastPosition = position;
  const tr = element("tr");
  tr.append(element("td", position));
  for (const name of columns) {
    const value = event[name];
    tr.append(element("td", name === "tstart" ? instant(value) : value === undefined || value === null ? "NULL" : value));
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
  const button = $("tail-pause");
  const stream = $("tail-stream").value;
  paused = !paused;
  button.textContent = paused ? "Resume" : "Pause";
  button.setAttribute("aria-pressed", String(paused));
  if (paused) {
    stop();
    setStatus(`paused after position ${lastPosition ?? "—"}`);
  } else if (stream) {
    follow(stream);
  }
});
