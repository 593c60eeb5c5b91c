use tq_lloyd_max::*;
fn main() {
    for d in [4usize, 64, 4096] {
        let law = CoordinateDistribution::Beta{dim:d};
        for i in 0..=24 { let t = (i as f64)*0.25/(d as f64).sqrt(); if t >= 1.0 {break;} println!("{d} {t:.17e} {:.17e}", law.survival(t).unwrap()); }
    }
}
