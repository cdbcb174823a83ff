// The console's shell: which view shows (the URL's hash, so views can be linked and the
// browser's back button works), the token prompt, and the status line. Each view is a module
// with `show()` and `hide()`; only the view on screen polls the server.

import { getJson, onUnauthorized, setToken, token } from "./api.js";
import * as streams from "./streams.js";
import * as query from "./query.js";
import * as tail from "./tail.js";
import * as node from "./node.js";
import * as agent from "./agent.js";

const views = { streams, query, tail, node, agent };
let current = null;
let isAgent = false;

function route() {
  // `#view` or `#view/argument` (the argument may hold slashes: SQL).
  const hash = location.hash.slice(1);
  const slash = hash.indexOf("/");
  const name = slash < 0 ? hash : hash.slice(0, slash);
  let argument;
  try {
    argument = slash < 0 ? undefined : decodeURIComponent(hash.slice(slash + 1));
  } catch {
    argument = undefined; // a hand-made link with a stray %: the view, without its argument
  }
  const wanted = isAgent ? "agent" : (views[name] && name !== "agent" ? name : "streams");
  if (current && current !== views[wanted]) {
    current.hide();
    // A view's complaint (the server unreachable) is not the next view's.
    document.getElementById("notice").hidden = true;
  }
  for (const section of document.querySelectorAll("[data-view]")) {
    section.hidden = section.dataset.view !== wanted;
  }
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.for === wanted) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  current = views[wanted];
  current.show(argument);
}

const dialog = document.getElementById("token-dialog");
/** Set when the prompt was cancelled: the next refusals do not open it again (the Token
 * button does). */
let declined = false;

function askForToken(why) {
  if (dialog.open || declined) return;
  document.getElementById("token-why").textContent = why || "";
  dialog.returnValue = "";
  document.getElementById("token-input").value = token();
  dialog.showModal();
}

dialog.addEventListener("close", () => {
  if (dialog.returnValue === "use") setToken(document.getElementById("token-input").value.trim());
  else if (dialog.returnValue === "forget") setToken("");
  else {
    declined = true;
    return;
  }
  declined = false;
  route();
  describeServer();
});

document.getElementById("token-button").addEventListener("click", () => {
  declined = false;
  askForToken("");
});
onUnauthorized((message) => askForToken(`The server asks for a token: ${message}`));

async function describeServer() {
  const status = document.getElementById("server");
  try {
    const info = await getJson("/api/sys-info");
    status.textContent = `${info.role} · node ${info.nodeId} · v${info.version}`;
  } catch (e) {
    // A refusal for want of a token is the prompt's (or the notice's) to say.
    status.textContent = e.status === 401 ? "" : `server: ${e.message}`;
  }
}

async function start() {
  // The agent answers /agent/status and no reads: it gets its own page.
  try {
    const response = await fetch("/agent/status");
    isAgent = response.ok && (response.headers.get("content-type") || "").includes("json");
  } catch {
    isAgent = false;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.hidden = (link.dataset.for === "agent") !== isAgent;
  }
  document.getElementById("server").textContent = isAgent ? "agent" : "";
  // The agent's status needs no token.
  document.getElementById("token-button").hidden = isAgent;
  if (!isAgent) describeServer();
  window.addEventListener("hashchange", route);
  route();
}

start();
