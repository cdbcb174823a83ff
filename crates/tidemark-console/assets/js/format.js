// How the console writes numbers, sizes and times.

const counts = new Intl.NumberFormat("en");

export function count(n) {
  return n == null ? "—" : counts.format(n);
}

/** "1 segment", "3 segments". */
export function plural(n, noun) {
  return `${count(n)} ${noun}${n === 1 ? "" : noun.endsWith("ch") ? "es" : "s"}`;
}

export function bytes(n) {
  if (n == null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** Nanoseconds since the Unix epoch, as UTC in ISO 8601 (to the millisecond). */
export function instant(ns) {
  if (ns == null) return "—";
  return new Date(Number(BigInt(ns) / 1000000n)).toISOString();
}

/** Nanoseconds since the Unix epoch, as UTC in ISO 8601 to the nanosecond when it has them. */
export function instantNs(ns) {
  if (ns == null) return "—";
  const whole = BigInt(ns);
  const below = ((whole % 1000000n) + 1000000n) % 1000000n;
  const text = instant(whole - below);
  return below === 0n ? text : `${text.slice(0, -1)}${String(below).padStart(6, "0")}Z`;
}

/** Nanoseconds as the largest unit that keeps it whole-ish ("7d", "1.5h"). */
export function duration(ns) {
  if (ns == null) return "none";
  const units = [["d", 864e11], ["h", 36e11], ["m", 6e10], ["s", 1e9], ["ms", 1e6]];
  for (const [unit, size] of units) {
    if (ns >= size) return `${+(ns / size).toFixed(1)}${unit}`;
  }
  return `${ns}ns`;
}

/** A per-second rate with one decimal below 10. */
export function rate(perSecond, unit = "/s") {
  if (perSecond == null || !Number.isFinite(perSecond)) return "—";
  return `${perSecond < 10 ? perSecond.toFixed(1) : counts.format(Math.round(perSecond))}${unit}`;
}

/** An element with text content: the console never writes server text as HTML. */
export function element(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text != null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

/** A table row of cells (each text, or an element already built). */
export function row(cells, numeric = []) {
  const tr = document.createElement("tr");
  cells.forEach((cell, index) => {
    const td = cell instanceof Node ? wrap(cell) : element("td", cell);
    if (numeric.includes(index)) td.className = "num";
    tr.append(td);
  });
  return tr;
}

function wrap(node) {
  const td = document.createElement("td");
  td.append(node);
  return td;
}

/** A `dl` filled with `[term, description]` pairs. */
export function facts(dl, pairs) {
  dl.replaceChildren(...pairs.flatMap(([term, description]) => [element("dt", term), element("dd", description)]));
}
