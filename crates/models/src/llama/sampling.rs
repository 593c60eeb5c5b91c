//! Choosing the next token: greedy, or seeded temperature / top-p sampling.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::ops::argmax;

/// How the next token is chosen from the logits.
#[derive(Clone, Debug)]
pub enum Sampler {
    /// The most likely token (first on ties): deterministic.
    Greedy,
    /// Sample from `softmax(logits / temperature)` restricted to the smallest set of tokens
    /// whose probability reaches `top_p`, with a seeded generator: the same seed gives the
    /// same text.
    TopP {
        /// Temperature (> 0).
        temperature: f32,
        /// Nucleus mass in (0, 1].
        top_p: f32,
        /// The generator.
        rng: Box<ChaCha20Rng>,
    },
}

impl Sampler {
    /// Greedy for temperature 0, else seeded top-p sampling.
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Self {
        if temperature <= 0.0 {
            Sampler::Greedy
        } else {
            Sampler::TopP {
                temperature,
                top_p: top_p.clamp(f32::MIN_POSITIVE, 1.0),
                rng: Box::new(ChaCha20Rng::seed_from_u64(seed)),
            }
        }
    }

    /// The next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self {
            Sampler::Greedy => argmax(logits).unwrap_or(0) as u32,
            Sampler::TopP {
                temperature,
                top_p,
                rng,
            } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut probs: Vec<(usize, f64)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i, f64::from((l - max) / *temperature).exp()))
                    .collect();
                // Descending probability, ties by index: a total order, so sampling is
                // reproducible.
                probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let total: f64 = probs.iter().map(|p| p.1).sum();
                let mut kept = 0.0;
                let mut cut = probs.len();
                for (i, p) in probs.iter().enumerate() {
                    kept += p.1 / total;
                    if kept >= f64::from(*top_p) {
                        cut = i + 1;
                        break;
                    }
                }
                let nucleus = &probs[..cut];
                let mass: f64 = nucleus.iter().map(|p| p.1).sum();
                let mut draw = rng.random::<f64>() * mass;
                for &(i, p) in nucleus {
                    draw -= p;
                    if draw <= 0.0 {
                        return i as u32;
                    }
                }
                nucleus.last().map_or(0, |p| p.0 as u32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_top_p_is_seeded() {
        let logits = [0.1, 2.0, 1.9, -5.0];
        assert_eq!(Sampler::new(0.0, 1.0, 1).sample(&logits), 1);
        let draws = |seed| {
            let mut s = Sampler::new(1.0, 0.9, seed);
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        // top_p = 0.9 keeps tokens 1 and 2 (≈ 0.49 + 0.44) and drops the tail.
        assert!(draws(7).iter().all(|&t| t == 1 || t == 2));
        assert!(draws(7).contains(&1) && draws(7).contains(&2));
    }
}
