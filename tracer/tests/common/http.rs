//! A plain HTTP client for the daemon's endpoint.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};

/// A plain HTTP/1.0 GET: status and body.
pub fn http_get(
    address: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(address)?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\n{accept}\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP header");
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    Ok((status, response[split + 4..].to_vec()))
}

/// The address in the daemon's `serving http://ADDR/metrics ...` line.
pub fn serving_address(line: &str) -> SocketAddr {
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}
