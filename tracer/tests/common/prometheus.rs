//! Debian's Prometheus server run by a test: its own binary, a temporary data directory, the
//! test's scrape config, loopback only; asked through its HTTP API.

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::http::http_get;
use super::slowdown;

pub struct Prometheus {
    child: Child,
    address: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `/usr/bin/prometheus` with `config` (YAML) and waits until it says it is ready.
    pub fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("prometheus.yml");
        fs::write(&config_path, config).unwrap();
        let address = free_loopback_address();
        let log = fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Debian's prometheus (`cargo xtask setup` installs it)");
        let mut server = Self {
            child,
            address,
            dir,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30 * slowdown());
        loop {
            if let Ok((200, _)) = http_get(self.address, "/-/ready", None) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// An instant query's result vector (`/api/v1/query`): each element's `metric` labels and
    /// `value`.
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent_encoded(promql));
        let (status, body) =
            http_get(self.address, &path, None).unwrap_or_else(|err| panic!("{promql}: {err}"));
        let answer: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|err| panic!("{promql}: {err}: {}", String::from_utf8_lossy(&body)));
        assert_eq!(status, 200, "{promql}: {answer}");
        assert_eq!(answer["status"], "success", "{promql}: {answer}");
        assert_eq!(answer["data"]["resultType"], "vector", "{promql}: {answer}");
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// Asks `promql` every half second until `done` accepts the answer or `seconds` (times the
    /// slowdown) have passed, and returns the last answer: the caller asserts on it.
    pub fn settled(
        &self,
        promql: &str,
        seconds: u64,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(seconds * slowdown());
        loop {
            let answer = self.query(promql);
            if done(&answer) || Instant::now() >= deadline {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sample's value (Prometheus sends it as a string beside its timestamp).
pub fn value(sample: &Value) -> f64 {
    let text = sample["value"][1].as_str().expect("[time, \"value\"]");
    text.parse()
        .unwrap_or_else(|_| panic!("not a number: {sample}"))
}

/// The samples whose labels include `label=value`.
pub fn labelled<'a>(samples: &'a [Value], label: &str, value: &str) -> Vec<&'a Value> {
    samples
        .iter()
        .filter(|s| s["metric"][label] == value)
        .collect()
}

/// A loopback address with a port nobody listens on now (the kernel's pick).
fn free_loopback_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
}

/// A query string's value: everything but RFC 3986's unreserved characters percent-encoded.
pub fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
