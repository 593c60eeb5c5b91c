//! `recent_fraction`: a recent window given as a fraction of the cache's capacity. What a built
//! cache holds at several capacities, the count a cache without a capacity falls back to, which
//! table's window wins, and the typed errors for fractions out of range, in `[outliers]`, or
//! with no count where a cache has no capacity.

mod common;

use tq_cache::allocation::{Allocation, AllocationError, FieldProblem, RecentWindow, StreamKind};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;

const LAYERS: usize = 30;
const DIM: usize = 64;

fn static_layout(capacity: usize) -> KvLayout {
    KvLayout {
        kind: KvKind::Growing {
            growth: Growth::Static { capacity },
        },
        ..common::growing(2, DIM)
    }
}

fn field_error(result: Result<impl std::fmt::Debug, AllocationError>) -> (String, FieldProblem) {
    match result {
        Err(AllocationError::Field { path, problem }) => (path, problem),
        other => panic!("expected a field error, got {other:?}"),
    }
}

const FRACTIONS: &str = r#"
name = "fractions"
sink_tokens = 2
recent_fp_tokens = 40
recent_fraction = 0.25
key = { codec = "mse", bits = 4, recent_fraction = 0.125, recent_fp_tokens = 24 }
value = { codec = "mse", bits = 3 }

[[override]]
layers = [10]
key = { recent_fp_tokens = 7 }
"#;

/// In a cache of fixed capacity a fraction gives `round(fraction · capacity)` tokens, as the
/// built streams hold (their rings) and as `longest_recent_window` bounds; a stream table's
/// window replaces the top-level one whole (layer 10's keys: a count only, so no fraction).
#[test]
fn fractions_scale_with_the_capacity() {
    let a = Allocation::from_toml_str(FRACTIONS).unwrap();
    for (capacity, key, value) in [(100, 13, 25), (1000, 125, 250), (4096, 512, 1024)] {
        let cache = KvCache::with_allocation(static_layout(capacity), &a, 3, LAYERS).unwrap();
        for head in 0..2 {
            assert_eq!(cache.keys(head).layout().recent_tokens, key, "{capacity}");
            assert_eq!(
                cache.values(head).layout().recent_tokens,
                value,
                "{capacity}"
            );
        }
        let fixed = KvCache::with_allocation(static_layout(capacity), &a, 10, LAYERS).unwrap();
        assert_eq!(fixed.keys(0).layout().recent_tokens, 7, "{capacity}");
        assert_eq!(fixed.values(0).layout().recent_tokens, value, "{capacity}");
        assert_eq!(a.longest_recent_window(capacity), value);
    }
    // 0.125 · 100 = 12.5 rounds half away from zero.
    let resolved = a
        .resolve_stream(3, LAYERS, 0, DIM, StreamKind::Key)
        .unwrap();
    assert_eq!(
        resolved.recent,
        RecentWindow {
            tokens: Some(24),
            fraction: Some(0.125)
        }
    );
}

/// A cache that grows in pages has no capacity: it takes the counts, and refuses a fraction
/// given without one, naming the field.
#[test]
fn growing_caches_take_the_count_or_refuse_a_bare_fraction() {
    let a = Allocation::from_toml_str(FRACTIONS).unwrap();
    let cache = KvCache::with_allocation(common::growing(2, DIM), &a, 3, LAYERS).unwrap();
    assert_eq!(cache.keys(0).layout().recent_tokens, 24);
    assert_eq!(cache.values(0).layout().recent_tokens, 40);

    let bare = FRACTIONS.replace(", recent_fp_tokens = 24", "");
    let b = Allocation::from_toml_str(&bare).unwrap();
    assert!(KvCache::with_allocation(static_layout(64), &b, 3, LAYERS).is_ok());
    match KvCache::with_allocation(common::growing(2, DIM), &b, 3, LAYERS) {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("recent_fraction") && text.contains("recent_fp_tokens"));
        }
        Ok(_) => panic!("a bare fraction on a growing cache was accepted"),
    }
    let (path, problem) = field_error(
        b.resolve_stream(3, LAYERS, 0, DIM, StreamKind::Key)
            .unwrap()
            .recent
            .tokens_for(None),
    );
    assert_eq!(
        (path.as_str(), problem),
        ("recent_fraction", FieldProblem::WindowNeedsCapacity)
    );
    // A top-level fraction with the count left at 0 is a bare fraction too.
    let top = "name = \"t\"\nrecent_fraction = 0.1\nkey = { codec = \"mse\", bits = 4 }\n\
               value = { codec = \"mse\", bits = 3 }";
    let t = Allocation::from_toml_str(top).unwrap();
    assert!(KvCache::with_allocation(common::growing(1, DIM), &t, 0, LAYERS).is_err());
    let cache = KvCache::with_allocation(static_layout(300), &t, 0, LAYERS).unwrap();
    assert_eq!(cache.keys(0).layout().recent_tokens, 30);
}

/// Fractions outside `[0, 1)`, or not numbers, are refused at load time with the field's path;
/// a window in `[outliers]` is refused as for `recent_fp_tokens`.
#[test]
fn bad_fractions_are_refused_with_the_field() {
    let base = "name = \"b\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 3 }\n";
    for bad in ["1.0", "-0.1", "1.5", "nan", "inf"] {
        let top = format!("recent_fraction = {bad}\n{base}");
        let (path, problem) = field_error(Allocation::from_toml_str(&top));
        assert_eq!(path, "recent_fraction", "{bad}");
        assert!(
            matches!(problem, FieldProblem::BadWindowFraction { .. }),
            "{bad}"
        );
        let rule =
            format!("{base}[[override]]\nlayers = [1]\nvalue = {{ recent_fraction = {bad} }}");
        let (path, _) = field_error(Allocation::from_toml_str(&rule));
        assert_eq!(path, "override[0].value.recent_fraction", "{bad}");
    }
    assert!(Allocation::from_toml_str(&format!("recent_fraction = 0.0\n{base}")).is_ok());
    let outliers = format!("{base}[outliers]\nchannels = 8\nkey = {{ recent_fraction = 0.1 }}");
    let (path, problem) = field_error(Allocation::from_toml_str(&outliers));
    assert_eq!(path, "outliers.key.recent_fraction");
    assert_eq!(problem, FieldProblem::WholeStreamOnly);
}

/// A fraction survives the round trip through TOML (a saved allocation reloads equal).
#[test]
fn fractions_round_trip_through_toml() {
    let a = Allocation::from_toml_str(FRACTIONS).unwrap();
    let back = Allocation::from_toml_str(&a.to_toml_string().unwrap()).unwrap();
    assert_eq!(a, back);
    let levers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/levers");
    for name in ["rec4.25-scaled", "rec3.25-scaled", "rec2.5-scaled"] {
        let p = Allocation::load(levers.join(format!("{name}.toml"))).unwrap();
        assert_eq!(p.name, name);
        assert!(p.key.recent_fraction.is_some(), "{name}");
        let back = Allocation::from_toml_str(&p.to_toml_string().unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
