//! The HTML page: one file with inline CSS and JavaScript (`assets/report.html`); the report
//! data is embedded as JSON, and the script draws SVG plots and the trajectory browser from it.
//! In live mode the same page polls `api/summary` and fetches `api/trajectory?id=` lazily.

use super::data::ReportData;
use super::ReportError;

const TEMPLATE: &str = include_str!("assets/report.html");
const SLOT: &str = "/*__LEGO_RL_DATA__*/null";

/// JSON safe to embed in a `<script>` element (no `</script>`, no `<!--`).
pub fn script_json(v: &impl serde::Serialize) -> Result<String, ReportError> {
    Ok(serde_json::to_string(v)?
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029"))
}

/// The page with `data` embedded.
pub fn page(data: &ReportData) -> Result<String, ReportError> {
    Ok(page_with_json(&script_json(data)?))
}

/// The page with already-escaped JSON (from [`script_json`]) embedded.
pub fn page_with_json(json: &str) -> String {
    TEMPLATE.replacen(SLOT, json, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_json_cannot_close_the_script() {
        let s = script_json(&serde_json::json!({"t": "</script><script>alert(1)</script>"})).unwrap();
        assert!(!s.contains("</script"));
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back["t"], "</script><script>alert(1)</script>");
        assert!(TEMPLATE.contains(SLOT), "the template has the data slot");
    }
}
