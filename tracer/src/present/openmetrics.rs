//! `serve`'s /metrics: the series and the trace's running totals in the OpenMetrics text format
//! (or Prometheus text 0.0.4 for scrapers that do not ask for OpenMetrics), encoded by the
//! Prometheus project's client crate from a snapshot taken at the scrape.
//!
//! Families (a Grafana query: `histogram_quantile(0.99, sum by (le, comm)
//! (rate(mmap_lock_seconds_bucket{kind="wait"}[5m])))`):
//! - `mmap_lock_seconds{comm, cause, mode, kind[, pid]}`: histogram of waits and holds, the
//!   kernel's log2 slots as `le` bounds;
//! - `mmap_lock_acquisitions_total`, `mmap_lock_failed_trylocks_total`,
//!   `mmap_lock_interrupted_total`, `mmap_lock_downgrades_total` `{mode}`: every traced
//!   locker;
//! - `mmapsem_trace_lost_events_total{counter}`: every drop and unpaired-event counter, and
//!   `series_cap` for operations left out of series past `--max-series`;
//! - `mmapsem_trace_program_runs_total`, `mmapsem_trace_program_run_seconds_total`
//!   `{program}`: what the tracer's own programs cost the threads that hit their events, as
//!   counted in the share of the trace `mmapsem_trace_program_stats_counted_ratio`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::model::report::Report;
use crate::model::series::Series;

/// The text formats a scraper can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    OpenMetrics,
    PrometheusText,
}

impl Exposition {
    /// From the request's Accept header: OpenMetrics when it is asked for, as Prometheus does.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Self::OpenMetrics,
            _ => Self::PrometheusText,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// What one scrape shows: the series, and the trace since its start (totals, losses, cost).
#[derive(Debug)]
struct Scrape {
    series: Series,
    max_series: usize,
    since_start: Report,
}

pub fn render(
    series: &Series,
    max_series: usize,
    since_start: &Report,
    format: Exposition,
) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        series: series.clone(),
        max_series,
        since_start: since_start.clone(),
    }));
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = match format {
        Exposition::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry),
        Exposition::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        }
    };
    text
}

type Labels = Vec<(&'static str, String)>;

/// One counter of a mode's totals.
type ModeCounter = fn(&tracer_common::ModeTotals) -> u64;

const NO_EXEMPLAR: Option<&Exemplar<NoLabelSet, f64>> = None;
const NO_EXEMPLARS: Option<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>> = None;

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.encode_series(&mut encoder)?;
        self.encode_totals(&mut encoder)?;
        self.encode_losses(&mut encoder)?;
        self.encode_cost(&mut encoder)
    }
}

impl Scrape {
    fn encode_series(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(
            "mmap_lock",
            "Time waiting for (kind=wait) and holding (kind=hold) a process's mmap_lock, by process name, cause and mode",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (key, value) in &self.series.series {
            let mut labels: Labels = vec![
                ("comm", key.comm.clone()),
                ("cause", key.cause.to_string()),
                ("mode", key.mode.label().to_string()),
                ("kind", key.kind.label().to_string()),
            ];
            if let Some(pid) = key.pid {
                labels.push(("pid", pid.to_string()));
            }
            if let Some(cgroup) = &key.cgroup {
                labels.push(("cgroup", cgroup.clone()));
            }
            family.encode_family(&labels)?.encode_histogram(
                value.sum_ns as f64 / 1e9,
                value.count,
                &value.buckets(),
                NO_EXEMPLARS,
            )?;
        }
        let series = ConstGauge::new(self.series.series.len() as i64);
        series.encode(encoder.encode_descriptor(
            "mmapsem_trace_series",
            "Series of mmap_lock_seconds exported now",
            None,
            series.metric_type(),
        )?)?;
        let limit = ConstGauge::new(self.max_series as i64);
        limit.encode(encoder.encode_descriptor(
            "mmapsem_trace_series_limit",
            "The most series of mmap_lock_seconds exported (--max-series)",
            None,
            limit.metric_type(),
        )?)
    }

    fn encode_totals(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let totals = &self.since_start.totals;
        let families: [(&str, &str, ModeCounter); 4] = [
            (
                "mmap_lock_acquisitions",
                "Acquisitions of mmap_lock by every traced locker",
                |t| t.acquisitions,
            ),
            (
                "mmap_lock_failed_trylocks",
                "Trylocks of mmap_lock that failed",
                |t| t.failed_trylocks,
            ),
            (
                "mmap_lock_interrupted",
                "Waits for mmap_lock given up on a fatal signal (killable locks)",
                |t| t.interrupted,
            ),
            (
                "mmap_lock_downgrades",
                "Write holds that went on as read holds (mmap_write_downgrade, as munmap does): \
                 each is also a read hold without a read acquisition",
                |t| t.downgrades,
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (mode, mode_totals) in [("read", &totals.read), ("write", &totals.write)] {
                family
                    .encode_family(&[("mode", mode)])?
                    .encode_counter(&value(mode_totals), NO_EXEMPLAR)?;
            }
        }
        Ok(())
    }

    fn encode_losses(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(
            "mmapsem_trace_lost_events",
            "Events dropped or left unpaired by the tracer, by counter; series_cap: operations left out of series past --max-series",
            None,
            MetricType::Counter,
        )?;
        let lost = self
            .since_start
            .lost
            .iter()
            .map(|(&name, &n)| (name, n))
            .chain([("series_cap", self.series.over_cap)]);
        for (name, n) in lost {
            family
                .encode_family(&[("counter", name)])?
                .encode_counter(&n, NO_EXEMPLAR)?;
        }
        Ok(())
    }

    fn encode_cost(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let programs = &self.since_start.self_cost.programs;
        let mut runs = encoder.encode_descriptor(
            "mmapsem_trace_program_runs",
            "Runs of the tracer's BPF programs (kernel bpf_stats)",
            None,
            MetricType::Counter,
        )?;
        for program in programs {
            let counter = ConstCounter::new(program.runs);
            counter.encode(runs.encode_family(&[("program", program.name.as_str())])?)?;
        }
        let mut time = encoder.encode_descriptor(
            "mmapsem_trace_program_run",
            "Time the tracer's BPF programs ran: added to the threads that hit their events",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        for program in programs {
            let counter = ConstCounter::new(program.run_time_ns as f64 / 1e9);
            counter.encode(time.encode_family(&[("program", program.name.as_str())])?)?;
        }
        if let Some(share) = self.since_start.self_cost.counted_share {
            let gauge = ConstGauge::new(share);
            gauge.encode(encoder.encode_descriptor(
                "mmapsem_trace_program_stats_counted_ratio",
                "Share of the trace in which bpf_stats counted the program runs and run time \
                 above (1 with --self-cost full; else sampled)",
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::{Kind, Mode};
    use crate::model::series::{SeriesKey, SeriesValue};
    use crate::model::{build_report, Harvest, TraceMeta};
    use tracer_common::log2_slot;

    fn one_series(comm: &str) -> Series {
        let mut value = SeriesValue {
            count: 3,
            sum_ns: 3_500,
            ..SeriesValue::default()
        };
        value.slots[log2_slot(500)] += 2;
        value.slots[log2_slot(2_500)] += 1;
        let mut series = Series::default();
        series.series.insert(
            SeriesKey {
                comm: comm.into(),
                pid: None,
                cgroup: Some("/system.slice/a.service".into()),
                cause: "mmap",
                mode: Mode::Write,
                kind: Kind::Wait,
            },
            value,
        );
        series.over_cap = 7;
        series
    }

    fn empty_report() -> Report {
        build_report(
            &Harvest::default(),
            &Default::default(),
            &TraceMeta::default(),
        )
    }

    #[test]
    fn openmetrics_has_cumulative_buckets_the_losses_and_an_eof() {
        let text = render(
            &one_series("cc1"),
            10,
            &empty_report(),
            Exposition::OpenMetrics,
        );
        assert!(
            text.contains("# TYPE mmap_lock_seconds histogram"),
            "{text}"
        );
        let labels =
            r#"comm="cc1",cause="mmap",mode="write",kind="wait",cgroup="/system.slice/a.service""#;
        assert!(
            text.contains(&format!("mmap_lock_seconds_count{{{labels}}} 3")),
            "{text}"
        );
        // 500 ns is under the first bound (256 ns is not), 2.5 us under 4.096 us.
        assert!(
            text.contains(&format!(
                "mmap_lock_seconds_bucket{{le=\"5.12e-7\",{labels}}} 2"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "mmap_lock_seconds_bucket{{le=\"+Inf\",{labels}}} 3"
            )),
            "{text}"
        );
        assert!(
            text.contains(r#"mmapsem_trace_lost_events_total{counter="series_cap"} 7"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mmap_lock_acquisitions_total{mode="read"} 0"#),
            "{text}"
        );
        // Read holds can outnumber read acquisitions: the downgrades say by how many.
        assert!(
            text.contains(r#"mmap_lock_downgrades_total{mode="write"} 0"#),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn sampled_program_costs_come_with_the_share_counted() {
        use crate::model::self_cost::{tests::runs, RunStats};
        let harvest = Harvest {
            run_stats: RunStats::Sampled {
                programs: vec![runs("btf_released", 10, 7_000)],
                counted_ns: 100_000_000,
            },
            ..Harvest::default()
        };
        let meta = TraceMeta {
            duration_ns: 1_000_000_000,
            ..TraceMeta::default()
        };
        let report = build_report(&harvest, &Default::default(), &meta);
        let text = render(&Series::default(), 10, &report, Exposition::PrometheusText);
        assert!(
            text.contains(r#"mmapsem_trace_program_runs_total{program="btf_released"} 10"#),
            "{text}"
        );
        assert!(
            text.contains("mmapsem_trace_program_stats_counted_ratio 0.1"),
            "{text}"
        );
    }

    #[test]
    fn a_hostile_process_name_stays_inside_its_label() {
        let text = render(
            &one_series("x\"} 1\nfake_metric 2"),
            10,
            &empty_report(),
            Exposition::PrometheusText,
        );
        assert!(
            !text.lines().any(|l| l.starts_with("fake_metric")),
            "{text}"
        );
        assert!(text.contains(r#"comm="x\"} 1\nfake_metric 2""#), "{text}");
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert_eq!(
            Exposition::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Exposition::OpenMetrics
        );
        assert_eq!(
            Exposition::negotiate(Some("*/*")),
            Exposition::PrometheusText
        );
        assert_eq!(Exposition::negotiate(None), Exposition::PrometheusText);
    }
}
