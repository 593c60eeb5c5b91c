//! KL divergence against a base run, stored and summarized the way the reference engine's
//! `llama-perplexity --kl-divergence` does, so the figures compare with its published rows.
//!
//! The base (f16-cache) run keeps, per scored position, the log-softmax of its logits quantized
//! to `u16` over the window `[max − 16, max]` nats ([`BaseLogProbs`]): 2 bytes per vocabulary
//! entry instead of 4, which is what lets a 49K vocabulary at 4K context stay in memory
//! (2047 positions × 49 152 × 2 = 200 MB). The run under test then adds, per position,
//! `KL = Σ_{i: ln p_base,i > −16} p_base,i · (ln p_base,i − ln q_i)` with `ln q` its exact
//! log-softmax, and whether its argmax equals the base's ([`KldStats`]). Entries below −16 nats
//! are dropped, as the reference engine drops them: they weigh less than 1.2e-7 each.

use serde::Serialize;

use super::metrics::log_sum_exp;

/// Log-probabilities below `max − WINDOW` nats are clamped to the window's floor.
pub const WINDOW: f32 = 16.0;

/// The quantized log-softmax of one base position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BaseLogProbs {
    /// Nats per `u16` step: `(max − floor) / 65535`, 0 when every logit is equal.
    scale: f32,
    /// The log-probability of step 0 (the floor).
    min_log_prob: f32,
    /// Steps above the floor, one per vocabulary entry.
    steps: Vec<u16>,
}

impl BaseLogProbs {
    /// Quantizes the log-softmax of `logits` (one position's row) into `self`, reusing its
    /// buffer, and returns the row's negative log-likelihood of `target` (exact, f64).
    ///
    /// Step `i` is `round((logit_i − floor) / scale)` with `floor = max(min logit, max − 16)`;
    /// entries at or below the floor get step 0. The reference engine rounds with the
    /// `1.5·2²³` trick (round half to even), which `f32::round_ties_even` reproduces.
    pub fn quantize(&mut self, logits: &[f32], target: usize) -> f64 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = logits.iter().copied().fold(f32::INFINITY, f32::min);
        let floor = min.max(max - WINDOW);
        let lse = log_sum_exp(logits);
        // The engine keeps `ln Σ exp(x − max)` in f32 and forms the floor's log-probability
        // in f32: the same here, so a decoded entry is what its file would hold.
        let log_sum = (lse - f64::from(max)) as f32;
        self.min_log_prob = floor - max - log_sum;
        self.scale = (max - floor) / 65535.0;
        self.steps.clear();
        if self.scale > 0.0 {
            let inverse = 1.0 / self.scale;
            self.steps.extend(logits.iter().map(|&x| {
                if x > floor {
                    (inverse * (x - floor)).round_ties_even() as u16
                } else {
                    0
                }
            }));
        } else {
            self.steps.resize(logits.len(), 0);
        }
        lse - f64::from(logits[target])
    }

    /// The stored log-probability of entry `i`.
    pub fn log_prob(&self, i: usize) -> f32 {
        self.scale * f32::from(self.steps[i]) + self.min_log_prob
    }

    /// Vocabulary entries stored.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether nothing is stored yet.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The first entry of largest stored log-probability.
    pub fn argmax(&self) -> usize {
        let mut best = 0;
        for (i, &s) in self.steps.iter().enumerate() {
            if s > self.steps[best] {
                best = i;
            }
        }
        best
    }

    /// `KL(base ‖ q)` in nats, `q` given by its raw `logits`; entries whose stored
    /// log-probability is at or below −16 nats are skipped (the engine's rule).
    pub fn kl_divergence(&self, logits: &[f32]) -> f64 {
        let lse = log_sum_exp(logits);
        (0..self.steps.len())
            .map(|i| {
                let lp = self.log_prob(i);
                if lp > -WINDOW {
                    let lp = f64::from(lp);
                    lp.exp() * (lp - (f64::from(logits[i]) - lse))
                } else {
                    0.0
                }
            })
            .sum()
    }
}

/// Running KL divergence, perplexity and top-token agreement of one allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KldStats {
    nll_sum: f64,
    nll_sq_sum: f64,
    kld: Vec<f64>,
    same_top: usize,
    count: usize,
}

/// What [`KldStats::summary`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KldSummary {
    /// Scored tokens.
    pub count: usize,
    /// `exp(mean NLL)`.
    pub ppl: f64,
    /// `ppl · sqrt((mean(NLL²) − mean(NLL)²) / (N − 1))`: the engine's "±".
    pub ppl_err: f64,
    /// Mean KL divergence, nats (`None` when no base was compared).
    pub kld_mean: Option<f64>,
    /// Its standard error, `sqrt((mean(KL²) − mean(KL)²) / (N − 1))`.
    pub kld_err: Option<f64>,
    /// Median per-token KL divergence.
    pub kld_median: Option<f64>,
    /// 99th percentile (linear interpolation on the sorted values).
    pub kld_p99: Option<f64>,
    /// Largest per-token KL divergence.
    pub kld_max: Option<f64>,
    /// Percentage of tokens whose argmax equals the base's.
    pub same_top_p: Option<f64>,
}

impl KldStats {
    /// Adds a token scored without a base: its negative log-likelihood only.
    pub fn add_nll(&mut self, nll: f64) {
        self.nll_sum += nll;
        self.nll_sq_sum += nll * nll;
        self.count += 1;
    }

    /// Adds a token scored against `base`: its NLL, KL divergence and top-token agreement.
    pub fn add(&mut self, base: &BaseLogProbs, logits: &[f32], nll: f64) {
        self.add_nll(nll);
        self.kld.push(base.kl_divergence(logits));
        if base.argmax() == super::metrics::argmax(logits) {
            self.same_top += 1;
        }
    }

    /// Adds a token of the base run itself: KL 0 and the same top token by definition (the
    /// engine reports its base rows that way).
    pub fn add_base(&mut self, nll: f64) {
        self.add_nll(nll);
        self.kld.push(0.0);
        self.same_top += 1;
    }

    /// The figures so far.
    pub fn summary(&self) -> KldSummary {
        let n = self.count.max(1) as f64;
        let mean = self.nll_sum / n;
        let ppl = mean.exp();
        let spread = |sum: f64, sq: f64| {
            let var = sq / n - (sum / n) * (sum / n);
            if var > 0.0 && self.count > 1 {
                (var / (n - 1.0)).sqrt()
            } else {
                0.0
            }
        };
        let ppl_err = ppl * spread(self.nll_sum, self.nll_sq_sum);
        if self.kld.is_empty() {
            return KldSummary {
                count: self.count,
                ppl,
                ppl_err,
                kld_mean: None,
                kld_err: None,
                kld_median: None,
                kld_p99: None,
                kld_max: None,
                same_top_p: None,
            };
        }
        let sum: f64 = self.kld.iter().sum();
        let sq: f64 = self.kld.iter().map(|k| k * k).sum();
        let mut sorted = self.kld.clone();
        sorted.sort_by(f64::total_cmp);
        KldSummary {
            count: self.count,
            ppl,
            ppl_err,
            kld_mean: Some(sum / n),
            kld_err: Some(spread(sum, sq)),
            kld_median: Some(percentile(&sorted, 0.5)),
            kld_p99: Some(percentile(&sorted, 0.99)),
            kld_max: sorted.last().copied(),
            same_top_p: Some(100.0 * self.same_top as f64 / n),
        }
    }
}

/// The `fraction` quantile of ascending `sorted` values, linearly interpolated between the
/// two nearest ranks (`fraction · (n − 1)`), as the reference engine computes its percentiles;
/// at 0.5 it is the usual median (the mean of the two middle values for an even count).
/// 0 for an empty slice.
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    match sorted {
        [] => 0.0,
        [only] => *only,
        _ => {
            let rank = fraction.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
            let low = rank.floor() as usize;
            let high = (low + 1).min(sorted.len() - 1);
            let t = rank - low as f64;
            (1.0 - t) * sorted[low] + t * sorted[high]
        }
    }
}
