//! The latency-percentile chart (`--plot FILE.svg`): latency against percentile
//! on the usual log-scaled axis (50%, 90%, 99%, 99.9%, ...), one line per phase
//! and RPC. Plain SVG, written by hand: a few lines and labels need no plotting
//! library and no fonts.

use super::report::BenchReport;
use std::fmt::Write as _;

const W: f64 = 900.0;
const H: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 240.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Position of a percentile on the x axis: log10(1 / (1 - p)), 0 at 0%.
fn x_of(percentile: f64) -> f64 {
    let p = (percentile / 100.0).min(0.99999);
    (1.0 / (1.0 - p)).log10()
}

/// A round upper bound for the y axis and its tick step.
fn y_scale(max: f64) -> (f64, f64) {
    let max = max.max(0.01) * 1.1;
    let magnitude = 10f64.powf(max.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude / 2.0)
        .find(|s| max / s <= 6.0)
        .unwrap_or(magnitude);
    ((max / step).ceil() * step, step)
}

/// One line of the chart: its label and its (percentile, ms) points.
type Series<'a> = (String, &'a [(f64, f64)]);

/// The plot area and its scales.
struct Frame {
    y_max: f64,
    y_step: f64,
    x_max: f64,
    /// Plot width and height.
    pw: f64,
    ph: f64,
}

impl Frame {
    fn new(max_ms: f64) -> Self {
        let (y_max, y_step) = y_scale(max_ms);
        Frame {
            y_max,
            y_step,
            x_max: x_of(99.999),
            pw: W - LEFT - RIGHT,
            ph: H - TOP - BOTTOM,
        }
    }

    fn px(&self, p: f64) -> f64 {
        LEFT + x_of(p) / self.x_max * self.pw
    }

    fn py(&self, ms: f64) -> f64 {
        TOP + self.ph - ms / self.y_max * self.ph
    }
}

/// The chart as an SVG document.
pub fn svg(report: &BenchReport) -> String {
    let series: Vec<Series> = report
        .phases
        .iter()
        .flat_map(|p| {
            p.rpcs
                .iter()
                .map(move |r| (format!("{} {}", p.name, r.rpc), r.curve.as_slice()))
        })
        .collect();
    let max_ms = series
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(_, ms)| ms))
        .fold(0.0, f64::max);
    let frame = Frame::new(max_ms);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="28" font-size="16">ctxbudget bench: latency by percentile</text>
"#
    );
    x_grid(&mut out, &frame);
    y_grid(&mut out, &frame);
    axis_titles(&mut out, &frame);
    for (i, s) in series.iter().enumerate() {
        line(&mut out, &frame, i, s);
    }
    out.push_str("</svg>\n");
    out
}

/// Vertical grid lines at the usual percentiles, labelled below the plot.
fn x_grid(out: &mut String, f: &Frame) {
    for (p, label) in [
        (0.0, "0%"),
        (90.0, "90%"),
        (99.0, "99%"),
        (99.9, "99.9%"),
        (99.99, "99.99%"),
        (99.999, "99.999%"),
    ] {
        let x = f.px(p);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            TOP + f.ph,
            TOP + f.ph + 18.0
        );
    }
}

/// Horizontal grid lines at each tick, labelled in ms on the left.
fn y_grid(out: &mut String, f: &Frame) {
    let mut y = 0.0;
    while y <= f.y_max + 1e-9 {
        let yy = f.py(y);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{y}</text>"##,
            LEFT + f.pw,
            LEFT - 6.0,
            yy + 4.0
        );
        y += f.y_step;
    }
}

fn axis_titles(out: &mut String, f: &Frame) {
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text><text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">latency (ms)</text>"#,
        LEFT + f.pw / 2.0,
        H - 15.0,
        TOP + f.ph / 2.0
    );
}

/// Series `i` as a polyline, and its entry in the legend on the right.
fn line(out: &mut String, f: &Frame, i: usize, (name, curve): &Series) {
    let color = COLORS[i % COLORS.len()];
    let points: Vec<String> = curve
        .iter()
        .map(|&(p, ms)| format!("{:.1},{:.1}", f.px(p), f.py(ms)))
        .collect();
    let _ = writeln!(
        out,
        r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
        points.join(" ")
    );
    let ly = TOP + 10.0 + i as f64 * 20.0;
    let lx = LEFT + f.pw + 16.0;
    let _ = writeln!(
        out,
        r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
        lx + 24.0,
        lx + 30.0,
        ly + 4.0,
        xml_escape(name)
    );
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_sane() {
        assert_eq!(x_of(0.0), 0.0);
        assert!((x_of(99.0) - 2.0).abs() < 1e-9);
        let (max, step) = y_scale(1.7);
        assert!(max >= 1.87 && max / step <= 6.0, "{max} {step}");
    }
}
