//! Loopback addresses for tests: port 0, so the kernel picks a free port and tests run in parallel.

use std::net::SocketAddr;

/// `127.0.0.1:0`: bind here and read the port back from the socket.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
