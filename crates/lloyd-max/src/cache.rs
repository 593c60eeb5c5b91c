//! The process-wide codebook cache: each `(distribution, bits)` is solved at most once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::{CoordinateDistribution, LloydMaxCodebook, LloydMaxError};

type Key = (CoordinateDistribution, u8);

static CODEBOOKS: OnceLock<Mutex<HashMap<Key, Arc<LloydMaxCodebook>>>> = OnceLock::new();

impl LloydMaxCodebook {
    /// The shared codebook for `(distribution, bits)`, solved on first use and then returned
    /// from a process-wide cache (the same `Arc` every time). Errors are not cached.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
    ///
    /// let law = CoordinateDistribution::Beta { dim: 64 };
    /// let first = LloydMaxCodebook::cached(law, 3)?;
    /// let again = LloydMaxCodebook::cached(law, 3)?;
    /// assert!(Arc::ptr_eq(&first, &again));
    /// # Ok::<(), tq_lloyd_max::LloydMaxError>(())
    /// ```
    pub fn cached(
        distribution: CoordinateDistribution,
        bits: u8,
    ) -> Result<Arc<Self>, LloydMaxError> {
        let codebooks = CODEBOOKS.get_or_init(Mutex::default);
        // A panic elsewhere while holding the lock cannot leave the map half-updated (insert
        // is the only mutation), so a poisoned lock is safe to keep using.
        let mut codebooks = codebooks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(codebook) = codebooks.get(&(distribution, bits)) {
            return Ok(Arc::clone(codebook));
        }
        // Solving under the lock (milliseconds) is what makes "at most once" hold when
        // several threads ask for the same codebook at the same time.
        let codebook = Arc::new(Self::new(distribution, bits)?);
        codebooks.insert((distribution, bits), Arc::clone(&codebook));
        Ok(codebook)
    }
}
