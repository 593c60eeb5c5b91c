use tq_rotation::{Rotation, RotationKind};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let d: usize = args[1].parse().unwrap();
    let kind = if args.len() > 2 {
        RotationKind::Haar
    } else {
        RotationKind::Hadamard
    };
    let r = Rotation::new(kind, d, 1).unwrap();
    let m = 64;
    let xs: Vec<f32> = (0..m * d).map(|i| (i % 17) as f32).collect();
    let mut ys = vec![0.0f32; m * d];
    let reps: usize = std::env::var("REPS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(200);
    for _ in 0..reps {
        for (x, y) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
            r.apply(x, y).unwrap();
        }
    }
    println!("{}", ys[3]);
}
