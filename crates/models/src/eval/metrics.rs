//! Next-token metrics of one position: log-softmax, KL divergence, negative log-likelihood,
//! top-1 agreement, and their running means over a text.
//!
//! Sums run in f64: a vocabulary of 49K terms summed in f32 loses about four digits, and the
//! KL divergences compared here are often below 1e-3 nats.

use serde::Serialize;

/// `ln Σ exp(x)`, computed stably (shifted by the maximum). `-inf` for an empty slice.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f64::from(max);
    }
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    max + sum.ln()
}

/// Writes `log softmax(logits)` into `out` (same length).
pub fn log_softmax_into(logits: &[f32], out: &mut [f32]) {
    let lse = log_sum_exp(logits);
    for (o, &x) in out.iter_mut().zip(logits) {
        *o = (f64::from(x) - lse) as f32;
    }
}

/// `KL(P ‖ Q) = Σ p (ln p − ln q)` in nats, with `P` given by its log-probabilities
/// (`reference_log_probs`) and `Q` by raw logits. Terms with `p = 0` contribute 0.
pub fn kl_divergence(reference_log_probs: &[f32], logits: &[f32]) -> f64 {
    let lse = log_sum_exp(logits);
    reference_log_probs
        .iter()
        .zip(logits)
        .map(|(&lp, &x)| {
            // Q's log-probability rounded to f32 like the stored reference, so that equal
            // logits give exactly 0, not the f32 rounding of P's log-probabilities.
            let lq = f64::from((f64::from(x) - lse) as f32);
            let lp = f64::from(lp);
            let p = lp.exp();
            if p == 0.0 { 0.0 } else { p * (lp - lq) }
        })
        .sum()
}

/// Negative log-likelihood `−ln softmax(logits)[target]` in nats.
pub fn negative_log_likelihood(logits: &[f32], target: usize) -> f64 {
    log_sum_exp(logits) - f64::from(logits[target])
}

/// Index of the largest value (the first one on ties); 0 for an empty slice.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Running sums of the next-token metrics of one allocation over a text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextMetrics {
    positions: usize,
    nll_sum: f64,
    kl_sum: f64,
    kl_max: f64,
    agreements: usize,
}

/// The means of [`TextMetrics`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TextSummary {
    /// Positions scored.
    pub positions: usize,
    /// `exp(mean NLL)` of the text's next tokens.
    pub perplexity: f64,
    /// Mean negative log-likelihood, nats per token.
    pub mean_nll: f64,
    /// Mean `KL(P_ref ‖ P)`, nats.
    pub mean_kl: f64,
    /// Largest per-position KL, nats.
    pub max_kl: f64,
    /// Share of positions whose most likely next token equals the reference's.
    pub top1_agreement: f64,
}

impl TextMetrics {
    /// Adds one position: the reference's log-probabilities, this allocation's logits, and
    /// the token that actually follows in the text.
    pub fn add(&mut self, reference_log_probs: &[f32], logits: &[f32], target: usize) {
        let kl = kl_divergence(reference_log_probs, logits);
        self.positions += 1;
        self.nll_sum += negative_log_likelihood(logits, target);
        self.kl_sum += kl;
        self.kl_max = self.kl_max.max(kl);
        if argmax(reference_log_probs) == argmax(logits) {
            self.agreements += 1;
        }
    }

    /// The means so far (all zero before the first position, perplexity 1).
    pub fn summary(&self) -> TextSummary {
        let n = self.positions.max(1) as f64;
        let mean_nll = self.nll_sum / n;
        TextSummary {
            positions: self.positions,
            perplexity: mean_nll.exp(),
            mean_nll,
            mean_kl: self.kl_sum / n,
            max_kl: self.kl_max,
            top1_agreement: self.agreements as f64 / n,
        }
    }
}
