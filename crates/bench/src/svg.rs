//! A hand-written SVG chart of the medians: one panel of latency percentiles per request
//! rate and one of throughput, grouped bars, one colour per scenario.

use std::fmt::Write as _;

use crate::report::{PERCENTILES, Report, latency_key, throughput_key};

const PANEL_W: f64 = 330.0;
const PANEL_H: f64 = 260.0;
const MARGIN_L: f64 = 60.0;
const TOP: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
];
/// Advance of one character of the 11px monospace table, and its line height.
const CHAR_W: f64 = 6.7;
const LINE_H: f64 = 15.0;

struct Panel {
    title: String,
    unit: &'static str,
    div: f64,
    /// (group label, metric key)
    groups: Vec<(String, String)>,
}

/// Renders the chart for `report` with latency panels for `rates`.
pub fn chart(report: &Report, rates: &[u32]) -> String {
    let mut panels: Vec<Panel> = rates
        .iter()
        .map(|&rate| Panel {
            title: format!("latency @ {rate} req/s (us, lower is better)"),
            unit: "us",
            div: 1.0,
            groups: PERCENTILES
                .iter()
                .map(|(suffix, label, _)| (label.to_string(), latency_key(rate, suffix)))
                .collect(),
        })
        .collect();
    panels.push(Panel {
        title: "throughput (MB/s, higher is better)".into(),
        unit: "MB/s",
        div: 1e6,
        groups: [1, 4]
            .iter()
            .map(|&n| {
                (
                    format!("{n} stream{}", if n == 1 { "" } else { "s" }),
                    throughput_key(n),
                )
            })
            .collect(),
    });
    let rows = crate::report::table_rows(report);
    let cols: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let table_top = TOP + PANEL_H + 90.0;
    let table_w = MARGIN_L + (cols.iter().sum::<usize>() + 2 * cols.len()) as f64 * CHAR_W;
    let width = (MARGIN_L + panels.len() as f64 * (PANEL_W + MARGIN_L)).max(table_w);
    let height = table_top + (rows.len() + report.aims.len() + 4) as f64 * LINE_H;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN_L}" y="22" font-size="15" font-weight="bold">ambit-bench {} run, {} commit {} (medians of {} round(s))</text>"#,
        report.mode,
        esc(&report.date),
        esc(&report.commit),
        report.rounds
    );
    for (i, p) in panels.iter().enumerate() {
        let x0 = MARGIN_L + i as f64 * (PANEL_W + MARGIN_L);
        panel(&mut s, report, p, x0);
    }
    // Legend.
    let ly = TOP + PANEL_H + 55.0;
    for (i, sc) in report.scenarios.iter().enumerate() {
        let lx = MARGIN_L + i as f64 * 170.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            ly - 10.0,
            COLORS[i % COLORS.len()],
            lx + 16.0,
            ly,
            esc(&sc.name)
        );
    }
    // Every figure with its ratios to the baseline and to upstream, as in the text table.
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN_L}" y="{:.0}" font-weight="bold">medians; N/b = ratio to baseline, N/u = ratio to {}; latency: added to the baseline's, N/u = ratio of added latencies</text>"#,
        table_top - 8.0,
        esc(report.upstream.as_deref().unwrap_or("upstream (not run)"))
    );
    let mut y = table_top + LINE_H;
    for row in &rows {
        let mut x = MARGIN_L;
        for (i, cell) in row.iter().enumerate() {
            let (anchor, at) = if i == 0 {
                ("start", x)
            } else {
                ("end", x + cols[i] as f64 * CHAR_W)
            };
            let _ = writeln!(
                s,
                r#"<text x="{at:.0}" y="{y:.0}" text-anchor="{anchor}" font-family="monospace">{}</text>"#,
                esc(cell)
            );
            x += (cols[i] + 2) as f64 * CHAR_W;
        }
        y += LINE_H;
    }
    y += LINE_H;
    for a in &report.aims {
        let verdict = match a.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let measured = a.measured.map_or("-".into(), |m| format!("{m:.2}"));
        let _ = writeln!(
            s,
            r#"<text x="{MARGIN_L}" y="{y:.0}" font-family="monospace">{}: {measured} ({verdict})</text>"#,
            esc(&a.aim)
        );
        y += LINE_H;
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, report: &Report, p: &Panel, x0: f64) {
    let values: Vec<Vec<Option<f64>>> = p
        .groups
        .iter()
        .map(|(_, key)| {
            report
                .scenarios
                .iter()
                .map(|sc| sc.metrics.get(key).map(|m| m.median / p.div))
                .collect()
        })
        .collect();
    let max = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0, f64::max);
    let top = nice_ceiling(max);
    let y_of = |v: f64| TOP + PANEL_H - v / top * PANEL_H;
    let _ = writeln!(
        s,
        r#"<text x="{x0}" y="{}" font-weight="bold">{}</text>"#,
        TOP - 12.0,
        esc(&p.title)
    );
    for tick in 0..=4 {
        let v = top * f64::from(tick) / 4.0;
        let y = y_of(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 + PANEL_W,
            x0 - 4.0,
            y + 4.0,
            short(v)
        );
    }
    let group_w = PANEL_W / p.groups.len() as f64;
    let n = report.scenarios.len().max(1) as f64;
    let bar_w = (group_w * 0.8) / n;
    for (g, (label, _)) in p.groups.iter().enumerate() {
        let gx = x0 + g as f64 * group_w + group_w * 0.1;
        for (i, v) in values[g].iter().enumerate() {
            let Some(v) = v else { continue };
            let x = gx + i as f64 * bar_w;
            let y = y_of(*v);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {} {}</title></rect>"#,
                (bar_w - 2.0).max(1.0),
                TOP + PANEL_H - y,
                COLORS[i % COLORS.len()],
                esc(&report.scenarios[i].name),
                short(*v),
                p.unit
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                x + bar_w / 2.0,
                y - 3.0,
                short(*v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            TOP + PANEL_H + 16.0,
            esc(label)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{b}" x2="{:.1}" y2="{b}" stroke="black"/>"#,
        x0 + PANEL_W,
        b = TOP + PANEL_H
    );
}

/// The smallest 1, 2 or 5 × 10^k at or above `v` (axis top).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let exp = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * exp)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * exp)
}

fn short(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        crate::report::fmt_value(v)
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_tops() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(130.0), 200.0);
        assert_eq!(nice_ceiling(4100.0), 5000.0);
        assert_eq!(nice_ceiling(5000.0), 5000.0);
    }

    #[test]
    fn escapes() {
        assert_eq!(esc("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }
}
