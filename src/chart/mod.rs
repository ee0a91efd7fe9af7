//! Figures drawn with plotters: panels of lines against a shared legend ([`Figure`]), and one
//! dot with its spread per labelled row ([`DotChart`]). `murmur plot` and the reproductions'
//! figures both draw through here. The file's extension picks the format: `.png` (a bitmap,
//! text drawn with the font the binary carries, see [`font`]) or `.svg` (text laid out with
//! that font, drawn by the viewer's).

mod font;
mod typeset;

use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, bail};
use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::Ranged;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One entry of a figure's legend: how its lines look.
#[derive(Debug, Clone)]
pub struct Key {
    pub label: String,
    /// Index into the palette (keys may share one: a run's training and validation loss).
    pub colour: usize,
    /// Dashed rather than solid (baselines, for instance).
    pub dashed: bool,
}

/// A line of a panel, drawn as its key says. Points whose y is not finite (a diverged loss)
/// break the line; on a log axis, so do points at or below zero.
#[derive(Debug, Clone, Default)]
pub struct Line {
    /// Index into [`Figure::keys`]: its colour and style.
    pub key: usize,
    pub points: Vec<(f64, f64)>,
    /// A dot at every point (for few points, or points that are means over seeds).
    pub markers: bool,
    /// Vertical bars `(x, low, high)`, e.g. a standard deviation over seeds.
    pub whiskers: Vec<(f64, f64, f64)>,
}

/// One chart of a figure.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    /// The y axis starts at 0 (for totals, which cannot be negative).
    pub y_from_zero: bool,
    pub lines: Vec<Line>,
}

/// Panels stacked top to bottom over one x range, with one legend beside them for all.
#[derive(Debug, Clone, Default)]
pub struct Figure {
    pub title: String,
    pub keys: Vec<Key>,
    pub panels: Vec<Panel>,
}

/// One row of a [`DotChart`]: a value and the range around it.
#[derive(Debug, Clone)]
pub struct Dot {
    pub label: String,
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

/// Labelled rows, top to bottom, each a dot with a whisker: values of many arms side by side.
#[derive(Debug, Clone, Default)]
pub struct DotChart {
    pub title: String,
    pub x_label: String,
    pub dots: Vec<Dot>,
}

/// Something that draws itself on any plotters backend.
trait Drawing {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB>;
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

impl Figure {
    /// Draws the figure to `path` (`.png` or `.svg`), `size` pixels wide and high.
    pub fn save(&self, path: &Path, size: (u32, u32)) -> anyhow::Result<()> {
        save(self, path, size)
    }
}

impl DotChart {
    /// Draws the chart to `path` (`.png` or `.svg`), `width` pixels wide and as high as its
    /// rows need.
    pub fn save(&self, path: &Path, width: u32) -> anyhow::Result<()> {
        save(
            self,
            path,
            (width, 110 + 30 * self.dots.len().max(1) as u32),
        )
    }
}

fn save(drawing: &impl Drawing, path: &Path, size: (u32, u32)) -> anyhow::Result<()> {
    if size.0 < 200 || size.1 < 100 || size.0 > 10_000 || size.1 > 10_000 {
        bail!(
            "a figure of {}x{} pixels is too small or too large (200x100 to 10000x10000)",
            size.0,
            size.1
        );
    }
    let failed = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    // Both backends lay text out with it; the bitmap one draws it too.
    font::register();
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("png") => {
            let root = typeset::Typeset(BitMapBackend::new(path, size)).into_drawing_area();
            drawing
                .draw_on(&root)
                .and_then(|()| root.present())
                .map_err(|e| failed(&e))
        }
        Some(ext) if ext.eq_ignore_ascii_case("svg") => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            drawing
                .draw_on(&root)
                .and_then(|()| root.present())
                .map_err(|e| failed(&e))
        }
        _ => bail!(
            "{}: name the figure .png or .svg (the extension picks the format)",
            path.display()
        ),
    }
}

/// Tableau's ten colours: distinct, and readable on white.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0x79, 0x70, 0x6e),
];

const FONT: &str = "sans-serif";

/// Key `i`'s colour, and whether its line is dashed: past the palette the colours come round
/// again, dashed.
fn look(keys: &[Key], i: usize) -> (RGBColor, bool) {
    let (colour, dashed) = keys.get(i).map_or((0, false), |k| (k.colour, k.dashed));
    (
        PALETTE[colour % PALETTE.len()],
        dashed || colour >= PALETTE.len(),
    )
}

impl Drawing for Figure {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        root.fill(&WHITE)?;
        let root = root.titled(&self.title, (FONT, 24))?;
        let (width, _) = root.dim_in_pixel();
        let longest = self.keys.iter().map(|k| k.label.chars().count()).max();
        // At most a third of the width (at least 66 pixels: figures are 200 wide or more).
        let legend_width = (70 + 9 * longest.unwrap_or(0) as u32).clamp(60, width / 3);
        let (charts, legend) = root.split_horizontally(width - legend_width);
        // One x range for every panel, so that they line up.
        let lines = self.panels.iter().flat_map(|p| &p.lines);
        let x = padded(lines.flat_map(|l| &l.points).map(|p| p.0), false);
        for (panel, area) in self
            .panels
            .iter()
            .zip(charts.split_evenly((self.panels.len().max(1), 1)))
        {
            let x = x.clone();
            let ys = panel.lines.iter().flat_map(|l| {
                let whiskers = l.whiskers.iter().flat_map(|w| [w.1, w.2]);
                l.points.iter().map(|p| p.1).chain(whiskers)
            });
            let mut y = padded(ys, panel.log_y);
            if panel.y_from_zero && !panel.log_y {
                y.start = 0.0;
            }
            if panel.log_y {
                draw_panel(&area, panel, &self.keys, x, y.log_scale())?;
            } else {
                draw_panel(&area, panel, &self.keys, x, y)?;
            }
        }
        // A key shows a dot in the legend if any of its lines has dots.
        let markers: Vec<bool> = (0..self.keys.len())
            .map(|k| {
                let mut lines = self.panels.iter().flat_map(|p| &p.lines);
                lines.any(|l| l.key == k && l.markers)
            })
            .collect();
        draw_legend(&legend, &self.keys, &markers)
    }
}

/// The range that shows `values` with a margin (on a log axis: the positive ones, a factor
/// apart); 0 to 1 when there are none.
fn padded(values: impl Iterator<Item = f64>, log: bool) -> Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return if log { 0.1..1.0 } else { 0.0..1.0 };
    }
    if !log && lo == 0.0 && hi == 0.0 {
        return 0.0..1.0;
    }
    if log {
        let (lo, hi) = if lo == hi {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        return lo / 1.25..hi * 1.25;
    }
    let margin = if lo == hi {
        lo.abs().max(1.0) * 0.5
    } else {
        (hi - lo) * 0.05
    };
    lo - margin..hi + margin
}

/// How every chart's axes look: the fonts, and a light grid at the labelled ticks only.
trait HouseStyle {
    fn house_style(&mut self) -> &mut Self;
}

impl<X: Ranged, Y: Ranged, DB: DrawingBackend> HouseStyle for MeshStyle<'_, '_, X, Y, DB> {
    fn house_style(&mut self) -> &mut Self {
        self.axis_desc_style((FONT, 15))
            .label_style((FONT, 13))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
    }
}

/// A tick's label: whole numbers without decimals, the rest with no more digits than needed.
fn tick(v: &f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e7).contains(&a) {
        format!("{v:.0e}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let digits = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
        let s = format!("{v:.digits$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn draw_panel<DB, Y>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    keys: &[Key],
    x: Range<f64>,
    y: Y,
) -> Drawn<DB>
where
    DB: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(78)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .house_style()
        .draw()?;
    for line in &panel.lines {
        let (colour, dashed) = look(keys, line.key);
        let style = colour.stroke_width(2);
        let shown = |y: f64| y.is_finite() && (!panel.log_y || y > 0.0);
        // A point that cannot be shown breaks the line in two.
        for run in line.points.split(|p| !shown(p.1)) {
            if dashed {
                chart.draw_series(DashedLineSeries::new(run.iter().copied(), 7, 5, style))?;
            } else {
                chart.draw_series(LineSeries::new(run.iter().copied(), style))?;
            }
        }
        if line.markers {
            let dots = line.points.iter().filter(|p| shown(p.1));
            chart.draw_series(dots.map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
        let whiskers = line.whiskers.iter().filter(|w| shown(w.1) && shown(w.2));
        chart.draw_series(
            whiskers.map(|&(x, lo, hi)| PathElement::new(vec![(x, lo), (x, hi)], style)),
        )?;
    }
    Ok(())
}

/// The legend: a sample of each key's line and its label, top to bottom.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    keys: &[Key],
    markers: &[bool],
) -> Drawn<DB> {
    let text = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, key) in keys.iter().enumerate() {
        let y = 50 + 26 * i as i32;
        let (colour, dashed) = look(keys, i);
        let style = colour.stroke_width(2);
        if dashed {
            area.draw(&DashedPathElement::new(vec![(8, y), (44, y)], 7, 5, style))?;
        } else {
            area.draw(&PathElement::new(vec![(8, y), (44, y)], style))?;
        }
        if markers[i] {
            area.draw(&Circle::new((26, y), 4, colour.filled()))?;
        }
        area.draw(&Text::new(key.label.clone(), (52, y), text.clone()))?;
    }
    Ok(())
}

impl Drawing for DotChart {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        root.fill(&WHITE)?;
        let n = self.dots.len();
        let longest = self.dots.iter().map(|d| d.label.chars().count()).max();
        let (width, _) = root.dim_in_pixel();
        let label_width = (20 + 8 * longest.unwrap_or(0) as u32).clamp(60, width / 2);
        let values = self.dots.iter().flat_map(|d| [d.value, d.low, d.high]);
        let x = padded(values, false);
        // Room on the right for the values written beside the dots.
        let x = x.start..x.end + (x.end - x.start) * 0.1;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(label_width)
            .build_cartesian_2d(x, (0..n.saturating_sub(1)).into_segmented())?;
        // Rows 0..n-1, one segment each; row k from the top is dot k.
        let row = |k: usize| SegmentValue::CenterOf(n.saturating_sub(k + 1));
        let label_of = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) if *i < n => {
                self.dots[n - 1 - i].label.clone()
            }
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&label_of)
            .x_desc(&self.x_label)
            .x_label_formatter(&tick)
            .house_style()
            .draw()?;
        let colour = PALETTE[0];
        let text = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        for (k, dot) in self.dots.iter().enumerate() {
            if !(dot.value.is_finite() && dot.low.is_finite() && dot.high.is_finite()) {
                continue;
            }
            chart.draw_series([PathElement::new(
                vec![(dot.low, row(k)), (dot.high, row(k))],
                colour.stroke_width(2),
            )])?;
            chart.draw_series([Circle::new((dot.value, row(k)), 5, colour.filled())])?;
            let at = chart.backend_coord(&(dot.high, row(k)));
            root.draw(&Text::new(
                format!("{:.2}", dot.value),
                (at.0 + 8, at.1),
                text.clone(),
            ))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_figures_and_empty_ones_draw_and_bad_sizes_are_refused() {
        let dir = std::env::temp_dir().join(format!("murmur-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let figure = Figure {
            title: "a long title that does not fit".into(),
            keys: vec![Key {
                label: "a label far longer than a third of the width".into(),
                colour: 12,
                dashed: false,
            }],
            panels: vec![Panel {
                log_y: true,
                lines: vec![Line {
                    points: vec![(0.0, 0.0), (1.0, f64::NAN), (2.0, 1e-3), (3.0, 1e3)],
                    markers: true,
                    ..Line::default()
                }],
                ..Panel::default()
            }],
        };
        for (name, size) in [("small.png", (200, 100)), ("small.svg", (200, 100))] {
            figure.save(&dir.join(name), size).unwrap();
        }
        Figure::default()
            .save(&dir.join("empty.png"), (400, 300))
            .unwrap();
        DotChart::default()
            .save(&dir.join("dots.png"), 200)
            .unwrap();
        for size in [(199, 300), (400, 99), (10_001, 300)] {
            let err = figure
                .save(&dir.join("bad.png"), size)
                .unwrap_err()
                .to_string();
            assert!(err.contains("too small or too large"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
