use tq_rotation::{Rotation, RotationKind};
fn main() {
    for seed in 0..2 {
        let d = 6;
        let m = Rotation::new(RotationKind::Hadamard, d, seed)
            .unwrap()
            .to_dense_f64();
        for r in m.chunks(d) {
            println!(
                "{:?}",
                r.iter().map(|v| format!("{v:7.4}")).collect::<Vec<_>>()
            );
        }
        println!();
    }
}
