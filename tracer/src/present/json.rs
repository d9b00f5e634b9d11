//! Machine-readable report: the `Report` model serialized as is (schema in docs/report.md).

use anyhow::Result;

use crate::model::Report;

pub fn render(report: &Report) -> Result<String> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample, self_cost::RunStats};

    #[test]
    fn json_carries_the_schema_fields() {
        let (harvest, symbols, meta) = sample();
        let text = render(&build_report(&harvest, &symbols, &meta)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["target"]["pids"], serde_json::json!([42]));
        assert_eq!(v["target"]["comm"], "app");
        assert_eq!(v["totals"]["write"]["acquisitions"], 3);
        assert_eq!(v["totals"]["write"]["max_hold_ns"], 40_000_000);
        let top = &v["entries"][0];
        assert_eq!(top["kind"], "hold");
        assert_eq!(top["mode"], "write");
        assert_eq!(top["cause"], "munmap");
        assert_eq!(top["outside_locker"], false);
        assert_eq!(top["frames"][0]["kernel"], false);
        assert_eq!(top["frames"][0]["symbol"], "munmap");
        assert!(top["frames"][0]["file"].is_null() && top["frames"][0]["line"].is_null());
        assert_eq!(v["entries"][3]["cause"], "proc_reader");
        assert_eq!(v["lost"]["unpaired_release"], 2);
        assert_eq!(
            v["lost"]["aggregation_map_full"], 0,
            "zero counters are present"
        );
        let cost = &v["self_cost"];
        assert_eq!(cost["available"], true);
        assert!(cost.get("reason").is_none(), "reason only when unavailable");
        assert_eq!(
            cost["programs"][0],
            serde_json::json!({"name": "mmap_lock_released", "runs": 4000,
                "run_time_ns": 2_800_000, "ns_per_run": 700})
        );
        assert_eq!(cost["events_per_second"], 8000.0);
        assert_eq!(cost["added_ns"], 4_400_000);
        assert_eq!(cost["counted_share"], 1.0, "every run counted");
    }

    #[test]
    fn unavailable_self_cost_gives_the_reason_and_null_figures() {
        let (mut harvest, symbols, meta) = sample();
        harvest.run_stats = RunStats::Unavailable("no BPF_ENABLE_STATS".into());
        let text = render(&build_report(&harvest, &symbols, &meta)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["self_cost"],
            serde_json::json!({"available": false, "reason": "no BPF_ENABLE_STATS",
                "programs": [], "events_per_second": null, "added_ns": null,
                "added_share": null, "counted_share": null,
                "tracer_cpu_ns": 0, "tracer_cpu_share": null, "lengthened_ns": null,
                "own_cost_ns": null, "own_cost_share": null})
        );
    }
}
