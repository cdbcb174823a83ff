//! PNG charts of benchmark results, drawn with plotters (bitmap backend, DejaVu Sans built
//! into the binary so a chart looks the same on a machine without fonts).
//!
//! Benchmark figures span orders of magnitude (1 KB to 10 MB buffers, 1 to 2000 streams,
//! latencies from 0.1 ms to seconds), so every chart has logarithmic axes.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
}

/// What a chart shows.
#[derive(Debug, Clone)]
pub struct LogChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Formats an x tick (e.g. bytes as "1 MB").
    pub x_ticks: fn(f64) -> String,
    pub series: &'a [Series],
}

#[derive(Debug, thiserror::Error)]
#[error("chart {path}: {reason}")]
pub struct ChartError {
    path: String,
    reason: String,
}

const FONT: &str = "sans-serif";

fn font_registered() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the built-in font could not be read".to_string())
        })
        .clone()
}

/// Draws `chart` into a 960×560 PNG at `path`. Points that a log axis cannot show (zero,
/// negative, not finite) are left out; a chart with nothing to show is an error.
pub fn draw(path: &Path, chart: &LogChart<'_>) -> Result<(), ChartError> {
    let fail = |reason: String| ChartError {
        path: path.display().to_string(),
        reason,
    };
    font_registered().map_err(fail)?;
    let shown = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && x > 0.0 && y > 0.0;
    let series: Vec<Series> = chart
        .series
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            points: s.points.iter().copied().filter(shown).collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let all = || series.iter().flat_map(|s| s.points.iter());
    let bounds = |pick: fn(&(f64, f64)) -> f64| {
        let (lo, hi) = all()
            .map(pick)
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        // A little room around the data; a single value gets a decade around it.
        if lo >= hi {
            (lo / 3.0, hi * 3.0)
        } else {
            (lo / 1.4, hi * 1.4)
        }
    };
    if series.is_empty() {
        return Err(fail("no point to draw".into()));
    }
    let (x_lo, x_hi) = bounds(|p| p.0);
    let (y_lo, y_hi) = bounds(|p| p.1);
    // Room at the top for the legend (about 20 px a line of the ~440 px plot), so that it
    // never hides a line.
    let legend = ((series.len() as f64 * 20.0 + 24.0) / 440.0).min(0.6);
    let y_hi = y_lo * (y_hi / y_lo).powf(1.0 / (1.0 - legend));
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (960, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut plot = ChartBuilder::on(&root)
            .caption(chart.title, (FONT, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(84)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
        plot.configure_mesh()
            .x_labels(12)
            .y_labels(12)
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .x_label_formatter(&|x| (chart.x_ticks)(*x))
            .y_label_formatter(&|y| short_number(*y))
            .label_style((FONT, 14))
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).mix(0.95);
            plot.draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
                });
            plot.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        plot.configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    drawn.map_err(|e| fail(e.to_string()))
}

/// One bar of a [`draw_bars`] chart; bars of one `group` share a colour.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub group: usize,
    pub value: f64,
}

/// Draws a bar chart (linear axis from zero, each bar's value written above it) into a
/// 960×560 PNG at `path`; for the few figures of one run side by side (bits per point,
/// query latencies). Bars without a finite, non-negative value are an error.
pub fn draw_bars(path: &Path, title: &str, y_label: &str, bars: &[Bar]) -> Result<(), ChartError> {
    let fail = |reason: String| ChartError {
        path: path.display().to_string(),
        reason,
    };
    font_registered().map_err(fail)?;
    if bars.is_empty() {
        return Err(fail("no bar to draw".into()));
    }
    if let Some(bad) = bars
        .iter()
        .find(|b| !(b.value.is_finite() && b.value >= 0.0))
    {
        return Err(fail(format!("bar {:?} has no value to show", bad.label)));
    }
    let top = bars.iter().map(|b| b.value).fold(0.0, f64::max).max(1e-9) * 1.15;
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (960, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut plot = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(84)
            // A segmented 0..n has n + 1 segments: the last bar's index is the end (a
            // single bar gets an empty neighbour; an empty range draws nothing).
            .build_cartesian_2d(
                (0..(bars.len() as i32 - 1).max(1)).into_segmented(),
                0.0..top,
            )?;
        plot.configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len())
            .y_desc(y_label)
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => bars
                    .get(*i as usize)
                    .map_or(String::new(), |b| b.label.clone()),
                _ => String::new(),
            })
            .y_label_formatter(&|y| short_number(*y))
            .label_style((FONT, 13))
            .draw()?;
        for (i, bar) in bars.iter().enumerate() {
            let color = Palette99::pick(bar.group).mix(0.9);
            let i = i as i32;
            let mut rectangle = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), bar.value),
                ],
                color.filled(),
            );
            rectangle.set_margin(0, 0, 14, 14);
            plot.draw_series(std::iter::once(rectangle))?;
            plot.draw_series(std::iter::once(Text::new(
                short_number(bar.value),
                (SegmentValue::CenterOf(i), bar.value + top * 0.02),
                (FONT, 14),
            )))?;
        }
        root.present()?;
        Ok(())
    })();
    drawn.map_err(|e| fail(e.to_string()))
}

/// 1500 → "1.5k", 2500000 → "2.5M", 0.25 → "0.25".
pub fn short_number(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(short_number(1500.0), "1.5k");
        assert_eq!(short_number(2_500_000.0), "2.5M");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(100.0), "100");
        assert_eq!(short_number(3e9), "3G");
    }

    #[test]
    fn draws_a_png_and_refuses_an_empty_chart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        let series = [
            Series {
                label: "3 nodes".into(),
                points: vec![(1e3, 5e5), (1e6, 5.8e6), (1e7, 4.2e6)],
            },
            Series {
                // Not drawable on a log axis: left out, the rest still drawn.
                label: "broken".into(),
                points: vec![(0.0, 1.0), (1e3, -1.0), (f64::NAN, 2.0)],
            },
        ];
        let chart = LogChart {
            title: "W1 insert",
            x_label: "buffer",
            y_label: "events/s",
            x_ticks: short_number,
            series: &series,
        };
        draw(&path, &chart).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 5_000, "a chart with text and lines");

        let empty = LogChart {
            series: &series[1..],
            ..chart
        };
        let err = draw(&dir.path().join("empty.png"), &empty).unwrap_err();
        assert!(err.to_string().contains("no point"), "{err}");
    }

    #[test]
    fn draws_bars_and_refuses_bars_without_a_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bars.png");
        let bar = |label: &str, group, value| Bar {
            label: label.into(),
            group,
            value,
        };
        draw_bars(
            &path,
            "W2 bits per point",
            "bits",
            &[bar("tidemark", 0, 3.2), bar("prometheus", 1, 7.4)],
        )
        .unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 5_000, "a chart with text and bars");
        for bad in [f64::NAN, -1.0] {
            let err = draw_bars(&path, "t", "y", &[bar("x", 0, bad)]).unwrap_err();
            assert!(err.to_string().contains("no value"), "{err}");
        }
        assert!(draw_bars(&path, "t", "y", &[]).is_err());
        draw_bars(
            &dir.path().join("one.png"),
            "one",
            "y",
            &[bar("only", 0, 1.0)],
        )
        .unwrap();
    }
}
