//! Wall-clock measurement: contenders run interleaved (A B A B ...) after a warm-up, and each
//! gets the median of its runs, so a burst of noise on a shared machine hits all of them alike.

use std::time::Instant;

/// Runs every closure once to warm up, then `repeats` rounds of all of them in turn; returns the
/// median seconds per run of each, in the order given.
pub fn interleaved_medians(repeats: usize, contenders: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for work in contenders.iter_mut() {
        work();
    }
    let mut times = vec![Vec::with_capacity(repeats); contenders.len()];
    for _ in 0..repeats.max(1) {
        for (work, samples) in contenders.iter_mut().zip(times.iter_mut()) {
            let start = Instant::now();
            work();
            samples.push(start.elapsed().as_secs_f64());
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
