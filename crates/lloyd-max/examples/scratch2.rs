use tq_lloyd_max::*;
fn main() {
    for b in 1..=8u8 {
        let g = LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 1 }, b).unwrap();
        let mut prev = f64::INFINITY;
        let mut line = format!("b{b}:");
        for d in [16usize, 64, 256, 1024, 4096, 16384] {
            let cb = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: d }, b).unwrap();
            let gap = cb
                .centroids()
                .iter()
                .zip(g.centroids())
                .map(|(c, z)| (c * (d as f64).sqrt() - z).abs())
                .fold(0.0, f64::max);
            line += &format!(
                " d{d} gap {gap:.3e} gap*d {:.4} ratio {:.3};",
                gap * d as f64,
                prev / gap
            );
            prev = gap;
        }
        println!("{line}");
    }
    let cb = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 3 }, 8).unwrap();
    println!(
        "d3 b8 D*4^8-1 = {:e}",
        cb.unit_vector_distortion() * 4f64.powi(8) - 1.0
    );
    for b in 1..=8u8 {
        let cb = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 3 }, b).unwrap();
        let n = cb.levels();
        let e = cb
            .centroids()
            .iter()
            .enumerate()
            .map(|(k, c)| (c - (-1.0 + (2 * k + 1) as f64 / n as f64)).abs())
            .fold(0.0, f64::max);
        println!(
            "d3 b{b} D*4^b-1 = {:e} centroid err {e:e}",
            cb.unit_vector_distortion() * 4f64.powi(b as i32) - 1.0
        );
    }
}
