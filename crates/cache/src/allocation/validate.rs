//! The checks that need no model shape, run when a file is read: every rule is checked against
//! the base settings on its own, so most mistakes fail at load time with the field's path, not
//! later at resolve time for some layers only.

use crate::allocation::error::{AllocationError, FieldProblem};
use crate::allocation::merge::{Merged, Section, check_window_fraction};
use crate::allocation::plan::StreamKind;
use crate::allocation::resolve::{absolute_layer, stream_patch};
use crate::allocation::schema::{Allocation, StreamSettings};

impl Allocation {
    /// Checks everything that does not depend on the model: required fields, bit ranges,
    /// shrinkage, settings that do not apply to their codec, empty lists, the outlier count.
    /// Each `[boundary]`, `[[override]]` and `[outliers]` patch is checked applied to the base
    /// settings alone; combinations that only occur for some layers are checked by
    /// [`Allocation::resolve`] (and, for a whole model, [`Allocation::validate_for`]).
    pub fn validate(&self) -> Result<(), AllocationError> {
        if self.name.trim().is_empty() {
            return Err(AllocationError::field("name", FieldProblem::Empty));
        }
        if i64::try_from(self.seed).is_err() {
            let problem = FieldProblem::SeedTooLarge { seed: self.seed };
            return Err(AllocationError::field("seed", problem));
        }
        if let Some(f) = self.recent_fraction {
            check_window_fraction(f, "recent_fraction")?;
        }
        for stream in StreamKind::BOTH {
            self.check_patch(stream, None)?;
        }
        if let Some(boundary) = &self.boundary {
            self.check_rule(
                "boundary",
                Section::Boundary,
                &boundary.key,
                &boundary.value,
            )?;
        }
        for (i, rule) in self.overrides.iter().enumerate() {
            if rule.layers.is_empty() && rule.layer_kind.is_none() && rule.model_layers.is_none() {
                return Err(AllocationError::field(
                    format!("override[{i}].layers"),
                    FieldProblem::NoLayers,
                ));
            }
            if let Some(num_layers) = rule.model_layers {
                if num_layers == 0 {
                    return Err(AllocationError::field(
                        format!("override[{i}].model_layers"),
                        FieldProblem::Zero,
                    ));
                }
                // The model's depth is known here, so its layer numbers can be checked at load.
                for (j, &index) in rule.layers.iter().enumerate() {
                    if absolute_layer(index, num_layers).is_none() {
                        return Err(AllocationError::field(
                            format!("override[{i}].layers[{j}]"),
                            FieldProblem::LayerOutOfRange { index, num_layers },
                        ));
                    }
                }
            }
            if rule.heads.as_ref().is_some_and(Vec::is_empty) {
                return Err(AllocationError::field(
                    format!("override[{i}].heads"),
                    FieldProblem::Empty,
                ));
            }
            let table = format!("override[{i}]");
            self.check_rule(&table, Section::Override(i), &rule.key, &rule.value)?;
        }
        if let Some(rule) = &self.outliers {
            match (rule.channels, rule.fraction) {
                (Some(0), None) => {
                    return Err(AllocationError::field(
                        "outliers.channels",
                        FieldProblem::Zero,
                    ));
                }
                (Some(_), None) => {}
                (None, Some(f)) if !(f > 0.0 && f < 1.0) => {
                    return Err(AllocationError::field(
                        "outliers.fraction",
                        FieldProblem::BadFraction { value: f },
                    ));
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(AllocationError::field(
                        "outliers",
                        FieldProblem::OutlierCount,
                    ));
                }
            }
            self.check_rule("outliers", Section::Outliers, &rule.key, &rule.value)?;
        }
        Ok(())
    }

    /// Checks a rule's `key` / `value` patches (at least one must be given) on the base.
    fn check_rule(
        &self,
        table: &str,
        section: Section,
        key: &Option<StreamSettings>,
        value: &Option<StreamSettings>,
    ) -> Result<(), AllocationError> {
        if key.is_none() && value.is_none() {
            return Err(AllocationError::field(table, FieldProblem::NoStream));
        }
        for stream in StreamKind::BOTH {
            if let Some(patch) = stream_patch(stream, key, value) {
                self.check_patch(stream, Some((patch, section)))?;
            }
        }
        Ok(())
    }

    /// Resolves the base settings of `stream`, with `patch` applied if given.
    fn check_patch(
        &self,
        stream: StreamKind,
        patch: Option<(&StreamSettings, Section)>,
    ) -> Result<(), AllocationError> {
        let mut merged = Merged::new(stream);
        merged.apply(&self.key_or_value(stream), Section::Base);
        if let Some((patch, section)) = patch {
            merged.apply(patch, section);
        }
        merged.finish().map(drop)
    }
}
