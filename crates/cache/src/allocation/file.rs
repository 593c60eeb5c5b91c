//! Reading and writing allocation files, and the shipped presets.

use std::path::Path;

use crate::allocation::error::AllocationError;
use crate::allocation::schema::Allocation;

/// The shipped presets, `(name, TOML text)`; each file's `name` equals its preset name.
const PRESETS: &[(&str, &str)] = &[
    ("f16", include_str!("../../presets/f16.toml")),
    ("mse-k4v4", include_str!("../../presets/mse-k4v4.toml")),
    ("k5v4", include_str!("../../presets/k5v4.toml")),
    ("mse-k5v4", include_str!("../../presets/mse-k5v4.toml")),
    ("tq3.5", include_str!("../../presets/tq3.5.toml")),
    ("tq2.5", include_str!("../../presets/tq2.5.toml")),
    ("paper-prod", include_str!("../../presets/paper-prod.toml")),
    ("mse-k4v4-c", include_str!("../../presets/mse-k4v4-c.toml")),
    ("k5v3-c", include_str!("../../presets/k5v3-c.toml")),
    ("rec4.25", include_str!("../../presets/rec4.25.toml")),
    ("rec3.25", include_str!("../../presets/rec3.25.toml")),
    ("rec2.5", include_str!("../../presets/rec2.5.toml")),
    (
        "rec4.25-global",
        include_str!("../../presets/rec4.25-global.toml"),
    ),
    (
        "rec3.25-global",
        include_str!("../../presets/rec3.25-global.toml"),
    ),
    (
        "k6v5-global",
        include_str!("../../presets/k6v5-global.toml"),
    ),
];

/// The recommended presets, best quality first: what `--alloc recommended` stands for.
const RECOMMENDED: &[&str] = &["rec4.25", "rec3.25", "rec2.5"];

impl Allocation {
    /// Parses and [validates](Allocation::validate) an allocation from TOML text.
    ///
    /// Errors name the field as a path in the document (`override[1].key.bits`) and the reason;
    /// unknown fields are errors, so a typo never silently falls back to a default.
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// let err = Allocation::from_toml_str(r#"
    ///     name = "typo"
    ///     key = { codec = "mse", bits = 4 }
    ///     value = { codec = "mse", bitz = 4 }
    /// "#).unwrap_err();
    /// assert!(err.to_string().starts_with("`value.bitz`: unknown field `bitz`"), "{err}");
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, AllocationError> {
        let document = toml::Deserializer::parse(text).map_err(|e| toml_error(None, &e, text))?;
        let allocation: Allocation = serde_path_to_error::deserialize(document).map_err(|e| {
            let path = e.path().to_string();
            // serde_path_to_error writes "." for the document itself.
            let path = (path != ".").then_some(path);
            toml_error(path, e.inner(), text)
        })?;
        allocation.validate()?;
        Ok(allocation)
    }

    /// Reads an allocation file; errors carry the file name.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, AllocationError> {
        let file = path.as_ref();
        let text = std::fs::read_to_string(file).map_err(|source| AllocationError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|source| AllocationError::InFile {
            file: file.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// A shipped preset by name (see [`Allocation::preset_names`] and `presets/README.md`).
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// assert_eq!(Allocation::preset("k5v4")?.name, "k5v4");
    /// assert!(Allocation::preset("k9v9").is_err());
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn preset(name: &str) -> Result<Self, AllocationError> {
        let text = Self::preset_text(name).ok_or_else(|| unknown_preset(name, false))?;
        Self::from_toml_str(text).map_err(|source| AllocationError::InFile {
            file: format!("presets/{name}.toml").into(),
            source: Box::new(source),
        })
    }

    /// The TOML text of a shipped preset (to print, or to copy into a file and edit).
    pub fn preset_text(name: &str) -> Option<&'static str> {
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| *text)
    }

    /// The names of the shipped presets.
    pub fn preset_names() -> impl ExactSizeIterator<Item = &'static str> {
        PRESETS.iter().map(|(name, _)| *name)
    }

    /// The recommended presets (the best measured quality at about 4.25, 3.25 and 2.5 bits
    /// per value; see `presets/README.md`), best quality first.
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// for name in Allocation::recommended_names() {
    ///     assert_eq!(Allocation::preset(name)?.name, name);
    /// }
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn recommended_names() -> impl ExactSizeIterator<Item = &'static str> {
        RECOMMENDED.iter().copied()
    }

    /// A shipped preset if `name_or_path` is a preset name, else the file at that path.
    ///
    /// Preset names win: to load a file named like a preset, give a path with a directory
    /// (`./k5v4`).
    pub fn load(name_or_path: impl AsRef<Path>) -> Result<Self, AllocationError> {
        let path = name_or_path.as_ref();
        if let Some(name) = path.to_str().filter(|n| Self::preset_text(n).is_some()) {
            return Self::preset(name);
        }
        if !path.exists() {
            return Err(unknown_preset(&path.to_string_lossy(), true));
        }
        Self::from_path(path)
    }

    /// Writes the allocation as TOML; [`Allocation::from_toml_str`] reads back an equal value.
    ///
    /// Fields left at "not given" stay absent, so defaults keep their meaning.
    pub fn to_toml_string(&self) -> Result<String, AllocationError> {
        // The serializer would write a u64 above i64::MAX that no TOML reader accepts.
        if i64::try_from(self.seed).is_err() {
            return Err(AllocationError::Serialize(format!(
                "seed {} does not fit a TOML integer (signed 64-bit)",
                self.seed
            )));
        }
        toml::to_string(self).map_err(|e| AllocationError::Serialize(e.to_string()))
    }
}

fn unknown_preset(name: &str, tried_path: bool) -> AllocationError {
    AllocationError::UnknownPreset {
        name: name.to_owned(),
        shipped: Allocation::preset_names().collect::<Vec<_>>().join(", "),
        tried_path,
    }
}

/// A TOML error as [`AllocationError::Toml`]: the parser's reason and its line and column.
fn toml_error(path: Option<String>, error: &toml::de::Error, text: &str) -> AllocationError {
    let reason = error.message().trim_end();
    // The span is a byte range of `text`; `get` keeps a bad span from panicking.
    let message = match error.span().and_then(|span| text.get(..span.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before[line_start..].chars().count() + 1;
            format!("{reason} (line {line}, column {column})")
        }
        None => reason.to_owned(),
    };
    AllocationError::Toml { path, message }
}
