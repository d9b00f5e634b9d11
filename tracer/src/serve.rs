//! `mmapsem-trace serve`: a continuous trace shown over HTTP instead of on a terminal.
//!
//! The endpoint's threads only parse requests and wait; the collect loop answers them (it owns
//! the probes): every FOLD_EVERY, and at each request, it snapshots the maps and folds what
//! the window added into the series (`model::series`), so that counters keep growing whatever
//! became of the processes behind them. A profile request remembers where the trace stood
//! and is answered once its seconds have passed, with a report of just that window.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use tokio::sync::Notify;
use tracer_common::StateKey;

use crate::cli::ServeArgs;
use crate::collect::{Flow, Forget, Mark, Sink, Snapshot, Want, Watch, Windows};
use crate::model::retention::GoneTwice;
use crate::model::series::{Series, SeriesSettings};
use crate::model::{Harvest, Report};
use crate::present::openmetrics::{self, Exposition};
use crate::symbolize::StackSymbolizer;
use crate::system::procfs;

/// How often the maps are folded into the series between scrapes, so that each fold stays
/// small and the series stay current for whoever scrapes next.
const FOLD_EVERY: Duration = Duration::from_secs(10);
/// Requests answered at once (profiles wait seconds each); beyond them, a 503.
const MAX_REQUESTS_IN_FLIGHT: usize = 16;
/// The profile length when a request gives none (as Go's /debug/pprof does).
const DEFAULT_PROFILE_SECONDS: u64 = 30;
const MAX_PROFILE_SECONDS: u64 = 3600;
/// How long a request waits for the loop beyond its own seconds.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// What a request asks the loop for.
enum Ask {
    Metrics(Exposition),
    Profile { seconds: u64 },
}

struct Request {
    ask: Ask,
    reply: Sender<Reply>,
}

/// An HTTP answer.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Reply {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }
}

/// The listening socket and the thread that reads requests from it.
pub struct Endpoint {
    requests: Receiver<Request>,
    wakeup: Arc<Notify>,
    pub address: SocketAddr,
}

impl Endpoint {
    /// Binds `address` (before the programs load: a port in use is a one-line error, not a
    /// trace with nowhere to go) and starts reading requests.
    pub fn bind(address: SocketAddr) -> Result<Self> {
        let server = tiny_http::Server::http(address)
            .map_err(|err| anyhow!("listening on {address}: {err}"))?;
        let address = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| anyhow!("listening on {address}: not an IP socket"))?;
        if !address.ip().is_loopback() {
            log::warn!(
                "listening on {address}, beyond loopback: whoever reaches it reads process \
                 names and stacks"
            );
        }
        let (sender, requests) = mpsc::channel();
        let wakeup = Arc::new(Notify::new());
        let notify = wakeup.clone();
        std::thread::Builder::new()
            .name("http".into())
            .spawn(move || accept(server, sender, notify))?;
        Ok(Self {
            requests,
            wakeup,
            address,
        })
    }
}

fn accept(server: tiny_http::Server, loop_requests: Sender<Request>, wakeup: Arc<Notify>) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    for request in server.incoming_requests() {
        if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_REQUESTS_IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::SeqCst);
            respond(
                request,
                Reply::text(503, "busy: too many requests in flight\n"),
            );
            continue;
        }
        let (loop_requests, wakeup, in_flight) =
            (loop_requests.clone(), wakeup.clone(), in_flight.clone());
        let spawned = std::thread::Builder::new()
            .name("http-request".into())
            .spawn(move || {
                let reply = answer(&request, &loop_requests, &wakeup);
                respond(request, reply);
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(err) = spawned {
            log::warn!("answering a request: {err}");
        }
    }
}

/// Parses the request, hands it to the loop and waits for its answer.
fn answer(request: &tiny_http::Request, loop_requests: &Sender<Request>, wakeup: &Notify) -> Reply {
    if *request.method() != tiny_http::Method::Get {
        return Reply::text(405, "only GET\n");
    }
    let accept = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Accept"))
        .map(|h| h.value.as_str());
    let ask = match parse_target(request.url(), accept) {
        Ok(ask) => ask,
        Err(reply) => return reply,
    };
    let within = ANSWER_WITHIN
        + match ask {
            Ask::Profile { seconds } => Duration::from_secs(seconds),
            Ask::Metrics(_) => Duration::ZERO,
        };
    let (reply, answered) = mpsc::channel();
    if loop_requests.send(Request { ask, reply }).is_err() {
        return Reply::text(503, "the trace has ended\n");
    }
    wakeup.notify_one();
    answered
        .recv_timeout(within)
        .unwrap_or_else(|_| Reply::text(503, "the trace has ended or did not answer in time\n"))
}

/// What a path asks for, or the error reply.
fn parse_target(url: &str, accept: Option<&str>) -> Result<Ask, Reply> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    match path {
        "/metrics" => Ok(Ask::Metrics(Exposition::negotiate(accept))),
        "/debug/pprof/mmap_lock" => {
            let seconds = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("seconds="))
                .map_or(Ok(DEFAULT_PROFILE_SECONDS), str::parse::<u64>);
            match seconds {
                Ok(s) if (1..=MAX_PROFILE_SECONDS).contains(&s) => Ok(Ask::Profile { seconds: s }),
                _ => Err(Reply::text(
                    400,
                    format!("seconds: a whole number from 1 to {MAX_PROFILE_SECONDS}\n"),
                )),
            }
        }
        "/" => Err(Reply::text(
            200,
            "mmapsem-trace serve\n/metrics\n/debug/pprof/mmap_lock?seconds=N\n",
        )),
        _ => Err(Reply::text(
            404,
            "not found: /metrics or /debug/pprof/mmap_lock\n",
        )),
    }
}

fn respond(request: tiny_http::Request, reply: Reply) {
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], reply.content_type)
        .expect("a static content type is a valid header");
    let response = tiny_http::Response::from_data(reply.body)
        .with_status_code(reply.status)
        .with_header(header);
    if let Err(err) = request.respond(response) {
        log::debug!("writing an HTTP response: {err}");
    }
}

/// A profile request waiting for its seconds to pass.
struct PendingProfile {
    from: Mark,
    /// What processes forgotten while the window was open did: their entries left the
    /// snapshots, not the window (a daemon forgets gone processes every fold, 10 s, and a
    /// profile of 30 s lost every process that ended in it).
    forgotten: Harvest,
    due: Instant,
    reply: Sender<Reply>,
}

/// The collect loop's side: folds windows into series and answers the endpoint.
pub struct Server {
    endpoint: Endpoint,
    windows: Windows,
    settings: SeriesSettings,
    series: Series,
    /// The trace since its start at the last fold: totals, losses, self-cost.
    since_start: Option<Report>,
    /// When the next fold is due (set at the first tick).
    next_fold: Option<Instant>,
    profiles: Vec<PendingProfile>,
    /// Processes with entries that were gone when the last fold ended.
    gone_processes: GoneTwice<u32>,
    /// Threads with a lock state that were gone when the last fold ended.
    gone_threads: GoneTwice<u32>,
    /// Requests taken in by the last poll, answered once the snapshot they need is folded.
    asked: Vec<Request>,
}

impl Server {
    pub fn new(endpoint: Endpoint, windows: Windows, args: &ServeArgs) -> Self {
        Self {
            endpoint,
            windows,
            settings: SeriesSettings {
                label_pid: args.label_pid,
                max_series: args.max_series as usize,
                comms: args.comms.clone(),
            },
            series: Series::default(),
            since_start: None,
            next_fold: None,
            profiles: Vec::new(),
            gone_processes: GoneTwice::default(),
            gone_threads: GoneTwice::default(),
            asked: Vec::new(),
        }
    }

    pub fn into_symbolizer(self) -> StackSymbolizer {
        self.windows.into_symbolizer()
    }

    fn fold(&mut self, harvest: Harvest, at: Instant, watch: &mut Watch, kernel: &dyn Forget) {
        let windows = self.windows.advance(harvest, watch, false);
        self.series.fold(&windows.interval, &self.settings);
        self.since_start = Some(windows.cumulative);
        self.next_fold = Some(at + FOLD_EVERY);
        self.forget_gone(kernel, watch);
        self.forget_gone_threads(kernel);
    }

    /// Once folded, the entries of processes that are gone only take room: they leave the
    /// kernel maps, the windows and the names, so that a daemon's memory follows the
    /// processes alive, not all those it ever saw. A failure only costs room: logged.
    ///
    /// Only processes already gone at the previous fold are forgotten: the snapshot just
    /// folded was read after their end, so it holds all they did (one that ended while it was
    /// read could still have had operations after it).
    fn forget_gone(&mut self, kernel: &dyn Forget, watch: &mut Watch) {
        // A pid alive again in between was reused: the new process's entries stay.
        let gone: HashSet<u32> = self
            .gone_processes
            .look(self.windows.processes_seen(), procfs::process_has_ended)
            .into_iter()
            .collect();
        if gone.is_empty() {
            return;
        }
        for &pid in &gone {
            self.gone_processes.let_go(pid);
        }
        match kernel.forget_processes(&gone) {
            Ok(deleted) => log::debug!(
                "forgot {} processes that are gone: {deleted} kernel entries",
                gone.len()
            ),
            Err(err) => log::warn!("forgetting processes that are gone: {err:#}"),
        }
        let forgotten = self.windows.forget_processes(&gone);
        for profile in &mut self.profiles {
            profile.forgotten.add_processes(&forgotten);
        }
        watch.forget_names(&gone);
    }

    /// The lock states of threads gone since the last fold, unless they still hold an
    /// aggregation left pending (an exec leaves one on the old mm).
    fn forget_gone_threads(&mut self, kernel: &dyn Forget) {
        let states = match kernel.thread_states() {
            Ok(states) => states,
            Err(err) => {
                log::warn!("reading the threads' lock states: {err:#}");
                return;
            }
        };
        // A thread id alive again in between was reused: the new thread's state stays.
        let gone_twice: HashSet<u32> = self
            .gone_threads
            .look(states.iter().map(|(key, _)| key.tid), |tid| {
                !procfs::is_alive(tid)
            })
            .into_iter()
            .collect();
        let keys: Vec<StateKey> = states
            .into_iter()
            .filter(|(key, pending)| !pending && gone_twice.contains(&key.tid))
            .map(|(key, _)| key)
            .collect();
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            self.gone_threads.let_go(key.tid);
        }
        match kernel.forget_threads(&keys) {
            Ok(deleted) => log::debug!(
                "forgot {} threads that are gone: {deleted} kernel entries",
                keys.len()
            ),
            Err(err) => log::warn!("forgetting threads that are gone: {err:#}"),
        }
    }

    fn metrics(&self, format: Exposition) -> Reply {
        let Some(since_start) = &self.since_start else {
            return Reply::text(503, "no snapshot yet\n");
        };
        Reply {
            status: 200,
            content_type: format.content_type(),
            body: openmetrics::render(&self.series, self.settings.max_series, since_start, format)
                .into_bytes(),
        }
    }

    /// The window of a profile, narrowed to `--comm` like the series.
    fn profile(&self, profile: &PendingProfile, watch: &Watch) -> Reply {
        let mut report = self
            .windows
            .report_since_adding(&profile.from, &profile.forgotten, watch);
        if !self.settings.comms.is_empty() {
            report.entries.retain(|e| {
                e.comm
                    .as_ref()
                    .is_some_and(|c| self.settings.comms.contains(c))
            });
        }
        match crate::present::pprof::render(&report) {
            Ok(body) => Reply {
                status: 200,
                content_type: "application/octet-stream",
                body,
            },
            Err(err) => Reply::text(500, format!("{err:#}\n")),
        }
    }
}

impl Sink for Server {
    /// A fold is due every FOLD_EVERY, and whenever a request or a profile's end needs one.
    fn poll(&mut self, now: Instant) -> Want {
        self.asked.extend(self.endpoint.requests.try_iter());
        let profiles_due = self.profiles.iter().any(|p| p.due <= now);
        let fold_due = *self.next_fold.get_or_insert(now + FOLD_EVERY);
        if !self.asked.is_empty() || profiles_due || now >= fold_due {
            Want::Snapshot
        } else {
            Want::Nothing
        }
    }

    fn show(&mut self, snapshot: Snapshot<'_>) -> Result<Flow> {
        let Snapshot {
            harvest,
            at: now,
            watch,
            kernel,
        } = snapshot;
        self.fold(harvest, now, watch, kernel);
        for request in std::mem::take(&mut self.asked) {
            let reply = match request.ask {
                Ask::Metrics(format) => self.metrics(format),
                Ask::Profile { seconds } => {
                    self.profiles.push(PendingProfile {
                        from: self.windows.last_mark(),
                        forgotten: Harvest::default(),
                        due: now + Duration::from_secs(seconds),
                        reply: request.reply,
                    });
                    continue;
                }
            };
            // The asker may have given up waiting.
            let _ = request.reply.send(reply);
        }
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.profiles)
            .into_iter()
            .partition(|p| p.due <= now);
        self.profiles = waiting;
        for profile in due {
            let _ = profile.reply.send(self.profile(&profile, watch));
        }
        Ok(Flow::Continue)
    }

    fn wakeup(&self) -> Option<Arc<Notify>> {
        Some(self.endpoint.wakeup.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(url: &str) -> u16 {
        match parse_target(url, None) {
            Ok(_) => 200,
            Err(reply) => reply.status,
        }
    }

    #[test]
    fn paths_and_seconds_are_checked_before_the_loop_is_asked() {
        assert!(matches!(
            parse_target("/metrics", Some("application/openmetrics-text")),
            Ok(Ask::Metrics(Exposition::OpenMetrics))
        ));
        assert!(matches!(
            parse_target("/debug/pprof/mmap_lock?seconds=5", None),
            Ok(Ask::Profile { seconds: 5 })
        ));
        assert!(matches!(
            parse_target("/debug/pprof/mmap_lock", None),
            Ok(Ask::Profile {
                seconds: DEFAULT_PROFILE_SECONDS
            })
        ));
        for bad in ["0", "-1", "x", "3601", "99999999999999999999"] {
            assert_eq!(
                status_of(&format!("/debug/pprof/mmap_lock?seconds={bad}")),
                400,
                "{bad}"
            );
        }
        assert_eq!(status_of("/etc/passwd"), 404);
    }
}
