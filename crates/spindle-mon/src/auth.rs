//! The monitors' key database and what they decide with it: who may connect, the tickets
//! they issue, and which requests an entity's capabilities allow. The scheme itself (the
//! handshake, tickets, MACs) is `spindle_proto::auth`.
//!
//! The database is part of the monitors' replicated state (a Raft entry carries the whole
//! database after each change, applied only on top of the version it was made from). It
//! is never sent with the map; keys leave a monitor only sealed under the key of the
//! entity that asked (`auth get`, `auth add`), or under the monitors' own key when a
//! follower passes a change on to the leader.

use crate::command::AdminCommand;
use serde::{Deserialize, Serialize};
use spindle_proto::auth::{
    parse_entity, seal_service_key, AuthError, Caps, EntityKind, Key, Keyring, Peer, Perm, Ticket,
    Verifier,
};
use spindle_proto::Msg;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Keys in the database at most (each entry is ~100 bytes; a database of this size is one
/// small Raft entry).
pub const ENTITIES_MAX: usize = 10_000;

/// One entity's key and capabilities.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthEntity {
    pub key: [u8; 32],
    /// Canonical capability text (`Caps::to_text`); daemons need none.
    pub caps: String,
}

/// The key database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthDb {
    /// Bumped by one per change.
    pub version: u64,
    /// The service key: seals tickets; known to the monitors and the storage daemons.
    pub service_key: [u8; 32],
    pub entities: BTreeMap<String, AuthEntity>,
}

impl AuthDb {
    pub fn encode(&self) -> Vec<u8> {
        crate::raft::encode(self)
    }

    pub fn decode(b: &[u8]) -> Result<AuthDb, String> {
        let db: AuthDb = crate::raft::decode(b)?;
        if db.entities.len() > ENTITIES_MAX {
            return Err(format!("more than {ENTITIES_MAX} entities"));
        }
        Ok(db)
    }

    /// The first database of a cluster from a keyring: every entry but `mon.` (the
    /// monitors' key stays in their keyrings), `client.admin` with every capability
    /// unless the keyring says otherwise; a fresh service key.
    pub fn from_keyring(k: &Keyring) -> Result<AuthDb, AuthError> {
        let mut entities = BTreeMap::new();
        for e in &k.entries {
            let kind = parse_entity(&e.entity)?;
            if kind == EntityKind::Mon {
                continue;
            }
            let caps = match (&e.caps, &kind) {
                (Some(c), _) => Caps::parse(c)?.to_text(),
                (None, EntityKind::Client(n)) if n == "admin" => Caps::admin().to_text(),
                _ => String::new(),
            };
            entities.insert(e.entity.clone(), AuthEntity { key: e.key.0, caps });
        }
        Ok(AuthDb {
            version: 1,
            service_key: Key::random().0,
            entities,
        })
    }

    pub fn key_of(&self, entity: &str) -> Option<Key> {
        self.entities.get(entity).map(|e| Key(e.key))
    }

    /// The ticket reply for authenticated `entity` (a daemon also gets the service key).
    pub fn ticket_for(&self, entity: &str, now_unix_ms: u64) -> Result<Msg, String> {
        let e = self
            .entities
            .get(entity)
            .ok_or_else(|| format!("{entity} is not in the key database (removed?)"))?;
        let key = Key(e.key);
        let service = Key(self.service_key);
        let t = Ticket::issue(entity, &e.caps, now_unix_ms);
        let is_daemon = matches!(parse_entity(entity), Ok(EntityKind::Osd(_)));
        Ok(Msg::AuthTicket {
            ticket: t.seal(&service),
            session: t.seal_session(&key),
            service: if is_daemon {
                seal_service_key(&service, &key)
            } else {
                Vec::new()
            },
        })
    }
}

impl AuthDb {
    /// The ticket reply for a monitor (`mon.`, authenticated with the monitors' key):
    /// every capability, for the monitors' own background work on the daemons (the
    /// snapshot trimmer).
    pub fn ticket_for_monitor(&self, mon_key: &Key, now_unix_ms: u64) -> Msg {
        let t = Ticket::issue("mon.", &Caps::admin().to_text(), now_unix_ms);
        Msg::AuthTicket {
            ticket: t.seal(&Key(self.service_key)),
            session: t.seal_session(mon_key),
            service: Vec::new(),
        }
    }
}

/// A change of the key database (what `auth add|caps|rm` decide at the monitor that
/// received the command; the leader applies it to the latest version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthChange {
    /// Add an entity (refused if it exists, unless the key and caps are the same).
    Add {
        entity: String,
        key: [u8; 32],
        caps: String,
    },
    SetCaps {
        entity: String,
        caps: String,
    },
    Remove {
        entity: String,
    },
}

impl AuthChange {
    /// The database after this change, or why not.
    pub fn apply(&self, db: &AuthDb) -> Result<AuthDb, String> {
        let mut next = db.clone();
        next.version += 1;
        match self {
            AuthChange::Add { entity, key, caps } => {
                if let Some(e) = db.entities.get(entity) {
                    if e.key == *key && e.caps == *caps {
                        return Ok(db.clone());
                    }
                    return Err(format!("{entity} exists already (auth rm it first)"));
                }
                if db.entities.len() >= ENTITIES_MAX {
                    return Err(format!(
                        "the key database is full ({ENTITIES_MAX} entities)"
                    ));
                }
                next.entities.insert(
                    entity.clone(),
                    AuthEntity {
                        key: *key,
                        caps: caps.clone(),
                    },
                );
            }
            AuthChange::SetCaps { entity, caps } => match next.entities.get_mut(entity) {
                Some(e) => e.caps = caps.clone(),
                None => return Err(format!("no entity {entity}")),
            },
            AuthChange::Remove { entity } => {
                if entity == "client.admin" {
                    return Err("client.admin cannot be removed".into());
                }
                if next.entities.remove(entity).is_none() {
                    return Err(format!("no entity {entity}"));
                }
            }
        }
        Ok(next)
    }
}

/// The monitors' verifier: `mon.` proves the monitors' shared key, every other entity its
/// key in the applied database.
pub struct MonVerifier {
    pub mon_key: Key,
    pub sm: crate::raft::StateMachine,
    pub encrypt: bool,
}

impl Verifier for MonVerifier {
    fn encrypt(&self) -> bool {
        self.encrypt
    }
    fn ready(&self, entity: &str) -> Result<(), String> {
        match self.sm.auth() {
            _ if entity == "mon." => Ok(()),
            Some(_) => Ok(()),
            None => Err("this monitor has no key database yet".into()),
        }
    }

    fn accept(&self, entity: &str, ticket: &[u8]) -> Result<(Key, Arc<Peer>), AuthError> {
        let kind = parse_entity(entity)?;
        if !ticket.is_empty() {
            return Err(AuthError("a monitor takes keys, not tickets".into()));
        }
        if kind == EntityKind::Mon {
            return Ok((
                self.mon_key.clone(),
                Arc::new(Peer {
                    entity: entity.to_string(),
                    kind,
                    caps: Caps::admin(),
                }),
            ));
        }
        let db = self
            .sm
            .auth()
            .ok_or_else(|| AuthError("this monitor has no key database yet (retry)".into()))?;
        let e = db
            .entities
            .get(entity)
            .ok_or_else(|| AuthError(format!("unknown entity {entity}")))?;
        let caps = Caps::parse(&e.caps)?;
        Ok((
            Key(e.key),
            Arc::new(Peer {
                entity: entity.to_string(),
                kind,
                caps,
            }),
        ))
    }
}

/// Whether `peer` may send `msg` to a monitor (None: yes; Some: why not).
pub fn refusal(peer: &Peer, msg: &Msg) -> Option<String> {
    if peer.kind == EntityKind::Mon {
        return None;
    }
    let who = &peer.entity;
    match msg {
        Msg::MonRaft { .. } => Some(format!("{who} is not a monitor")),
        Msg::OsdBoot { osd_id, .. } | Msg::Heartbeat { osd_id, .. } => (peer.kind
            != EntityKind::Osd(*osd_id))
        .then(|| format!("{who} cannot speak for osd.{osd_id}")),
        Msg::GetMap { .. } => (!peer.is_daemon() && !peer.caps.mon_allows(Perm::R))
            .then(|| format!("{who} has no `mon allow r`")),
        Msg::Command { args } => {
            if peer.is_daemon() {
                return None;
            }
            let caps = &peer.caps;
            match AdminCommand::parse(args) {
                // Malformed: the monitor's parser answers with the error.
                Err(_) => None,
                Ok(cmd) => match cmd {
                    AdminCommand::Status
                    | AdminCommand::PoolLs
                    | AdminCommand::CrushGet
                    | AdminCommand::MonLs => {
                        (!caps.mon_allows(Perm::R)).then(|| format!("{who} has no `mon allow r`"))
                    }
                    AdminCommand::LockAcquire { pool, .. }
                    | AdminCommand::LockRenew { pool, .. }
                    | AdminCommand::LockRelease { pool, .. }
                    | AdminCommand::Snap { pool, .. }
                    | AdminCommand::SnapTrimmed { pool, .. } => (!caps
                        .osd_allows_images(&pool, spindle_proto::auth::Access::Write))
                    .then(|| format!("{who} may not write images in pool {pool}")),
                    // A clone reads its parent's snapshot and is written in its own pool.
                    AdminCommand::SnapChild {
                        add,
                        pool,
                        child_pool,
                        ..
                    } => {
                        if !caps.osd_allows_images(&child_pool, spindle_proto::auth::Access::Write)
                        {
                            Some(format!("{who} may not write images in pool {child_pool}"))
                        } else if add
                            && !caps.osd_allows_images(&pool, spindle_proto::auth::Access::Read)
                        {
                            Some(format!("{who} may not read images in pool {pool}"))
                        } else {
                            None
                        }
                    }
                    AdminCommand::AuthLs
                    | AdminCommand::AuthGet { .. }
                    | AdminCommand::AuthAdd { .. }
                    | AdminCommand::AuthCaps { .. }
                    | AdminCommand::AuthRm { .. }
                    | AdminCommand::AuthApply { .. } => (!caps.mon_allows(Perm::All))
                        .then(|| format!("{who} has no `mon allow *` (needed for keys)")),
                    AdminCommand::MonMetrics { .. } => (!caps.mon_allows(Perm::All))
                        .then(|| format!("{who} has no `mon allow *` (monitors register)")),
                    AdminCommand::MetricsRegister { .. } => (!caps.mon_allows(Perm::Rw))
                        .then(|| format!("{who} has no `mon allow rw` (needed to register)")),
                    _ => (!caps.mon_allows(Perm::Rw))
                        .then(|| format!("{who} has no `mon allow rw` (needed to change the map)")),
                },
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_proto::auth::KeyringEntry;

    fn db() -> AuthDb {
        let mut k = Keyring::default();
        for e in ["client.admin", "osd.0", "mon."] {
            k.set(KeyringEntry {
                entity: e.into(),
                key: Key::random(),
                caps: None,
            });
        }
        AuthDb::from_keyring(&k).unwrap()
    }

    #[test]
    fn database_from_keyring_and_changes() {
        let d = db();
        assert_eq!(d.version, 1);
        assert!(d.entities.contains_key("osd.0") && !d.entities.contains_key("mon."));
        assert_eq!(d.entities["client.admin"].caps, Caps::admin().to_text());
        assert_eq!(AuthDb::decode(&d.encode()).unwrap(), d);
        let add = AuthChange::Add {
            entity: "client.r".into(),
            key: [7; 32],
            caps: "mon allow r".into(),
        };
        let d2 = add.apply(&d).unwrap();
        assert_eq!(d2.version, 2);
        // The same add again is a no-op; another key for the same entity is refused.
        assert_eq!(add.apply(&d2).unwrap(), d2);
        let other = AuthChange::Add {
            entity: "client.r".into(),
            key: [8; 32],
            caps: "mon allow r".into(),
        };
        assert!(other.apply(&d2).is_err());
        let d3 = AuthChange::Remove {
            entity: "client.r".into(),
        }
        .apply(&d2)
        .unwrap();
        assert!(!d3.entities.contains_key("client.r"));
        assert!(AuthChange::Remove {
            entity: "client.admin".into()
        }
        .apply(&d3)
        .is_err());
    }

    #[test]
    fn tickets_carry_the_service_key_only_for_daemons() {
        let d = db();
        let Msg::AuthTicket {
            ticket, service, ..
        } = d.ticket_for("osd.0", 5).unwrap()
        else {
            panic!()
        };
        let t = Ticket::open(&Key(d.service_key), &ticket, 5).unwrap();
        assert_eq!(t.entity, "osd.0");
        assert_eq!(
            spindle_proto::auth::open_service_key(&d.key_of("osd.0").unwrap(), &service).unwrap(),
            Key(d.service_key)
        );
        let Msg::AuthTicket { service, .. } = d.ticket_for("client.admin", 5).unwrap() else {
            panic!()
        };
        assert!(service.is_empty());
        assert!(d.ticket_for("client.nobody", 5).is_err());
    }

    #[test]
    fn monitor_requests_need_their_capabilities() {
        let peer = |kind: EntityKind, caps: &str| Peer {
            entity: "client.t".into(),
            kind,
            caps: Caps::parse(caps).unwrap(),
        };
        let cmd = |a: &[&str]| Msg::Command {
            args: a.iter().map(|s| s.to_string()).collect(),
        };
        let ro = peer(EntityKind::Client("t".into()), "mon allow r");
        assert!(refusal(&ro, &cmd(&["status"])).is_none());
        assert!(refusal(&ro, &cmd(&["pool", "rm", "default"])).is_some());
        assert!(refusal(&ro, &cmd(&["auth", "ls"])).is_some());
        assert!(refusal(
            &ro,
            &Msg::MonRaft {
                rpc: 1,
                body: vec![]
            }
        )
        .is_some());
        let boot = Msg::OsdBoot {
            osd_id: 1,
            addr: "a".into(),
            pid: 1,
        };
        assert!(refusal(&ro, &boot).is_some());
        assert!(refusal(&peer(EntityKind::Osd(1), ""), &boot).is_none());
        assert!(refusal(&peer(EntityKind::Osd(2), ""), &boot).is_some());
        let none = peer(EntityKind::Client("t".into()), "");
        assert!(refusal(
            &none,
            &Msg::GetMap {
                have_epoch: 0,
                subscribe: false
            }
        )
        .is_some());
        let admin = peer(EntityKind::Client("admin".into()), &Caps::admin().to_text());
        assert!(refusal(&admin, &cmd(&["auth", "ls"])).is_none());
    }
}
