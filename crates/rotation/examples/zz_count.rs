use tq_rotation::{Rotation, RotationKind};
fn main() {
    let d: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let reps: usize = std::env::var("REPS").map(|v| v.parse().unwrap()).unwrap_or(200);
    let r = Rotation::new(RotationKind::Hadamard, d, 1).unwrap();
    let m = 64;
    let xs: Vec<f32> = (0..m * d).map(|i| (i % 17) as f32).collect();
    let mut ys = vec![0.0f32; m * d];
    for _ in 0..reps {
        for (x, y) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
            r.apply(x, y).unwrap();
        }
    }
    println!("{}", ys[3]);
}
