use std::time::Instant;
use tq_rotation::{Rotation, RotationKind};
fn main() {
    for kind in [RotationKind::Hadamard, RotationKind::Haar] {
        for d in [64usize, 96, 128, 256] {
            let r = Rotation::new(kind, d, 1).unwrap();
            let m = 64;
            let xs: Vec<f32> = (0..m * d).map(|i| (i % 17) as f32).collect();
            let mut ys = vec![0.0f32; m * d];
            let mut best = f64::MAX;
            for _ in 0..15 {
                let t = Instant::now();
                let reps = if kind == RotationKind::Haar { 100 } else { 1000 };
                for _ in 0..reps {
                    for (x, y) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
                        r.apply(x, y).unwrap();
                    }
                }
                best = best.min(t.elapsed().as_nanos() as f64 / (reps * m) as f64);
            }
            println!("{kind:?} d={d}: {best:.1} ns/vec {}", ys[5]);
        }
    }
}
