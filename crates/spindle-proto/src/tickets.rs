//! A process's credentials at run time: its identity (for monitors) and the ticket the
//! monitors issued it (for storage daemons), renewed at half its life; for a storage
//! daemon also the service key that opens other entities' tickets.

use crate::auth::{open_service_key, unix_ms, ConnectAuth, Identity, Key, Ticket, TICKET_TTL_MS};
use crate::msg::typed;
use crate::net::RpcConn;
use std::sync::{Arc, Mutex};

struct Held {
    ticket: Arc<Vec<u8>>,
    session_key: Key,
    expires_unix_ms: u64,
    service_key: Option<Key>,
}

/// Credentials of a client or a daemon.
pub struct Credentials {
    identity: Arc<Identity>,
    held: Mutex<Option<Held>>,
}

impl Credentials {
    pub fn new(identity: Identity) -> Arc<Credentials> {
        Arc::new(Credentials {
            identity: Arc::new(identity),
            held: Mutex::new(None),
        })
    }

    pub fn entity(&self) -> &str {
        &self.identity.entity
    }

    /// How to authenticate to a monitor.
    pub fn mon_auth(&self) -> ConnectAuth {
        ConnectAuth::Key(self.identity.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the ticket is missing or past half its life.
    pub fn needs_ticket(&self) -> bool {
        let now = unix_ms();
        self.lock()
            .as_ref()
            .is_none_or(|h| h.expires_unix_ms.saturating_sub(now) < TICKET_TTL_MS / 2)
    }

    /// Drops the ticket (a daemon refused it): the next use fetches a new one.
    pub fn forget_ticket(&self) {
        *self.lock() = None;
    }

    /// How to authenticate to a storage daemon (None until a ticket was fetched).
    pub fn osd_auth(&self) -> Option<ConnectAuth> {
        self.lock().as_ref().map(|h| ConnectAuth::Ticket {
            entity: self.identity.entity.clone(),
            ticket: h.ticket.clone(),
            session_key: h.session_key.clone(),
        })
    }

    /// The service key (storage daemons only, once a ticket was fetched).
    pub fn service_key(&self) -> Option<Key> {
        self.lock().as_ref().and_then(|h| h.service_key.clone())
    }

    /// Fetches a new ticket over an authenticated monitor connection.
    pub async fn fetch_ticket(&self, mon: &RpcConn) -> Result<(), String> {
        let t = mon
            .request(0, typed::AuthTicketGet {}, 5000)
            .await
            .map_err(|e| format!("ticket from {}: {e}", mon.peer()))?;
        let (session_key, expires_unix_ms) =
            Ticket::open_session(&self.identity.key, &t.session).map_err(|e| e.to_string())?;
        let service_key = if t.service.is_empty() {
            None
        } else {
            Some(open_service_key(&self.identity.key, &t.service).map_err(|e| e.to_string())?)
        };
        *self.lock() = Some(Held {
            ticket: Arc::new(t.ticket),
            session_key,
            expires_unix_ms,
            service_key,
        });
        Ok(())
    }

    /// A storage daemon's own ticket, made with the service key (daemons trust each other
    /// as the monitors trust them): what it connects to other daemons with.
    pub fn self_ticket(&self) -> Option<ConnectAuth> {
        let service = self.service_key()?;
        let t = Ticket::issue(&self.identity.entity, "", unix_ms());
        Some(ConnectAuth::Ticket {
            entity: self.identity.entity.clone(),
            ticket: Arc::new(t.seal(&service)),
            session_key: t.session_key,
        })
    }
}
