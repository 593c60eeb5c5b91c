//! Drawing one scatter plot with its Pareto front, to SVG and to PNG.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::pareto::{Better, pareto_front};

/// The bundled font (see `assets/fonts/README.md`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (960, 640);

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The bundled font did not parse (a corrupted checkout).
    #[error("the bundled font assets/fonts/DejaVuSans.ttf is not a usable TrueType file")]
    Font,
    /// plotters could not draw or write the file.
    #[error("cannot draw {}: {message}", path.display())]
    Draw {
        /// The file being written.
        path: PathBuf,
        /// plotters' message.
        message: String,
    },
}

/// One labelled point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Shown beside the marker (the allocation name).
    pub label: String,
    /// Cost (bits per value): drawn on a log2 axis.
    pub x: f64,
    /// The figure.
    pub y: f64,
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct Scatter<'a> {
    /// Caption.
    pub title: &'a str,
    /// X axis description.
    pub x_label: &'a str,
    /// Y axis description.
    pub y_label: &'a str,
    /// The points.
    pub points: &'a [Point],
    /// Which direction of `y` is better (decides the front).
    pub better: Better,
    /// Log10 `y` axis (values ≤ 0 are drawn at the axis floor).
    pub log_y: bool,
}

fn font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// Writes `plot` to `svg` and `png`.
pub fn write_scatter(plot: &Scatter<'_>, svg: &Path, png: &Path) -> Result<(), PlotError> {
    font()?;
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |message: String| PlotError::Draw { path, message }
    };
    {
        let root = SVGBackend::new(svg, SIZE).into_drawing_area();
        draw(&root, plot).map_err(failed(svg))?;
        root.present().map_err(|e| failed(svg)(e.to_string()))?;
    }
    let root = BitMapBackend::new(png, SIZE).into_drawing_area();
    draw(&root, plot).map_err(failed(png))?;
    root.present().map_err(|e| failed(png)(e.to_string()))?;
    Ok(())
}

/// Axis coordinates: log2 of the cost, and log10 or the plain figure.
fn coordinates(plot: &Scatter<'_>) -> Vec<(f64, f64)> {
    let floor = plot
        .points
        .iter()
        .map(|p| p.y)
        .filter(|y| *y > 0.0 && y.is_finite())
        .fold(f64::INFINITY, f64::min);
    let floor = if floor.is_finite() { floor / 4.0 } else { 1e-6 };
    plot.points
        .iter()
        .map(|p| {
            let y = if plot.log_y {
                p.y.max(floor).log10()
            } else {
                p.y
            };
            (p.x.log2(), y)
        })
        .collect()
}

fn span(values: impl Iterator<Item = f64> + Clone, pad: f64) -> (f64, f64) {
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let width = (hi - lo).max(1e-9);
    (lo - pad * width, hi + pad * width)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    plot: &Scatter<'_>,
) -> Result<(), String> {
    let text = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(text)?;
    let xy = coordinates(plot);
    let finite: Vec<(f64, f64)> = xy
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (x0, x1) = span(finite.iter().map(|p| p.0), 0.12);
    let (y0, y1) = span(finite.iter().map(|p| p.1), 0.12);
    let mut chart = ChartBuilder::on(root)
        .caption(plot.title, (FAMILY, 22))
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(text)?;
    let log_y = plot.log_y;
    let x_format = |v: &f64| format!("{:.2}", 2f64.powf(*v));
    let y_format = move |v: &f64| {
        let value = if log_y { 10f64.powf(*v) } else { *v };
        match value.abs() {
            a if a >= 100.0 => format!("{value:.0}"),
            a if a >= 10.0 => format!("{value:.1}"),
            a if a >= 0.01 || a == 0.0 => format!("{value:.3}"),
            _ => format!("{value:.1e}"),
        }
    };
    chart
        .configure_mesh()
        .x_desc(plot.x_label)
        .y_desc(plot.y_label)
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(text)?;
    let front = pareto_front(&xy, plot.better);
    let front_color = RGBColor(200, 40, 40);
    let other_color = RGBColor(40, 90, 190);
    chart
        .draw_series(LineSeries::new(
            front.iter().map(|&i| xy[i]),
            front_color.stroke_width(2),
        ))
        .map_err(text)?
        .label("Pareto front (filled)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], front_color.stroke_width(2)));
    // Labels of points that nearly coincide are stacked downwards instead of overprinted.
    let near = |a: (f64, f64), b: (f64, f64)| {
        (a.0 - b.0).abs() < 0.08 * (x1 - x0) && (a.1 - b.1).abs() < 0.04 * (y1 - y0)
    };
    for (i, (point, &(x, y))) in plot.points.iter().zip(&xy).enumerate() {
        if !(x.is_finite() && y.is_finite()) {
            continue;
        }
        let crowd = xy[..i].iter().filter(|&&p| near(p, (x, y))).count() as i32;
        let on_front = front.contains(&i);
        let style = if on_front {
            front_color.filled()
        } else {
            other_color.stroke_width(2)
        };
        // A value a log axis cannot show is drawn at the floor and says so in its label.
        let label = if plot.log_y && point.y <= 0.0 {
            format!("{} (= 0)", point.label)
        } else {
            point.label.clone()
        };
        let marker = EmptyElement::at((x, y))
            + Circle::new((0, 0), 6, style)
            + Text::new(label, (9, -16 + 16 * crowd), (FAMILY, 14).into_font());
        chart.draw_series(std::iter::once(marker)).map_err(text)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both files are written with the bundled font (no system font needed): the PNG is a
    /// real PNG of the requested size and the SVG carries every label.
    #[test]
    fn writes_svg_and_png() {
        let dir = std::env::temp_dir().join(format!("tq-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let points = [
            Point {
                label: "f16".into(),
                x: 16.0,
                y: 0.0,
            },
            Point {
                label: "k5v4".into(),
                x: 4.875,
                y: 0.05,
            },
            Point {
                label: "tq2.5".into(),
                x: 3.0,
                y: 0.7,
            },
        ];
        let plot = Scatter {
            title: "test",
            x_label: "bits",
            y_label: "KL",
            points: &points,
            better: Better::Lower,
            log_y: true,
        };
        let (svg, png) = (dir.join("t.svg"), dir.join("t.png"));
        write_scatter(&plot, &svg, &png).unwrap();
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        for label in ["f16 (= 0)", "k5v4", "tq2.5", "Pareto front"] {
            assert!(svg_text.contains(label), "{label} missing from the SVG");
        }
        let png_bytes = std::fs::read(&png).unwrap();
        assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR width and height, big-endian.
        let width = u32::from_be_bytes(png_bytes[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png_bytes[20..24].try_into().unwrap());
        assert_eq!((width, height), SIZE);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
