// Every call the console makes goes through here: the token on each request (kept in this
// tab's session storage, never in a URL), and the server's refusals as ApiErrors carrying
// its own message. The console uses only the public routes a script would.

const TOKEN_KEY = "tidemark.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** A refusal: the HTTP status, the server's error code and its message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let unauthorized = () => {};

/** `handler` runs when the server answers 401 (a token is needed, or a wrong one was given). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/** The response of `method path`, or an ApiError for any answer but 2xx. */
export async function request(method, path, { body, accept, signal } = {}) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (accept) headers.Accept = accept;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (response.ok) return response;
  let code = `http_${response.status}`;
  let message = response.statusText || code;
  try {
    const refusal = await response.json();
    code = refusal.error || code;
    message = refusal.message || message;
  } catch {
    // Not JSON (a proxy's page): the status says enough.
  }
  if (response.status === 401) unauthorized(message);
  throw new ApiError(response.status, code, message);
}

export async function getJson(path, options) {
  return (await request("GET", path, options)).json();
}

export async function sendJson(method, path, body, options) {
  return (await request(method, path, { ...options, body })).json();
}

/** The lines of a streamed answer (NDJSON) as they arrive; ends with the body. */
export async function* lines(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let end;
    while ((end = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, end);
      pending = pending.slice(end + 1);
      if (line.trim()) yield line;
    }
  }
  if (pending.trim()) yield pending;
}

/** JSON with integers beyond 2^53 kept exact, as BigInt: JSON.parse alone would round a
 * LONG such as 9007199254740993, or a `tstart` in nanoseconds, to a neighbour. */
export function parseJson(text) {
  return JSON.parse(text, (key, value, context) =>
    typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)
      ? BigInt(context.source)
      : value);
}

/** `/v1/streams/{name}...`, the name escaped. */
export function streamPath(name, rest = "") {
  return `/v1/streams/${encodeURIComponent(name)}${rest}`;
}
