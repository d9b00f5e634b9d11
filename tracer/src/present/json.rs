//! Machine-readable report: the `Report` model serialized as is (schema in README.md).

use anyhow::Result;

use crate::model::Report;

pub fn render(report: &Report) -> Result<String> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    Ok(text)
}
