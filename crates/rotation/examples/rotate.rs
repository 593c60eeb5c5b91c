//! Rotate a vector with both kinds of rotation, undo it, and rebuild a rotation from its
//! saved spec.
//!
//! Run with `cargo run --release -p tq-rotation --example rotate`.

use std::error::Error;

use tq_rotation::{Rotation, RotationKind, RotationSpec};

fn norm(x: &[f32]) -> f32 {
    x.iter().map(|v| v * v).sum::<f32>().sqrt()
}

fn main() -> Result<(), Box<dyn Error>> {
    // A "spiky" vector: all its energy in two coordinates, the worst case for a scalar
    // quantizer. After rotation it is spread over every coordinate.
    let dim = 96;
    let mut x = vec![0.0f32; dim];
    x[3] = 3.0;
    x[70] = -4.0;

    for kind in [RotationKind::Haar, RotationKind::Hadamard] {
        let rotation = Rotation::new(kind, dim, 42)?;
        let mut y = vec![0.0f32; dim];
        rotation.apply(&x, &mut y)?;
        let largest = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));

        let mut back = vec![0.0f32; dim];
        rotation.apply_inverse(&y, &mut back)?;
        let error = x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);

        println!(
            "{kind:?}: ‖x‖ = {:.6}, ‖Πx‖ = {:.6}, largest |(Πx)_j| = {largest:.3} (was 4), \
             max |Πᵀ(Πx) − x| = {error:.1e}",
            norm(&x),
            norm(&y),
        );
    }

    // A cache stores the spec, not the matrix; the spec rebuilds the identical rotation.
    let spec = RotationSpec {
        kind: RotationKind::Hadamard,
        dim,
        seed: 42,
    };
    let saved = serde_json::to_string(&spec)?;
    println!("saved spec: {saved}");
    let rebuilt: RotationSpec = serde_json::from_str(&saved)?;
    let same = rebuilt.build()?.to_dense_f64()
        == Rotation::new(RotationKind::Hadamard, dim, 42)?.to_dense_f64();
    println!("rebuilt rotation identical: {same}");
    Ok(())
}
