//! `mmapsem-trace serve`: a continuous trace shown over HTTP instead of on a terminal.
//!
//! The endpoint's threads only parse requests and wait; the collect loop answers them through
//! this sink: every FOLD_EVERY, and at each request, it asks for a snapshot and folds the
//! interval's report into the series (`model::series`), so that counters keep growing whatever
//! became of the processes behind them. A profile request opens a window of the session and is
//! answered once its seconds have passed, with the report the window closes with. The session
//! lets go of the processes and threads that are gone (`Forgetting::Entirely`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use tokio::sync::Notify;

use crate::cli::ServeArgs;
use crate::collect::{Flow, Shown, Sink, Want, WindowId};
use crate::model::series::{Series, SeriesSettings};
use crate::model::{LiveSnapshot, Report};
use crate::present::openmetrics::{self, Exposition};

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
    window: WindowId,
    due: Instant,
    reply: Sender<Reply>,
}

/// The collect loop's side: folds windows into series and answers the endpoint.
pub struct Server {
    endpoint: Endpoint,
    settings: SeriesSettings,
    series: Series,
    /// The trace since its start at the last fold: totals, losses, self-cost.
    since_start: Option<Report>,
    /// When the next fold is due (set at the first tick).
    next_fold: Option<Instant>,
    profiles: Vec<PendingProfile>,
    /// Profiles whose windows the next snapshot closes.
    closing: Vec<PendingProfile>,
    /// Requests taken in by the last poll, answered once the snapshot they need is folded.
    asked: Vec<Request>,
}

impl Server {
    pub fn new(endpoint: Endpoint, args: &ServeArgs) -> Self {
        Self {
            endpoint,
            settings: SeriesSettings {
                label_pid: args.label_pid,
                label_cgroup: args.label_cgroup,
                max_series: args.max_series as usize,
                comms: args.comms.clone(),
            },
            series: Series::default(),
            since_start: None,
            next_fold: None,
            profiles: Vec::new(),
            closing: Vec::new(),
            asked: Vec::new(),
        }
    }

    fn fold(&mut self, live: LiveSnapshot, at: Instant) {
        self.series.fold(&live.interval, &self.settings);
        self.since_start = Some(live.cumulative);
        self.next_fold = Some(at + FOLD_EVERY);
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

    /// A profile's window, narrowed to `--comm` like the series.
    fn profile(&self, mut report: Report) -> Reply {
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

    /// Answers the requests the last poll took in: metrics now, profiles once their window
    /// (opened by this snapshot, `opened` in the order asked) closes.
    fn answer_asked(&mut self, at: Instant, opened: Vec<WindowId>) {
        let mut opened = opened.into_iter();
        for request in std::mem::take(&mut self.asked) {
            let reply = match request.ask {
                Ask::Metrics(format) => self.metrics(format),
                Ask::Profile { seconds } => match opened.next() {
                    Some(window) => {
                        self.profiles.push(PendingProfile {
                            window,
                            due: at + Duration::from_secs(seconds),
                            reply: request.reply,
                        });
                        continue;
                    }
                    None => Reply::text(500, "no window was opened for the profile\n"),
                },
            };
            // The asker may have given up waiting.
            let _ = request.reply.send(reply);
        }
    }

    /// Sends each closing profile the report of its window.
    fn answer_closed(&mut self, mut closed: Vec<(WindowId, Report)>) {
        for profile in std::mem::take(&mut self.closing) {
            let reply = match closed.iter().position(|(id, _)| *id == profile.window) {
                Some(at) => self.profile(closed.swap_remove(at).1),
                None => Reply::text(500, "the profile's window was lost\n"),
            };
            let _ = profile.reply.send(reply);
        }
    }
}

impl Sink for Server {
    /// A fold is due every FOLD_EVERY, and whenever a request or a profile's end needs one.
    fn poll(&mut self, now: Instant) -> Want {
        self.asked.extend(self.endpoint.requests.try_iter());
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.profiles)
            .into_iter()
            .partition(|p| p.due <= now);
        self.profiles = waiting;
        self.closing.extend(due);
        let fold_due = *self.next_fold.get_or_insert(now + FOLD_EVERY);
        if self.asked.is_empty() && self.closing.is_empty() && now < fold_due {
            return Want::Nothing;
        }
        let open = self
            .asked
            .iter()
            .filter(|r| matches!(r.ask, Ask::Profile { .. }))
            .count();
        Want::Snapshot(crate::collect::Ask {
            per_thread: false,
            reset: false,
            open,
            close: self.closing.iter().map(|p| p.window).collect(),
        })
    }

    fn show(&mut self, shown: Shown) -> Result<Flow> {
        let Shown {
            at,
            live,
            opened,
            closed,
        } = shown;
        self.fold(live, at);
        self.answer_asked(at, opened);
        self.answer_closed(closed);
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
