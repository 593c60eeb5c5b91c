//! Scatter plots of the sweep (bits per value against a quality or speed figure) with the
//! Pareto front marked, written as SVG and PNG.
//!
//! Text in the PNG is drawn from a bundled font (`assets/fonts/DejaVuSans.ttf`, see the README
//! there) with plotters' pure-Rust `ab_glyph` rasterizer: no system font and no C library is
//! needed, so CI machines without fonts draw the same picture.

pub mod pareto;
pub mod scatter;

pub use pareto::{Better, pareto_front};
pub use scatter::{Point, Scatter, write_scatter};
