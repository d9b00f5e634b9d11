//! Reading figures from a report's JSON form and recording what breaks, for `invariants` and
//! the report sections' own checks (`sections`), which `invariants` calls: a leaf, so that the
//! sections need not import `invariants` back.

use serde_json::Value;

/// The array `field` of `v`, empty when absent.
pub fn array<'a>(v: &'a Value, field: &str) -> &'a [Value] {
    v[field].as_array().map_or(&[], Vec::as_slice)
}

/// The count `field` of `v`, 0 when absent.
pub fn n(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or(0)
}

/// The number `field` of `v`, 0 when absent.
pub fn f(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or(0.0)
}

/// Adds a line to `broken` unless `holds`.
pub fn expect(broken: &mut Vec<String>, holds: bool, what: impl FnOnce() -> String) {
    if !holds {
        broken.push(what());
    }
}
