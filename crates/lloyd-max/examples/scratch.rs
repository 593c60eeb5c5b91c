use std::time::Instant;
use tq_lloyd_max::*;
fn main() {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("crates/lloyd-max/tests/data/lloyd_max.json").unwrap(),
    )
    .unwrap();
    for b in 1..=8u8 {
        let r = &json["gaussian_N01"][format!("b{b}")];
        let cb = LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 1 }, b).unwrap();
        let maxd = cb
            .centroids()
            .iter()
            .zip(r["centroids"].as_array().unwrap())
            .map(|(a, b)| (a - b.as_f64().unwrap()).abs())
            .fold(0.0, f64::max);
        println!(
            "gauss b{b} maxdiff {maxd:e} mse diff {:e}",
            cb.mse_per_coordinate() - r["mse_per_coord"].as_f64().unwrap()
        );
    }
    for d in [64usize, 128] {
        for b in 1..=4u8 {
            let r = &json["sphere_coordinate"][format!("d{d}")][format!("b{b}")];
            let cb = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: d }, b).unwrap();
            let maxd = cb
                .centroids()
                .iter()
                .zip(r["centroids"].as_array().unwrap())
                .map(|(a, b)| (a - b.as_f64().unwrap()).abs())
                .fold(0.0, f64::max);
            println!(
                "beta d{d} b{b} maxdiff {maxd:e} (sigma units {:e}) mse diff {:e} D={}",
                maxd * (d as f64).sqrt(),
                cb.mse_per_coordinate() - r["mse_per_coord"].as_f64().unwrap(),
                cb.unit_vector_distortion()
            );
        }
    }
    for d in [
        3usize,
        4,
        5,
        6,
        7,
        16,
        64,
        128,
        1024,
        4096,
        65536,
        1_000_000,
        100_000_000,
    ] {
        let mut line = format!("d={d}:");
        for b in 1..=8u8 {
            let t = Instant::now();
            match LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: d }, b) {
                Ok(cb) => {
                    line += &format!(
                        " b{b} {:.4}us D*4^b={:.6}",
                        t.elapsed().as_secs_f64() * 1e6,
                        cb.unit_vector_distortion() * 4f64.powi(b as i32)
                    )
                }
                Err(e) => line += &format!(" b{b} ERR {e}"),
            }
        }
        println!("{line}");
    }
}
