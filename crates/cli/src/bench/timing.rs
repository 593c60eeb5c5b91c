//! Wall-clock measurement: contenders run interleaved after a warm-up, and each gets the median
//! of its runs, so a burst of noise on a shared machine hits all of them alike. Each round
//! starts one contender later (A B C, B C A, C A B, ...): a contender that evicts the caches
//! (a slow scalar kernel streaming its own buffers) would otherwise always hand the next one in
//! line a cold cache — `tq bench matmul` showed identical kernels 1.2–1.3× apart that way.

use std::time::Instant;

/// Runs every closure once to warm up, then `repeats` rounds of all of them in turn; returns the
/// median seconds per run of each, in the order given.
pub fn interleaved_medians(repeats: usize, contenders: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for work in contenders.iter_mut() {
        work();
    }
    let count = contenders.len();
    let mut times = vec![Vec::with_capacity(repeats); count];
    for round in 0..repeats.max(1) {
        for k in 0..count {
            let i = (round + k) % count;
            let start = Instant::now();
            contenders[i]();
            times[i].push(start.elapsed().as_secs_f64());
        }
    }
    times
        .into_iter()
        .map(|mut samples| {
            samples.sort_by(f64::total_cmp);
            samples[samples.len() / 2]
        })
        .collect()
}
