//! Sketch a residual with each kind, estimate inner products, and compare scales.
//!
//! `cargo run --release -p tq-qjl --example sketch`

use tq_qjl::{QjlError, QjlSpec, SketchKind, SketchScale, asymptotic_bias_factor};

fn main() -> Result<(), QjlError> {
    let d = 128;
    // A residual r and a query y at cosine ~0.7 to it (shape (d,) each).
    let r: Vec<f32> = (0..d)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 11.0)
        .collect();
    let noise: Vec<f32> = (0..d)
        .map(|i| ((i * 53 % 29) as f32 - 14.0) / 14.0)
        .collect();
    let y: Vec<f32> = r.iter().zip(&noise).map(|(a, b)| a + 0.8 * b).collect();
    let exact: f32 = r.iter().zip(&y).map(|(a, b)| a * b).sum();

    println!("d = {d}, exact <y, r> = {exact:.4}");
    println!("kind      scale       bits  mean of 2000 estimates  relative error of one");
    for (kind, scale) in [
        (SketchKind::Gaussian, SketchScale::Paper),
        (SketchKind::Haar, SketchScale::Exact),
        (SketchKind::Haar, SketchScale::Asymptotic),
        (SketchKind::Hadamard, SketchScale::Exact),
    ] {
        let draws = 2000u64;
        let mut sum = 0.0f64;
        let mut first = 0.0f32;
        for seed in 0..draws {
            let sketch = QjlSpec::new(kind, d, seed).with_scale(scale).build()?;
            // The stored part: d sign bits in ceil(d/32) words, plus gamma.
            let mut scratch = vec![0.0f32; sketch.rows()];
            let mut bits = vec![0u32; sketch.words()];
            let gamma = sketch.encode(&r, &mut scratch, &mut bits)?;
            // The query side: projected once, never quantized.
            let mut projected = vec![0.0f32; sketch.rows()];
            sketch.project(&y, &mut projected)?;
            let estimate = sketch.estimate_inner_product(&projected, &bits, gamma);
            if seed == 0 {
                first = estimate;
            }
            sum += f64::from(estimate);
        }
        println!(
            "{:<9} {:<11} {:>4}  {:>22.4}  {:>20.3}",
            format!("{kind:?}"),
            format!("{scale:?}"),
            d,
            sum / draws as f64,
            (first - exact) / exact
        );
    }
    println!(
        "asymptotic scale bias factor kappa at d = {d}: {:.6}",
        asymptotic_bias_factor(d)
    );
    let haar = QjlSpec::new(SketchKind::Haar, d, 0).build()?;
    println!(
        "MMSE shrinkage for Haar/exact: {:.5} (2/pi = {:.5})",
        haar.mmse_shrinkage().unwrap_or(1.0),
        2.0 / std::f64::consts::PI
    );
    Ok(())
}
