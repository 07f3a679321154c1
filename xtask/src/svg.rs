//! A hand-written SVG plot: best time against N per variant, log-log.

use crate::attention::measurement::{Measurement, Variant};
use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 64.0;
const BOTTOM: f64 = 60.0;

fn color(v: Variant) -> &'static str {
    match v {
        Variant::Unfused => "#1f77b4",
        Variant::UnfusedLoops => "#aec7e8",
        Variant::Fused => "#d62728",
        Variant::FusedWritten => "#ff9896",
        Variant::Online => "#2ca02c",
        Variant::OnlineQb => "#17becf",
        Variant::FusedUpcast64 => "#ff7f0e",
        Variant::FusedStaged => "#9467bd",
        Variant::FlashTiled => "#8c564b",
        Variant::FlashTileOps => "#e377c2",
        Variant::FlashTileOpsCausal => "#bcbd22",
        Variant::FlashTileOpsL2 => "#7f7f7f",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A tick label without trailing zeros: 0.5, 2, 100.
fn tick_label(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Maps `[lo, hi]` on a log scale to pixels `[a, b]`.
struct LogAxis {
    lo: f64,
    hi: f64,
    a: f64,
    b: f64,
}

impl LogAxis {
    fn px(&self, v: f64) -> f64 {
        let t = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.a + t * (self.b - self.a)
    }
}

/// 1-2-5 ticks inside `[lo, hi]`.
fn ticks_125(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut e = lo.log10().floor() as i32;
    while 10f64.powi(e) <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e);
            if v >= lo * 0.9999 && v <= hi * 1.0001 {
                out.push(v);
            }
        }
        e += 1;
    }
    out
}

/// The plot as an SVG document. `subtitle` names the machine.
pub fn plot(results: &[Measurement], subtitle: &str) -> String {
    let mut s = String::new();
    let ok: Vec<&Measurement> = results.iter().filter(|m| m.best_ms > 0.0).collect();
    let d = ok.first().map_or(0, |m| m.d);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16" font-weight="bold">Attention (D = {d}): best time per call against N</text>"#,
        W / 2.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="44" text-anchor="middle" fill="#555">{}</text>"##,
        W / 2.0,
        esc(subtitle)
    );
    if ok.is_empty() {
        let _ =
            writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">no results</text>"#, W / 2.0, H / 2.0);
        s.push_str("</svg>\n");
        return s;
    }

    let (mut nmin, mut nmax) = (f64::MAX, 0.0f64);
    let (mut tmin, mut tmax) = (f64::MAX, 0.0f64);
    for m in &ok {
        nmin = nmin.min(m.n as f64);
        nmax = nmax.max(m.n as f64);
        tmin = tmin.min(m.best_ms);
        tmax = tmax.max(m.best_ms);
    }
    // a little room around the data; whole 1-2-5 steps on the time axis
    let x = LogAxis { lo: nmin / 1.3, hi: nmax * 1.3, a: LEFT, b: W - RIGHT };
    let ylo = ticks_125(tmin / 10.0, tmin).last().copied().unwrap_or(tmin / 2.0);
    let yhi = ticks_125(tmax, tmax * 10.0).first().copied().unwrap_or(tmax * 2.0);
    let (ylo, yhi) = if yhi / ylo < 4.0 { (ylo / 2.0, yhi * 2.0) } else { (ylo, yhi) };
    let y = LogAxis { lo: ylo, hi: yhi, a: H - BOTTOM, b: TOP };

    // grid and tick labels
    for t in ticks_125(ylo, yhi) {
        let py = y.px(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 8.0,
            py + 4.5,
            tick_label(t)
        );
    }
    let mut ns: Vec<usize> = ok.iter().map(|m| m.n).collect();
    ns.sort_unstable();
    ns.dedup();
    for n in &ns {
        let px = x.px(*n as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#e3e3e3"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{n}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
        W - LEFT - RIGHT,
        H - TOP - BOTTOM
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">N (sequence length, log scale)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 16.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">best time, ms (log scale)</text>"#,
        (TOP + H - BOTTOM) / 2.0
    );

    // one polyline with markers per variant, in first-seen order
    let mut variants: Vec<Variant> = Vec::new();
    for m in &ok {
        if !variants.contains(&m.variant) {
            variants.push(m.variant);
        }
    }
    for &v in &variants {
        let mut pts: Vec<(f64, f64)> =
            ok.iter().filter(|m| m.variant == v).map(|m| (m.n as f64, m.best_ms)).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts.iter().map(|&(n, t)| format!("{:.1},{:.1}", x.px(n), y.px(t))).collect();
        let c = color(v);
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2.5"/>"#,
            path.join(" ")
        );
        for &(n, t) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4.5" fill="{c}"><title>{} N={n}: {t:.3} ms</title></circle>"#,
                x.px(n),
                y.px(t),
                v.name()
            );
        }
    }

    legend(&mut s, &variants);
    s.push_str("</svg>\n");
    s
}

/// The legend, top left inside the plot (times grow with N, so that corner stays empty): one
/// line and marker per variant, in `variants`' order.
fn legend(s: &mut String, variants: &[Variant]) {
    let lh = 22.0;
    let _ = writeln!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="120" height="{:.1}" fill="white" fill-opacity="0.9" stroke="#bbb"/>"##,
        LEFT + 12.0,
        TOP + 12.0,
        lh * variants.len() as f64 + 10.0
    );
    for (i, &v) in variants.iter().enumerate() {
        let ly = TOP + 12.0 + 5.0 + lh * (i as f64 + 0.5);
        let name = v.name();
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="2.5"/><circle cx="{:.1}" cy="{ly:.1}" r="4.5" fill="{c}"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            LEFT + 22.0,
            LEFT + 52.0,
            LEFT + 37.0,
            LEFT + 60.0,
            ly + 4.5,
            c = color(v)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_one_two_five() {
        assert_eq!(ticks_125(1.0, 20.0), [1.0, 2.0, 5.0, 10.0, 20.0]);
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(100.0), "100");
    }
}
