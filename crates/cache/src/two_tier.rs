//! Two-tier storage of a head: the outlier channels and the rest, each with its own codec.
//!
//! A few channels of real keys carry much more energy than the others. Quantizing them
//! together makes the norm, and so every code's step, follow the outliers; TurboQuant's KV
//! experiments instead pick the top-k channels by L2 norm over the prefill tokens (per head)
//! and give each set its own rotation, codebook (for its own dimension) and norm, usually with
//! more bits for the outliers.
//!
//! A token's record is the outlier tier's record followed by the rest tier's, and its f16
//! scales likewise, so the bytes per token are exactly the sum of the two codecs'. The channel
//! list is per-head metadata, stored once, not per token.

use half::f16;

use crate::codec::{CodecError, CodecScratch};
use crate::{CodecSpec, TokenCodec};

/// Why outlier channels could not be selected or a two-tier codec built.
#[derive(Debug, thiserror::Error)]
pub enum TwoTierError {
    /// The token matrix is not `[n, head_dim]`.
    #[error("tokens: length {len} is not a multiple of head_dim {head_dim}")]
    TokensShape {
        /// Length of the token slice.
        len: usize,
        /// The head dimension.
        head_dim: usize,
    },
    /// A token holds NaN or ±Inf, so channel norms cannot be ranked.
    #[error("tokens: value at token {token}, channel {channel} is not finite ({value})")]
    NonFinite {
        /// Token index.
        token: usize,
        /// Channel index.
        channel: usize,
        /// The value.
        value: f32,
    },
    /// The tier sizes do not leave at least one channel to each tier, or exceed `u16` indices.
    #[error(
        "{channels} outlier channels do not fit head_dim {head_dim} \
         (need 1 <= channels < head_dim <= 65536)"
    )]
    ChannelCount {
        /// Outlier channels asked for.
        channels: usize,
        /// The head dimension.
        head_dim: usize,
    },
    /// The outlier channel list is not strictly increasing or leaves the head.
    #[error("outlier channels must be strictly increasing and below head_dim {head_dim}: {reason}")]
    BadChannels {
        /// The head dimension.
        head_dim: usize,
        /// What is wrong, with the offending position.
        reason: String,
    },
    /// A tier's codec does not match the channels it is given.
    #[error("the {tier} tier codec has dimension {actual}, expected {expected}")]
    TierDim {
        /// `outlier` or `rest`.
        tier: &'static str,
        /// The dimension the channel split requires.
        expected: usize,
        /// The codec's dimension.
        actual: usize,
    },
    /// Building a tier's codec failed.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// The `k` channels with the largest L2 norm over `tokens` (`[n, head_dim]` row-major),
/// returned sorted ascending. Ties go to the lower channel index, so the result is a pure
/// function of the input. Sums of squares are accumulated in f64.
///
/// ```
/// use tq_cache::two_tier::select_outlier_channels;
/// // Two tokens of dimension 4; channel 2 is the loudest, then channel 0.
/// let tokens = [1.0, 0.1, -5.0, 0.2, -2.0, 0.0, 4.0, 0.3];
/// assert_eq!(select_outlier_channels(&tokens, 4, 2)?, vec![0, 2]);
/// # Ok::<(), tq_cache::two_tier::TwoTierError>(())
/// ```
pub fn select_outlier_channels(
    tokens: &[f32],
    head_dim: usize,
    k: usize,
) -> Result<Vec<u16>, TwoTierError> {
    check_count(k, head_dim)?;
    if !tokens.len().is_multiple_of(head_dim) {
        return Err(TwoTierError::TokensShape {
            len: tokens.len(),
            head_dim,
        });
    }
    let mut energy = vec![0.0f64; head_dim];
    for (token, row) in tokens.chunks_exact(head_dim).enumerate() {
        for (channel, (&v, e)) in row.iter().zip(&mut energy).enumerate() {
            if !v.is_finite() {
                return Err(TwoTierError::NonFinite {
                    token,
                    channel,
                    value: v,
                });
            }
            *e += f64::from(v) * f64::from(v);
        }
    }
    let mut order: Vec<usize> = (0..head_dim).collect();
    // Sum of squares ranks like the L2 norm; the index breaks ties deterministically.
    order.sort_by(|&a, &b| energy[b].total_cmp(&energy[a]).then(a.cmp(&b)));
    // `check_count` bounds head_dim by 65536, so every index fits in u16.
    let mut channels: Vec<u16> = order[..k].iter().map(|&c| c as u16).collect();
    channels.sort_unstable();
    Ok(channels)
}

fn check_count(channels: usize, head_dim: usize) -> Result<(), TwoTierError> {
    if channels == 0 || channels >= head_dim || head_dim > usize::from(u16::MAX) + 1 {
        return Err(TwoTierError::ChannelCount { channels, head_dim });
    }
    Ok(())
}

/// A head stored in two tiers: the outlier channels with one codec, the rest with another.
///
/// ```
/// use half::f16;
/// use tq_cache::CodecSpec;
/// use tq_cache::codec::MseSpec;
/// use tq_cache::two_tier::{select_outlier_channels, TwoTierCodec, TwoTierScratch};
///
/// let head_dim = 64;
/// let prefill: Vec<f32> = (0..8 * head_dim)
///     .map(|i| if i % head_dim < 2 { 20.0 } else { (i as f32 * 0.7).sin() })
///     .collect();
/// let channels = select_outlier_channels(&prefill, head_dim, 16)?;
/// let codec = TwoTierCodec::new(
///     channels,
///     &CodecSpec::Mse(MseSpec::new(16, 4, 1)),
///     &CodecSpec::Mse(MseSpec::new(48, 3, 2)),
/// )?;
/// assert_eq!(codec.bytes_per_token(), (2 * 4 + 2) + (5 * 4 + 2));
///
/// let mut scratch = TwoTierScratch::new(&codec);
/// let mut record = vec![0u32; codec.record_words()];
/// let mut scales = vec![f16::ZERO; codec.scales_per_token()];
/// let x = &prefill[..head_dim];
/// codec.encode_into(x, &mut scratch, &mut record, &mut scales)?;
/// let mut y = vec![0.0; head_dim];
/// codec.decode_into(&record, &scales, &mut scratch, &mut y)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct TwoTierCodec {
    /// Sorted outlier channel indices (`outlier.dim()` of them).
    channels: Vec<u16>,
    /// The complement of `channels`, sorted (`rest.dim()` of them).
    rest_channels: Vec<u16>,
    outlier: TokenCodec,
    rest: TokenCodec,
}

/// Caller-owned buffers for [`TwoTierCodec`]: each tier's codec scratch and the gathered
/// channel values, so encoding and decoding allocate nothing.
#[derive(Clone, Debug)]
pub struct TwoTierScratch {
    outlier: CodecScratch,
    rest: CodecScratch,
    /// The outlier channels of one vector, `[k]`.
    outlier_values: Vec<f32>,
    /// The other channels of one vector, `[head_dim − k]`.
    rest_values: Vec<f32>,
}

impl TwoTierScratch {
    /// Buffers for `codec`.
    pub fn new(codec: &TwoTierCodec) -> Self {
        let (k, r) = (codec.channels.len(), codec.rest_channels.len());
        Self {
            outlier: CodecScratch::new(k),
            rest: CodecScratch::new(r),
            outlier_values: vec![0.0; k],
            rest_values: vec![0.0; r],
        }
    }

    /// Whether these buffers have the tier sizes of `codec`.
    pub(crate) fn fits(&self, codec: &TwoTierCodec) -> bool {
        self.check(codec).is_ok()
    }

    fn check(&self, codec: &TwoTierCodec) -> Result<(), CodecError> {
        let buffers = [
            (
                "two-tier scratch (outlier channels)",
                codec.channels.len(),
                self.outlier_values.len(),
            ),
            (
                "two-tier scratch (rest channels)",
                codec.rest_channels.len(),
                self.rest_values.len(),
            ),
        ];
        match buffers
            .into_iter()
            .find(|(_, expected, actual)| expected != actual)
        {
            Some((what, expected, actual)) => Err(CodecError::LengthMismatch {
                what,
                expected,
                actual,
            }),
            None => Ok(()),
        }
    }
}

impl TwoTierCodec {
    /// Builds both tiers. `channels` must be strictly increasing, below the head dimension
    /// `outlier.dim() + rest.dim()`, and exactly `outlier.dim()` long.
    pub fn new(
        channels: Vec<u16>,
        outlier: &CodecSpec,
        rest: &CodecSpec,
    ) -> Result<Self, TwoTierError> {
        let head_dim = outlier.dim() + rest.dim();
        check_count(channels.len(), head_dim)?;
        if outlier.dim() != channels.len() {
            return Err(TwoTierError::TierDim {
                tier: "outlier",
                expected: channels.len(),
                actual: outlier.dim(),
            });
        }
        if let Some(i) = channels.windows(2).position(|w| w[0] >= w[1]) {
            return Err(TwoTierError::BadChannels {
                head_dim,
                reason: format!(
                    "channels[{}] = {} is not above channels[{i}] = {}",
                    i + 1,
                    channels[i + 1],
                    channels[i]
                ),
            });
        }
        if let Some(&last) = channels.last().filter(|&&c| usize::from(c) >= head_dim) {
            return Err(TwoTierError::BadChannels {
                head_dim,
                reason: format!("channel {last} is outside the head"),
            });
        }
        let rest_channels = (0..head_dim)
            .map(|c| c as u16)
            .filter(|c| channels.binary_search(c).is_err())
            .collect();
        Ok(Self {
            channels,
            rest_channels,
            outlier: TokenCodec::new(outlier)?,
            rest: TokenCodec::new(rest)?,
        })
    }

    /// The head dimension.
    pub fn head_dim(&self) -> usize {
        self.channels.len() + self.rest_channels.len()
    }

    /// The sorted outlier channel indices.
    pub fn channels(&self) -> &[u16] {
        &self.channels
    }

    /// The sorted indices of the other channels.
    pub fn rest_channels(&self) -> &[u16] {
        &self.rest_channels
    }

    /// The outlier tier's codec.
    pub fn outlier(&self) -> &TokenCodec {
        &self.outlier
    }

    /// The rest tier's codec.
    pub fn rest(&self) -> &TokenCodec {
        &self.rest
    }

    /// `u32` words per token record: the outlier tier's, then the rest tier's.
    pub fn record_words(&self) -> usize {
        self.outlier.record_words() + self.rest.record_words()
    }

    /// f16 scales per token: the outlier tier's, then the rest tier's.
    pub fn scales_per_token(&self) -> usize {
        self.outlier.scales_per_token() + self.rest.scales_per_token()
    }

    /// Bytes one token costs: `4·record_words + 2·scales_per_token`, the two tiers' sum.
    pub fn bytes_per_token(&self) -> usize {
        4 * self.record_words() + 2 * self.scales_per_token()
    }

    /// Bytes stored once per head: the channel list as `u16`.
    pub fn metadata_bytes(&self) -> usize {
        2 * self.channels.len()
    }

    /// Stored bits per coordinate per token (`8·bytes_per_token / head_dim`).
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.bytes_per_token() as f64 / self.head_dim() as f64
    }

    /// Encodes `x` (`[head_dim]`): gathers each tier's channels and encodes them into the
    /// tier's part of `record` and `scales`. Allocation-free.
    pub fn encode_into(
        &self,
        x: &[f32],
        scratch: &mut TwoTierScratch,
        record: &mut [u32],
        scales: &mut [f16],
    ) -> Result<(), CodecError> {
        self.check_lengths(x.len(), "input vector", record, scales)?;
        scratch.check(self)?;
        // Checked here so the error names the head's channel, not a tier-local index.
        if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CodecError::NonFinite { index, value });
        }
        gather(x, &self.channels, &mut scratch.outlier_values);
        gather(x, &self.rest_channels, &mut scratch.rest_values);
        let (outlier_record, rest_record) = record.split_at_mut(self.outlier.record_words());
        let (outlier_scales, rest_scales) = scales.split_at_mut(self.outlier.scales_per_token());
        self.outlier.encode_into(
            &scratch.outlier_values,
            &mut scratch.outlier,
            outlier_record,
            outlier_scales,
        )?;
        self.rest.encode_into(
            &scratch.rest_values,
            &mut scratch.rest,
            rest_record,
            rest_scales,
        )
    }

    /// Decodes a record into `out` (`[head_dim]`): decodes each tier and scatters its
    /// channels back. Allocation-free.
    pub fn decode_into(
        &self,
        record: &[u32],
        scales: &[f16],
        scratch: &mut TwoTierScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        self.check_lengths(out.len(), "decoded vector", record, scales)?;
        scratch.check(self)?;
        let (outlier_record, rest_record) = record.split_at(self.outlier.record_words());
        let (outlier_scales, rest_scales) = scales.split_at(self.outlier.scales_per_token());
        self.outlier.decode_into(
            outlier_record,
            outlier_scales,
            &mut scratch.outlier,
            &mut scratch.outlier_values,
        )?;
        self.rest.decode_into(
            rest_record,
            rest_scales,
            &mut scratch.rest,
            &mut scratch.rest_values,
        )?;
        scatter(&scratch.outlier_values, &self.channels, out);
        scatter(&scratch.rest_values, &self.rest_channels, out);
        Ok(())
    }

    fn check_lengths(
        &self,
        vector_len: usize,
        what: &'static str,
        record: &[u32],
        scales: &[f16],
    ) -> Result<(), CodecError> {
        let checks = [
            (what, self.head_dim(), vector_len),
            ("token record", self.record_words(), record.len()),
            ("token scales", self.scales_per_token(), scales.len()),
        ];
        match checks
            .into_iter()
            .find(|(_, expected, actual)| expected != actual)
        {
            Some((what, expected, actual)) => Err(CodecError::LengthMismatch {
                what,
                expected,
                actual,
            }),
            None => Ok(()),
        }
    }
}

fn gather(x: &[f32], channels: &[u16], into: &mut [f32]) {
    for (slot, &c) in into.iter_mut().zip(channels) {
        *slot = x[usize::from(c)];
    }
}

fn scatter(values: &[f32], channels: &[u16], out: &mut [f32]) {
    for (&v, &c) in values.iter().zip(channels) {
        out[usize::from(c)] = v;
    }
}
