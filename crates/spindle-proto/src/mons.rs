//! The monitors a client or daemon knows: a comma-separated list of addresses
//! (`127.0.0.1:6789,127.0.0.1:6790,...`) wherever one monitor address used to go, and
//! which of them is in use. Any monitor serves maps; one of them (the Raft leader) decides
//! changes, and the others pass requests on to it, so a caller only needs *a* monitor
//! that answers: it moves to the next one when its connection fails or the monitor says it
//! has no leader (`ErrorCode::NoLeader`).

use crate::auth::ConnectAuth;
use crate::net::{Incoming, NetError, RpcConn};
use crate::transport::Transport;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Monitors at most in one list (a Raft group is 3 or 5; a few more for membership
/// changes in progress).
pub const MONITORS_MAX: usize = 16;

#[derive(Debug)]
pub struct MonAddrs {
    addrs: Vec<String>,
    /// Index of the monitor to try first.
    current: AtomicUsize,
}

impl MonAddrs {
    /// Parses `a,b,c` (spaces around commas allowed). Errors name the problem.
    pub fn parse(list: &str) -> Result<MonAddrs, String> {
        let addrs: Vec<String> = list
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err(format!("no monitor address in {list:?}"));
        }
        if addrs.len() > MONITORS_MAX {
            return Err(format!(
                "{} monitor addresses given; at most {MONITORS_MAX}",
                addrs.len()
            ));
        }
        Ok(MonAddrs {
            addrs,
            current: AtomicUsize::new(0),
        })
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The list as given (for messages).
    pub fn joined(&self) -> String {
        self.addrs.join(",")
    }

    /// The monitor tried first next time.
    pub fn current(&self) -> &str {
        &self.addrs[self.current.load(Ordering::Relaxed) % self.addrs.len()]
    }

    /// Moves on from `addr` (its connection failed, or it has no leader): the next
    /// connection tries the monitor after it first. A no-op if another caller already
    /// moved on.
    pub fn failed(&self, addr: &str) {
        let i = self.current.load(Ordering::Relaxed) % self.addrs.len();
        if self.addrs[i] == addr {
            let _ = self.current.compare_exchange(
                i,
                (i + 1) % self.addrs.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// Prefers `addr` if it is in the list (e.g. the leader a monitor named).
    pub fn prefer(&self, addr: &str) {
        if let Some(i) = self.addrs.iter().position(|a| a == addr) {
            self.current.store(i, Ordering::Relaxed);
        }
    }

    /// Connects to the first monitor that accepts, starting with the current one and
    /// trying each once; the error names every address tried.
    pub async fn connect<T: Transport>(
        &self,
        transport: &T,
        timeout_ms: u64,
        push: Option<mpsc::UnboundedSender<Incoming>>,
        auth: &ConnectAuth,
    ) -> Result<Arc<RpcConn>, NetError> {
        let start = self.current.load(Ordering::Relaxed) % self.addrs.len();
        let mut reasons = Vec::new();
        let mut refused = 0;
        let mut not_ready = false;
        for k in 0..self.addrs.len() {
            let i = (start + k) % self.addrs.len();
            let addr = &self.addrs[i];
            match RpcConn::connect_auth(transport, addr, timeout_ms, push.clone(), auth).await {
                Ok(c) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(c);
                }
                Err(e) => {
                    refused += usize::from(matches!(e, NetError::Auth(_)));
                    not_ready |= matches!(e, NetError::Closed(_));
                    reasons.push(match e {
                        NetError::Auth(why) => why,
                        e => e.to_string(),
                    })
                }
            }
        }
        if refused == self.addrs.len() {
            // Every monitor refused the credentials: retrying will not help.
            return Err(NetError::Auth(reasons.join("; ")));
        }
        if not_ready {
            // A monitor answered but could not authenticate anyone yet (a new cluster's
            // key database not committed yet): worth retrying.
            return Err(NetError::Closed(reasons.join("; ")));
        }
        Err(NetError::Connect {
            addr: self.joined(),
            reason: format!("no monitor reachable: {}", reasons.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_rotate() {
        let m = MonAddrs::parse(" a:1, b:2 ,c:3,").unwrap();
        assert_eq!(m.addrs(), ["a:1", "b:2", "c:3"]);
        assert_eq!(m.current(), "a:1");
        m.failed("b:2"); // not current: nothing moves
        assert_eq!(m.current(), "a:1");
        m.failed("a:1");
        assert_eq!(m.current(), "b:2");
        m.prefer("c:3");
        assert_eq!(m.current(), "c:3");
        m.failed("c:3");
        assert_eq!(m.current(), "a:1");
        assert!(MonAddrs::parse(" , ").is_err());
        let many = vec!["x:1"; MONITORS_MAX + 1].join(",");
        assert!(MonAddrs::parse(&many).is_err());
    }
}
