// Reads the Prometheus text of `/metrics` (the console shows what an operator's Prometheus
// would scrape, from the same numbers).

/** `name -> [{labels, value}]` of every sample in `text`. */
export function parse(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const [, name, , labelText, value] = match;
    const labels = {};
    for (const pair of (labelText || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]] = pair[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    if (!samples.has(name)) samples.set(name, []);
    samples.get(name).push({ labels, value: Number(value) });
  }
  return samples;
}

/** The value of the sample of `name` whose labels include `labels`, if there is one. */
export function value(samples, name, labels = {}) {
  const found = (samples.get(name) || []).find((s) =>
    Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return found ? found.value : undefined;
}

/** A histogram's buckets as `[{le, count}]` (not cumulative), smallest bound first. */
export function histogram(samples, name) {
  const buckets = (samples.get(`${name}_bucket`) || [])
    .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), cumulative: s.value }))
    .sort((a, b) => a.le - b.le);
  return buckets.map((b, i) => ({ le: b.le, count: b.cumulative - (i ? buckets[i - 1].cumulative : 0) }));
}
