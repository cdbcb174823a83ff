// A chart of a query's result when it is a time series: the first column a time, at least
// one other column numbers. Drawn with uPlot (a global from its vendored script).

const PALETTE = ["#0b5cad", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207", "#4d7c0f"];
/** More series than this would be a legend, not a chart. */
const MAX_SERIES = 8;

let plot = null;

/** Seconds since the epoch of an RFC 3339 time as the server writes them, else null. */
function seconds(value) {
  if (typeof value !== "string" || !/^\d{4}-\d\d-\d\dT\d\d:\d\d/.test(value)) return null;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? null : ms / 1000;
}

/** A value as a chart's y (LONGs past 2^53 come as BigInt: a chart may round them). */
function y(value) {
  if (typeof value === "number") return value;
  return typeof value === "bigint" ? Number(value) : null;
}

/** `[x, ...series]`, the series' names and how many columns held numbers if
 * `columns`/`rows` chart, else null. */
export function series(columns, rows) {
  if (rows.length < 2 || columns.length < 2) return null;
  const points = rows.map((row) => [seconds(row[0]), row]).filter(([x]) => x !== null);
  if (points.length < rows.length) return null;
  points.sort((a, b) => a[0] - b[0]); // uPlot draws x ascending
  const numeric = columns
    .map((name, index) => ({ name, index }))
    .slice(1)
    .filter(({ index }) => points.some(([, row]) => y(row[index]) !== null));
  if (!numeric.length) return null;
  const charted = numeric.slice(0, MAX_SERIES);
  return {
    names: charted.map((c) => c.name),
    numericColumns: numeric.length,
    data: [points.map(([x]) => x), ...charted.map(({ index }) => points.map(([, row]) => y(row[index])))],
  };
}

/** Draws `chart` (from `series`) into `container` as lines or bars; clears it if null. */
export function draw(container, chart, kind) {
  if (plot) {
    plot.destroy();
    plot = null;
  }
  container.hidden = !chart;
  if (!chart) return;
  const bars = kind === "bars" ? uPlot.paths.bars({ size: [0.6, 64] }) : undefined;
  const options = {
    width: Math.max(300, container.clientWidth || document.body.clientWidth - 40),
    height: 280,
    scales: { x: { time: true } },
    // Times as the server writes them: UTC.
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    axes: [{ space: 90, label: "UTC" }, { size: 80 }],
    series: [
      { label: "time" },
      ...chart.names.map((name, i) => ({
        label: name,
        stroke: PALETTE[i % PALETTE.length],
        fill: bars ? `${PALETTE[i % PALETTE.length]}55` : undefined,
        width: 1.5,
        paths: bars,
        spanGaps: false,
      })),
    ],
  };
  plot = new uPlot(options, chart.data, container);
  plot.root.querySelector("canvas").setAttribute("role", "img");
  plot.root.querySelector("canvas").setAttribute("aria-label", `${kind === "bars" ? "Bar" : "Line"} chart of ${chart.names.join(", ")} over time`);
  container.dataset.series = String(chart.names.length);
  container.dataset.points = String(chart.data[0].length);
}

window.addEventListener("resize", () => {
  const container = plot && plot.root.parentElement;
  if (container) plot.setSize({ width: Math.max(300, container.clientWidth), height: 280 });
});
