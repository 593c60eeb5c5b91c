//! The public density helpers against an independent adaptive-Simpson quadrature (which
//! normalizes by its own numerically integrated total mass), against statrs where statrs
//! is accurate, and for their symmetries.

mod common;

use common::Quadrature;
use statrs::function::beta::beta_reg;
use tq_lloyd_max::CoordinateDistribution;

fn laws() -> Vec<CoordinateDistribution> {
    let mut laws: Vec<_> = [3, 4, 5, 7, 64, 128, 1024, 4096, 1 << 20]
        .into_iter()
        .map(|dim| CoordinateDistribution::Beta { dim })
        .collect();
    laws.extend([1, 16, 4096].map(|dim| CoordinateDistribution::Gaussian { dim }));
    laws
}

/// Points at ±0..6 σ, clipped to the support.
fn points(law: CoordinateDistribution) -> Vec<f64> {
    let sigma = law.std_dev();
    (-24..=24)
        .map(|i| (f64::from(i) * 0.25 * sigma).clamp(-1.0, 1.0))
        .collect()
}

/// Adaptive Simpson is run to 1e-14 relative per panel, so 1e-12 absolute on probabilities
/// and 1e-12 σ on partial means leave two orders of margin while catching any error in the
/// normalizing constant, the series or the tail quadrature (a wrong term, a wrong exponent
/// or `Beta(d/2, d/2)` would all be off by ≥ 1e-6).
#[test]
fn cdf_survival_and_partial_mean_match_quadrature() {
    for law in laws() {
        let quadrature = Quadrature::new(law);
        let sigma = law.std_dev();
        for t in points(law) {
            let below = quadrature.mass(f64::NEG_INFINITY, t);
            let cdf = law.cdf(t).expect("valid");
            let survival = law.survival(t).expect("valid");
            assert!(
                (cdf - below).abs() <= 1e-12,
                "{law:?} cdf({t}) = {cdf} vs {below}"
            );
            assert!(
                (survival - (1.0 - below)).abs() <= 1e-12,
                "{law:?} survival({t})"
            );
            let partial = law.partial_mean(t, 3.0 * sigma).expect("valid");
            // partial_mean is oriented; the quadrature integrates over (lo, hi] only.
            let direct = if t <= 3.0 * sigma {
                quadrature.expect(t, 3.0 * sigma, |x| x)
            } else {
                -quadrature.expect(3.0 * sigma, t, |x| x)
            };
            assert!(
                (partial - direct).abs() <= 1e-12 * sigma,
                "{law:?} partial_mean({t}, 3σ) = {partial} vs {direct}"
            );
            let density = law.pdf(t).expect("valid");
            let reference = quadrature.density(t);
            // Both sides are exp of an O(z²) exponent over a total mass good to 1e-14.
            assert!(
                (density - reference).abs() <= 1e-12 * reference,
                "{law:?} pdf({t}) = {density} vs {reference}"
            );
        }
    }
}

/// Deep in the upper tail `survival` keeps relative accuracy (where `1 − cdf` would be 0).
#[test]
fn survival_is_relatively_accurate_in_the_far_tail() {
    for law in [
        CoordinateDistribution::Gaussian { dim: 1 },
        CoordinateDistribution::Beta { dim: 128 },
        CoordinateDistribution::Beta { dim: 4096 },
    ] {
        let quadrature = Quadrature::new(law);
        for z in [4.0, 6.0, 9.0] {
            let t = z * law.std_dev();
            let survival = law.survival(t).expect("valid");
            let reference = quadrature.mass(t, f64::INFINITY);
            assert!(
                ((survival - reference) / reference).abs() <= 1e-11,
                "{law:?} S({z}σ) = {survival:e} vs {reference:e}"
            );
        }
    }
}

/// Agreement with `statrs::function::beta::beta_reg`, `(1+t)/2 ~ Beta((d−1)/2, (d−1)/2)`,
/// for d ≤ 128 where statrs' prefactor `exp(lnΓ(2a) − 2lnΓ(a) + …)` is good to ~1e-13.
#[test]
fn beta_cdf_matches_statrs_incomplete_beta() {
    for dim in [3usize, 4, 5, 10, 64, 128] {
        let law = CoordinateDistribution::Beta { dim };
        let a = (dim as f64 - 1.0) / 2.0;
        for t in points(law) {
            let ours = law.cdf(t).expect("valid");
            let theirs = beta_reg(a, a, (1.0 + t) / 2.0);
            assert!(
                (ours - theirs).abs() <= 1e-12,
                "d={dim} t={t}: {ours} vs statrs {theirs}"
            );
        }
    }
}

#[test]
fn symmetry_and_limits() {
    for law in laws() {
        for t in points(law) {
            let (left, right) = (law.cdf(-t).expect("valid"), law.survival(t).expect("valid"));
            assert!(
                (left - right).abs() <= 1e-15,
                "{law:?}: cdf(−t) = {left} vs survival(t) = {right}"
            );
            assert_eq!(law.pdf(t).expect("valid"), law.pdf(-t).expect("valid"));
            let (a, b) = (
                law.partial_mean(-t, 0.5 * t).expect("valid"),
                law.partial_mean(0.5 * t, -t).expect("valid"),
            );
            assert_eq!(a, -b, "partial_mean is oriented");
        }
        assert_eq!(law.cdf(f64::NEG_INFINITY), Ok(0.0));
        assert_eq!(law.cdf(f64::INFINITY), Ok(1.0));
        assert_eq!(law.cdf(0.0), Ok(0.5));
        // E[X; X > 0] − E[X; X < 0] = E|X|; the mean itself is 0.
        let whole = law
            .partial_mean(f64::NEG_INFINITY, f64::INFINITY)
            .expect("valid");
        assert_eq!(whole, 0.0);
    }
    let beta = CoordinateDistribution::Beta { dim: 10 };
    assert_eq!(beta.pdf(1.5), Ok(0.0));
    assert_eq!(beta.cdf(1.0), Ok(1.0));
    assert_eq!(beta.survival(-1.0), Ok(1.0));
}

#[test]
fn variance_and_dimension() {
    for law in laws() {
        let dim = law.dim() as f64;
        assert_eq!(law.variance(), 1.0 / dim);
        assert!((law.std_dev() - dim.sqrt().recip()).abs() <= f64::EPSILON * law.std_dev());
        // The quadrature's second moment is the stated variance.
        let second = Quadrature::new(law).expect(f64::NEG_INFINITY, f64::INFINITY, |t| t * t);
        assert!(
            ((second - law.variance()) / law.variance()).abs() <= 1e-12,
            "{law:?}: E[X²] = {second}"
        );
    }
}
