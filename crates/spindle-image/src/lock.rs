//! The exclusive lock of an image opened for writing (`spindle nbd`): taken from the
//! monitor when the image is opened, renewed in the background every third of its lease,
//! released on a graceful stop.
//!
//! A second opener is refused while the holder's lease is live, with the holder named. It
//! takes over:
//! - with `take_over` (`spindle nbd --break-lock`): the holder is fenced, and the daemons
//!   refuse its writes from then on;
//! - by itself when the lease ran out (the holder stopped renewing), or when the holder
//!   was a process on this host that no longer exists (a `spindle nbd` killed and started
//!   again need not wait for the lease): the holder is fenced just the same.
//!
//! A keeper that learns it lost the lock (a renewal answered "lost", or a write refused as
//! fenced) refuses every later operation: a fenced holder must not serve reads from its
//! cache either.
//!
//! Fencing is per client, as Ceph blocklists a client instance: an NBD server fenced for
//! one image can no longer write any image.

use spindle_client::{Client, ClientError};
use spindle_types::limits::IMAGE_LOCK_LEASE_MS_DEFAULT;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::image::ImageError;

/// How an image lock is taken.
#[derive(Clone, Debug)]
pub struct LockOptions {
    /// Take the lock over from a live holder, fencing it (`--break-lock`).
    pub take_over: bool,
    /// The lease; renewed every third of it.
    pub lease_ms: u64,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            take_over: false,
            lease_ms: IMAGE_LOCK_LEASE_MS_DEFAULT,
        }
    }
}

/// What a holder description ends with when the holder acknowledges writes from a client
/// write log (`spindle nbd --write-log`): writes it acknowledged may be only in its log,
/// so a snapshot taken meanwhile would miss them (`snap create` refuses).
pub const WRITE_LOG_HOLDER_MARK: &str = "--write-log";

/// Whether lock holder `holder` acknowledges writes from a client write log.
pub fn holder_has_write_log(holder: &str) -> bool {
    holder.ends_with(WRITE_LOG_HOLDER_MARK)
}

/// Who this process is, as a lock holder: `host H pid P start S PROGRAM`. `start` is the
/// process start time in clock ticks since boot (`/proc/PID/stat` field 22), so a reused
/// pid is not mistaken for the holder.
/// The holder of `image`'s lock when it acknowledges writes from a client write log
/// (live or crashed): acknowledged writes may be only in that log until it is replayed.
pub fn write_log_holder(client: &Client, pool: &str, image: &str) -> Option<String> {
    let map = client.map();
    map.pool_by_name(pool)
        .and_then(|p| map.image_locks.get(&(p.id, image.to_string())))
        .map(|l| l.holder.clone())
        .filter(|h| holder_has_write_log(h))
}

pub fn holder_description(program: &str) -> String {
    let pid = std::process::id();
    format!(
        "host {} pid {pid} start {} {program}",
        hostname(),
        process_start(pid).unwrap_or(0)
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The start time of live process `pid` (None if there is none, or it is a zombie: it
/// has exited and only waits to be reaped).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3, the state.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether `holder` (a [`holder_description`]) names a process of this host that is gone.
pub fn holder_is_gone(holder: &str) -> bool {
    let words: Vec<&str> = holder.split_whitespace().collect();
    let field = |name: &str| {
        words
            .iter()
            .position(|w| *w == name)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let (Some(host), Some(pid), Some(start)) = (field("host"), field("pid"), field("start")) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    host == hostname() && process_start(pid) != Some(start)
}

/// The lock of one image, held while this value lives (released by [`ImageLock::release`]).
pub struct ImageLock {
    client: Arc<Client>,
    pool: String,
    image: String,
    /// Why the lock is no longer ours, once it is not.
    lost: Arc<Mutex<Option<String>>>,
    generation: u64,
    _renewer: tokio::task::JoinHandle<()>,
}

impl Drop for ImageLock {
    fn drop(&mut self) {
        self._renewer.abort();
    }
}

fn lost_reason(lost: &Mutex<Option<String>>) -> Option<String> {
    lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn mark_lost(lost: &Mutex<Option<String>>, why: String) {
    let mut l = lost.lock().unwrap_or_else(|p| p.into_inner());
    if l.is_none() {
        tracing::error!("{why}");
        *l = Some(why);
    }
}

impl ImageLock {
    /// Takes the lock of `pool/image` for `client` (see the module documentation).
    pub async fn acquire(
        client: Arc<Client>,
        pool: &str,
        image: &str,
        holder: &str,
        options: &LockOptions,
    ) -> Result<ImageLock, ImageError> {
        // Taking the lock from a writer with a client write log, without a log of our own
        // to replay it into the image, would lose the writes acknowledged only in its log
        // (whether that writer is alive, stalled or gone).
        if !holder_has_write_log(holder) {
            if let Some(h) = write_log_holder(&client, pool, image) {
                return Err(ImageError::Locked(format!(
                    "image {pool}/{image} is held by a writer with a client write log ({h}): \
                     acknowledged writes may be only in its log; serve the image with \
                     `spindle nbd --write-log` (which replays the log) and stop that server \
                     before using it otherwise"
                )));
            }
        }
        let first = client
            .lock_acquire(pool, image, options.lease_ms, holder, options.take_over)
            .await;
        let grant = match first {
            Ok(g) => g,
            Err(ClientError::Command(refusal)) if refusal.contains("is locked by") => {
                // Held by a live lease: take it over by ourselves only if the holder was a
                // process of this host that is gone.
                let map = client.map();
                let held = map
                    .pool_by_name(pool)
                    .and_then(|p| map.image_locks.get(&(p.id, image.to_string())));
                match held {
                    Some(l) if holder_is_gone(&l.holder) => {
                        tracing::warn!(
                            "image {pool}/{image}: the lock holder ({}) is gone; taking over its lock",
                            l.holder
                        );
                        client
                            .lock_acquire(pool, image, options.lease_ms, holder, true)
                            .await?
                    }
                    _ => return Err(ImageError::Locked(refusal)),
                }
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(from) = &grant.taken_from {
            tracing::warn!(
                "image {pool}/{image}: took the lock over from {from} (generation {})",
                grant.generation
            );
        }
        let lost = Arc::new(Mutex::new(None));
        let renewer = {
            let (client, pool, image, lost) = (
                client.clone(),
                pool.to_string(),
                image.to_string(),
                lost.clone(),
            );
            let every = Duration::from_millis((options.lease_ms / 3).max(100));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match client.lock_renew(&pool, &image).await {
                        Ok(()) => {}
                        Err(ClientError::Fenced(m)) => {
                            mark_lost(&lost, format!("image {pool}/{image}: {m}"));
                            return;
                        }
                        // The monitor unreachable: keep trying. The lease may run out
                        // meanwhile; then a new holder fences us and the daemons say so.
                        Err(e) => tracing::warn!("image {pool}/{image}: lock renewal: {e}"),
                    }
                }
            })
        };
        Ok(ImageLock {
            client,
            pool: pool.to_string(),
            image: image.to_string(),
            lost,
            generation: grant.generation,
            _renewer: renewer,
        })
    }

    /// The lock's generation when this holder took it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Ok while the lock is ours; [`ImageError::Fenced`] once it is not.
    pub fn check(&self) -> Result<(), ImageError> {
        match lost_reason(&self.lost) {
            None => Ok(()),
            Some(why) => Err(ImageError::Fenced(why)),
        }
    }

    /// Notes the result of an operation: a write refused as fenced means the lock is lost.
    pub fn observe<T>(&self, r: Result<T, ImageError>) -> Result<T, ImageError> {
        if let Err(ImageError::Backend(ClientError::Fenced(m))) = &r {
            mark_lost(
                &self.lost,
                format!(
                    "image {}/{}: the daemons refuse our writes: {m}",
                    self.pool, self.image
                ),
            );
        }
        r
    }

    /// Gives the lock back (a graceful stop). A lock already lost is left alone.
    pub async fn release(&self) {
        self._renewer.abort();
        if self.check().is_ok() {
            if let Err(e) = self.client.lock_release(&self.pool, &self.image).await {
                tracing::warn!(
                    "image {}/{}: releasing the lock: {e}",
                    self.pool,
                    self.image
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_of_this_host_are_gone_only_when_their_process_is() {
        let me = holder_description("test");
        assert!(!holder_is_gone(&me), "{me}");
        // The same pid with another start time: a reused pid, not the holder.
        let start = process_start(std::process::id()).unwrap();
        let reused = me.replace(&format!("start {start}"), &format!("start {}", start + 1));
        assert!(holder_is_gone(&reused), "{reused}");
        // A pid that does not exist (above the kernel's pid limit).
        let dead = format!("host {} pid 4294967 start 1 x", hostname());
        assert!(holder_is_gone(&dead));
        // A child that exited and is not reaped yet (a zombie) is gone too.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie_pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let zombie = format!("host {} pid {zombie_pid} start 1 x", hostname());
        assert!(
            process_start(zombie_pid).is_none(),
            "a zombie has no start time"
        );
        assert!(holder_is_gone(&zombie));
        child.wait().unwrap();
        // Another host, or a description without the fields: never taken as gone.
        assert!(!holder_is_gone("host elsewhere pid 4294967 start 1 x"));
        assert!(!holder_is_gone("someone"));
    }
}
