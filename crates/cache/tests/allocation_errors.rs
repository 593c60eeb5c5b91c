//! Invalid allocation files fail with a message that names the field (as a path in the file)
//! and the reason. Catches: silently accepted typos, range checks missing for some codec or
//! some table, and error messages that lose the path of the line to fix.

use tq_cache::allocation::{Allocation, AllocationError, StreamKind};

const BASE: &str = r#"
name = "bad"
key = { codec = "mse", bits = 4 }
value = { codec = "mse", bits = 4 }
"#;

/// The error message of parsing `text`, which must fail.
fn parse_error(text: &str) -> String {
    match Allocation::from_toml_str(text) {
        Ok(a) => panic!("accepted an invalid file: {a:?}"),
        Err(e) => e.to_string(),
    }
}

/// Asserts the message starts with the quoted path and contains the reason.
fn assert_names(message: &str, path: &str, reason: &str) {
    assert!(
        message.starts_with(&format!("`{path}`: ")),
        "expected the path `{path}` in: {message}"
    );
    assert!(
        message.contains(reason),
        "expected `{reason}` in: {message}"
    );
}

#[test]
fn unknown_fields_are_errors_with_their_path() {
    let m = parse_error(&BASE.replace("name = \"bad\"", "name = \"bad\"\nrecent_tokens = 3"));
    assert_names(&m, "recent_tokens", "unknown field `recent_tokens`");
    assert!(m.contains("line 3"), "{m}");

    let m = parse_error(&format!(
        "{BASE}[[override]]\nlayers = [0]\nkey = {{ bitz = 5 }}"
    ));
    assert_names(&m, "override[0].key.bitz", "unknown field `bitz`");

    let m = parse_error(&format!(
        "{BASE}[outliers]\nchannels = 4\nextra_bits = 1\nkey = {{}}"
    ));
    assert_names(&m, "outliers.extra_bits", "unknown field `extra_bits`");
}

#[test]
fn wrong_types_and_unknown_names_are_errors_with_their_path() {
    let m = parse_error(&BASE.replace("bits = 4 }\nvalue", "bits = \"4\" }\nvalue"));
    assert_names(&m, "key.bits", "invalid type");

    let m = parse_error(&BASE.replace(
        "codec = \"mse\", bits = 4 }\nvalue",
        "codec = \"msee\", bits = 4 }\nvalue",
    ));
    assert_names(&m, "key.codec", "unknown variant `msee`");

    let m = parse_error(&format!(
        "{BASE}[boundary]\nlayers = -1\nkey = {{ bits = 5 }}"
    ));
    assert_names(&m, "boundary.layers", "invalid value");

    let m = parse_error(&BASE.replace("name = \"bad\"", "name = \"bad\"\nseed = -3"));
    assert_names(&m, "seed", "invalid value");
}

#[test]
fn missing_required_fields_are_named() {
    let m = parse_error("key = { codec = \"f16\" }\nvalue = { codec = \"f16\" }");
    assert!(m.contains("missing field `name`"), "{m}");

    let m = parse_error("name = \"x\"\nkey = { bits = 4 }\nvalue = { codec = \"f16\" }");
    assert_names(&m, "key.codec", "required in the base settings");

    let m = parse_error("name = \"x\"\nkey = { codec = \"mse\" }\nvalue = { codec = \"f16\" }");
    assert_names(&m, "key.bits", "required for codec `mse`");

    let m = parse_error(
        "name = \"x\"\nkey = { codec = \"f16\" }\nvalue = { codec = \"f16\" }\n\
         [[override]]\nlayers = [1]\nvalue = { codec = \"prod\" }",
    );
    assert_names(&m, "override[0].value.bits", "required for codec `prod`");
}

#[test]
fn bits_are_checked_per_codec() {
    for (codec, bits, supported) in [
        ("mse", 0, "1..=8"),
        ("mse", 10, "1..=8"),
        ("debiased-mse", 9, "1..=8"),
        ("prod", 1, "2..=9"),
        ("prod", 10, "2..=9"),
    ] {
        let text = BASE.replace(
            "value = { codec = \"mse\", bits = 4 }",
            &format!("value = {{ codec = \"{codec}\", bits = {bits} }}"),
        );
        let m = parse_error(&text);
        assert_names(
            &m,
            "value.bits",
            &format!("{bits} is out of range for codec `{codec}` (supported: {supported})"),
        );
    }
    // A patch is checked against the codec in force.
    let m = parse_error(&format!(
        "{BASE}[[override]]\nlayers = [1]\nkey = {{ bits = 9 }}"
    ));
    assert_names(
        &m,
        "override[0].key.bits",
        "9 is out of range for codec `mse` (supported: 1..=8)",
    );
    // bits on f16 has no meaning.
    let m = parse_error(&format!(
        "{BASE}[[override]]\nlayers = [0]\nkey = {{ codec = \"f16\", bits = 4 }}"
    ));
    assert_names(&m, "override[0].key.bits", "does not apply to codec `f16`");
}

#[test]
fn shrinkage_must_be_finite_and_positive() {
    for value in ["nan", "0.0", "-0.7", "inf", "1e300", "1e-60"] {
        let text = BASE.replace(
            "key = { codec = \"mse\", bits = 4 }",
            &format!("key = {{ codec = \"prod\", bits = 5, shrinkage = {value} }}"),
        );
        let m = parse_error(&text);
        assert_names(&m, "key.shrinkage", "must be finite and > 0");
    }
}

#[test]
fn sketch_settings_on_a_codec_without_a_sketch_are_errors() {
    for field in ["qjl = \"haar\"", "scale = \"paper\"", "shrinkage = 0.7"] {
        let text = BASE.replace("bits = 4 }\nvalue", &format!("bits = 4, {field} }}\nvalue"));
        let m = parse_error(&text);
        let name = field.split(' ').next().unwrap();
        assert_names(&m, &format!("key.{name}"), "does not apply to codec `mse`");
    }
    // In a patch over an mse base, named at the patch.
    let m = parse_error(&format!(
        "{BASE}[boundary]\nlayers = 1\nvalue = {{ qjl = \"gaussian\" }}"
    ));
    assert_names(&m, "boundary.value.qjl", "does not apply to codec `mse`");
}

#[test]
fn rules_must_say_something() {
    let m = parse_error(&format!(
        "{BASE}[[override]]\nlayers = []\nkey = {{ bits = 5 }}"
    ));
    assert_names(&m, "override[0].layers", "selects no layer");
    let m = parse_error(&format!(
        "{BASE}[[override]]\nlayers = [0]\nheads = []\nkey = {{ bits = 5 }}"
    ));
    assert_names(&m, "override[0].heads", "must not be empty");
    let m = parse_error(&format!("{BASE}[[override]]\nlayers = [0]"));
    assert_names(&m, "override[0]", "names neither `key` nor `value`");
    let m = parse_error(&format!("{BASE}[outliers]\nchannels = 4"));
    assert_names(&m, "outliers", "names neither `key` nor `value`");
    let m = parse_error(&BASE.replace("\"bad\"", "\"  \""));
    assert_names(&m, "name", "must not be empty");
    let m = parse_error(&format!(
        "{BASE}[[override]]\nmodel_layers = 0\nkey = {{ bits = 5 }}"
    ));
    assert_names(&m, "override[0].model_layers", "must be at least 1");
}

#[test]
fn a_gated_rule_checks_its_layers_at_load() {
    // `model_layers` gives the depth, so a layer beyond it fails when the file is read.
    let m = parse_error(&format!(
        "{BASE}[[override]]\nmodel_layers = 30\nlayers = [3, 30]\nkey = {{ bits = 5 }}"
    ));
    assert_names(
        &m,
        "override[0].layers[1]",
        "layer 30 is out of range for a 30-layer model",
    );
    let m = parse_error(&format!(
        "{BASE}[[override]]\nmodel_layers = 30\nlayers = [-31]\nkey = {{ bits = 5 }}"
    ));
    assert_names(&m, "override[0].layers[0]", "layer -31 is out of range");
    Allocation::from_toml_str(&format!(
        "{BASE}[[override]]\nmodel_layers = 30\nlayers = [29, -30]\nkey = {{ bits = 5 }}"
    ))
    .unwrap();
}

#[test]
fn outlier_counts_are_checked() {
    let m = parse_error(&format!("{BASE}[outliers]\nkey = {{}}"));
    assert_names(&m, "outliers", "exactly one of `channels` and `fraction`");
    let m = parse_error(&format!(
        "{BASE}[outliers]\nchannels = 4\nfraction = 0.5\nkey = {{}}"
    ));
    assert_names(&m, "outliers", "exactly one of `channels` and `fraction`");
    let m = parse_error(&format!("{BASE}[outliers]\nchannels = 0\nkey = {{}}"));
    assert_names(&m, "outliers.channels", "at least 1");
    for f in ["0.0", "1.0", "nan", "-0.25"] {
        let m = parse_error(&format!("{BASE}[outliers]\nfraction = {f}\nkey = {{}}"));
        assert_names(&m, "outliers.fraction", "must be in (0, 1)");
    }
}

#[test]
fn outlier_channels_must_fit_the_head() {
    let a =
        Allocation::from_toml_str(&format!("{BASE}[outliers]\nchannels = 64\nkey = {{}}")).unwrap();
    let m = a
        .resolve(0, 30, 0, 64, StreamKind::Key)
        .unwrap_err()
        .to_string();
    assert_names(
        &m,
        "outliers.channels",
        "64 outlier channels do not fit head_dim 64",
    );
    // Fine at d = 128.
    assert!(a.resolve(0, 30, 0, 128, StreamKind::Key).is_ok());

    // A quantized tier narrower than 3 channels has no codebook.
    let a =
        Allocation::from_toml_str(&format!("{BASE}[outliers]\nchannels = 2\nkey = {{}}")).unwrap();
    let m = a
        .resolve(0, 30, 0, 64, StreamKind::Key)
        .unwrap_err()
        .to_string();
    assert_names(&m, "outliers.channels", "the outlier tier has 2 channels");
    let a =
        Allocation::from_toml_str(&format!("{BASE}[outliers]\nchannels = 3\nkey = {{}}")).unwrap();
    let m = a
        .resolve(0, 30, 0, 5, StreamKind::Key)
        .unwrap_err()
        .to_string();
    assert_names(&m, "outliers.channels", "the rest tier has 2 channels");
    // An f16 outlier tier may be narrow.
    let a = Allocation::from_toml_str(&format!(
        "{BASE}[outliers]\nchannels = 1\nkey = {{ codec = \"f16\" }}"
    ))
    .unwrap();
    assert!(a.resolve(0, 30, 0, 64, StreamKind::Key).is_ok());
    // A whole quantized head needs d >= 3 too.
    let m = Allocation::from_toml_str(BASE)
        .unwrap()
        .resolve(0, 30, 0, 2, StreamKind::Value)
        .unwrap_err()
        .to_string();
    assert_names(&m, "value.codec", "the head has 2 channels");
}

#[test]
fn layer_indices_are_checked_at_resolve() {
    let a = Allocation::from_toml_str(&format!(
        "{BASE}[[override]]\nlayers = [0, 29]\nkey = {{ bits = 5 }}\n[[override]]\nlayers = [3, -31]\nvalue = {{ bits = 5 }}"
    ))
    .unwrap();
    // Every call fails, not only those for the matching layer.
    for layer in [0, 3, 10] {
        let m = a
            .resolve(layer, 30, 0, 64, StreamKind::Key)
            .unwrap_err()
            .to_string();
        assert_names(
            &m,
            "override[1].layers[1]",
            "layer -31 is out of range for a 30-layer model",
        );
    }
    let m = a
        .resolve(0, 20, 0, 64, StreamKind::Key)
        .unwrap_err()
        .to_string();
    assert_names(
        &m,
        "override[0].layers[1]",
        "layer 29 is out of range for a 20-layer model",
    );
    // Fine for a deeper model.
    assert!(a.resolve(0, 31, 0, 64, StreamKind::Key).is_ok());
    // The arguments themselves.
    let e = a.resolve(31, 31, 0, 64, StreamKind::Key).unwrap_err();
    assert!(matches!(e, AllocationError::Shape(_)), "{e}");
}

#[test]
fn errors_in_files_name_the_file() {
    let path = std::env::temp_dir().join(format!("tq-bad-allocation-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        BASE.replace("bits = 4 }\nvalue", "bits = 11 }\nvalue"),
    )
    .unwrap();
    let err = Allocation::from_path(&path).unwrap_err().to_string();
    std::fs::remove_file(&path).unwrap();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(err.contains("`key.bits`: 11 is out of range"), "{err}");

    let err = Allocation::from_path("/nonexistent/allocation.toml").unwrap_err();
    assert!(matches!(err, AllocationError::Io { .. }), "{err}");
}

#[test]
fn syntax_errors_give_a_position() {
    let m = parse_error("name = \"x\"\nkey = { codec = \"mse\", bits = 4 \nvalue = 3");
    assert!(
        m.contains("expected `,`") && m.contains("(line 3, column 1)"),
        "{m}"
    );
}

#[test]
fn seeds_beyond_toml_integers_cannot_be_written() {
    let mut a = Allocation::from_toml_str(BASE).unwrap();
    a.seed = u64::MAX;
    let e = a.to_toml_string().unwrap_err();
    assert!(matches!(e, AllocationError::Serialize(_)), "{e}");
    assert_names(
        &a.validate().unwrap_err().to_string(),
        "seed",
        "at most 2^63 - 1",
    );
    // Nor read: TOML integers are signed 64-bit.
    let m = parse_error(&format!("seed = {}\n{BASE}", u64::MAX));
    assert!(m.contains("seed") || m.contains("line 1"), "{m}");
}
