//! Exclusive image locks, as a client takes them (the monitor decides: `spindle_mon`'s
//! `locks` module). The lock is held by this client's id; a client that loses it (taken
//! over with `--break-lock`, or its lease ran out) is fenced, and the daemons refuse its
//! writes with [`ClientError::Fenced`].

use crate::{Client, ClientError};

/// An image lock this client now holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct LockGrant {
    /// The map epoch holding the lock; this client's map is at least this new when
    /// [`Client::lock_acquire`] returns.
    pub epoch: u64,
    /// Takeovers of this image's lock so far, plus one.
    pub generation: u64,
    /// The previous holder, now fenced, when the lock was taken over.
    pub taken_from: Option<String>,
}

/// The monitor command that takes the lock (`spindle_mon::Admin::lock_acquire`'s
/// arguments; a test pins the two together).
pub fn lock_acquire_args(
    pool: &str,
    image: &str,
    client: u64,
    lease_ms: u64,
    holder: &str,
    take_over: bool,
) -> Vec<String> {
    vec![
        "lock".into(),
        "acquire".into(),
        pool.into(),
        image.into(),
        format!("{client:x}"),
        lease_ms.to_string(),
        holder.into(),
        if take_over { "break" } else { "keep" }.into(),
    ]
}

/// `lock renew` or `lock release` (`verb`) of `image` for `client`.
pub fn lock_args(verb: &str, pool: &str, image: &str, client: u64) -> Vec<String> {
    vec![
        "lock".into(),
        verb.into(),
        pool.into(),
        image.into(),
        format!("{client:x}"),
    ]
}

impl Client {
    /// Takes `image`'s exclusive lock for this client with a lease of `lease_ms` (renew it
    /// with [`Client::lock_renew`] every third of that). A lock another client holds is
    /// taken over, and that client fenced, only if its lease ran out or `take_over` is set;
    /// otherwise the monitor's refusal names the holder ([`ClientError::Command`]). A
    /// fenced client gets [`ClientError::Fenced`].
    pub async fn lock_acquire(
        &self,
        pool: &str,
        image: &str,
        lease_ms: u64,
        holder: &str,
        take_over: bool,
    ) -> Result<LockGrant, ClientError> {
        let args = lock_acquire_args(pool, image, self.client_id(), lease_ms, holder, take_over);
        let grant: LockGrant = match self.command_as(args).await {
            // The monitors refuse every lock to a fenced client; say so as the type.
            Err(ClientError::Command(m)) if self.map().fenced.contains_key(&self.client_id()) => {
                return Err(ClientError::Fenced(m))
            }
            r => r?,
        };
        // Our requests must carry the epoch that holds the lock (and the fence): a daemon
        // serves none of them before it has that map.
        if !self.wait_for_epoch(grant.epoch, 10_000).await {
            return Err(ClientError::Timeout {
                ms: 10_000,
                last: format!(
                    "waiting for map epoch {} after taking the lock",
                    grant.epoch
                ),
            });
        }
        Ok(grant)
    }

    /// Extends the lease of a lock this client holds. [`ClientError::Fenced`] when the lock
    /// is no longer ours; other errors (the monitor unreachable) are worth retrying.
    pub async fn lock_renew(&self, pool: &str, image: &str) -> Result<(), ClientError> {
        let args = lock_args("renew", pool, image, self.client_id());
        match self.command_as::<serde_json::Value>(args).await {
            Ok(_) => Ok(()),
            Err(ClientError::Command(m)) if m.starts_with("lock lost") => {
                Err(ClientError::Fenced(m))
            }
            Err(e) => Err(e),
        }
    }

    /// Releases a lock this client holds (nothing happens if it holds none).
    pub async fn lock_release(&self, pool: &str, image: &str) -> Result<(), ClientError> {
        let args = lock_args("release", pool, image, self.client_id());
        self.command_as::<serde_json::Value>(args).await.map(|_| ())
    }

    /// Records that every copy the first `removals` snapshot removals of `image` left is
    /// deleted (what the snapshot trimmer reports).
    pub async fn snap_trimmed(
        &self,
        pool: &str,
        image: &str,
        removals: u64,
    ) -> Result<(), ClientError> {
        let args = vec![
            "snap".to_string(),
            "trimmed".to_string(),
            pool.to_string(),
            image.to_string(),
            removals.to_string(),
        ];
        let _: SnapDone = self.command_as(args).await?;
        Ok(())
    }

    /// `snap VERB` on `image`'s snapshot `snap` (the monitor's `snaps` module decides);
    /// `size_bytes` is the image's size for `create`. Once the map holding the change is
    /// installed here, it is pushed to every primary of the pool ([`Client::map_barrier`]):
    /// from then on no primary accepts a write that was not preserved for a new snapshot,
    /// so a write issued after this returns is never in the snapshot.
    pub async fn snap_command(
        &self,
        verb: &str,
        pool: &str,
        image: &str,
        snap: &str,
        size_bytes: u64,
    ) -> Result<SnapDone, ClientError> {
        let args = vec![
            "snap".to_string(),
            verb.to_string(),
            pool.to_string(),
            image.to_string(),
            snap.to_string(),
            size_bytes.to_string(),
        ];
        let done: SnapDone = self.command_as(args).await?;
        self.map_barrier(pool, done.epoch).await?;
        Ok(done)
    }
}

impl Client {
    /// Registers (`add`) or drops clone `child_pool`/`child` of snapshot
    /// `pool`/`image`@`snap` in the cluster map (the monitor refuses to register a clone
    /// of an unprotected snapshot, and to unprotect a snapshot with clones).
    pub async fn snap_child(
        &self,
        add: bool,
        pool: &str,
        image: &str,
        snap: &str,
        child_pool: &str,
        child: &str,
    ) -> Result<SnapDone, ClientError> {
        let args = vec![
            "snap".to_string(),
            "child".to_string(),
            if add { "add" } else { "rm" }.to_string(),
            pool.to_string(),
            image.to_string(),
            snap.to_string(),
            child_pool.to_string(),
            child.to_string(),
        ];
        let done: SnapDone = self.command_as(args).await?;
        self.wait_for_epoch(done.epoch, 10_000).await;
        Ok(done)
    }
}

/// A snapshot command's answer (`spindle_mon::reply::SnapDone`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct SnapDone {
    /// The map epoch holding the change.
    pub epoch: u64,
    /// The snapshot's id (0 for `forget`).
    pub id: u64,
}
