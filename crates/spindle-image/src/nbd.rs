//! The NBD adapter: images of a pool as NBD exports (`spindle_nbd::Exports`), each image
//! behind its block layer (`ImageDevice`), with NBD's errno mapping (a full cluster is
//! `ENOSPC`, other failures `EIO`), rate-limited logging of failed writes, and each
//! image's exclusive lock taken on open (`crate::lock`).

use crate::image::ObjectBackend;
use crate::lock::{holder_description, ImageLock, LockOptions};
use crate::qos::{stats_object_name, ImageIoReport, IoKind, IoStats, IoTotals, Qos};
use crate::wlog::{WriteLog, WriteLogConfig};
use crate::{BlockConfig, BlockLayer, Image, ImageError};
use bytes::Bytes;
use spindle_client::{Client, ClientError};
use spindle_nbd::{BlockDevice, DeviceError, ExportInfo, Exports};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Maps an image error to the NBD errno family. `out_of_range` is what a range error
/// becomes (EINVAL for reads, ENOSPC for writes past the end, as the NBD spec asks).
fn device_error(e: ImageError, out_of_range: fn(String) -> DeviceError) -> DeviceError {
    match e {
        e @ ImageError::OutOfRange { .. } => out_of_range(e.to_string()),
        e @ ImageError::ReadOnly(_) => DeviceError::NotPermitted(e.to_string()),
        // The cluster is full: the NBD client sees ENOSPC (not EIO), as from a full disk.
        ImageError::Backend(ClientError::NoSpace(m)) => DeviceError::NoSpace(m),
        e => DeviceError::Io(format!("{e:#}")),
    }
}

/// Failed writes are logged once per burst: the first failure with its cause, then (at
/// the first failure after `WRITE_ERROR_LOG_INTERVAL`, or the first success) how many
/// more failed meanwhile. A full cluster fails every write; one line per request would
/// flood the log.
#[derive(Default)]
struct WriteErrorLog {
    in_burst: std::sync::atomic::AtomicBool,
    state: std::sync::Mutex<WriteErrorBurst>,
}

#[derive(Default)]
struct WriteErrorBurst {
    started: Option<std::time::Instant>,
    suppressed: u64,
    last: String,
}

const WRITE_ERROR_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl WriteErrorLog {
    fn failed(&self, image: &str, what: &str, e: &DeviceError) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let cause = e.to_string();
        match st.started {
            Some(t) if t.elapsed() < WRITE_ERROR_LOG_INTERVAL => {
                st.suppressed += 1;
                st.last = cause;
                return;
            }
            Some(t) if st.suppressed > 0 => tracing::warn!(
                "image {image}: {} more failed writes in the last {:.0} s (last: {})",
                st.suppressed,
                t.elapsed().as_secs_f64(),
                st.last
            ),
            _ => {}
        }
        tracing::warn!(
            "image {image}: {what} failed: {cause} (errno {})",
            e.errno()
        );
        st.started = Some(std::time::Instant::now());
        st.suppressed = 0;
        st.last = cause;
        self.in_burst
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn succeeded(&self, image: &str) {
        if !self.in_burst.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.in_burst
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if st.started.take().is_some() {
            tracing::info!(
                "image {image}: writes succeed again ({} more had failed after the logged one)",
                st.suppressed
            );
        }
        st.suppressed = 0;
    }

    fn observe<T>(
        &self,
        image: &str,
        what: &str,
        r: Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        match &r {
            Ok(_) => self.succeeded(image),
            Err(e) => self.failed(image, what, e),
        }
        r
    }
}

/// One image exported over NBD: a thin adapter over the shared block layer.
pub struct ImageDevice {
    layer: Arc<BlockLayer<Client>>,
    /// Image name (for log lines).
    name: String,
    write_errors: WriteErrorLog,
    /// The image's exclusive lock, when the export holds one: once it is lost, every
    /// operation fails (no write reaches the daemons, no read is served from the cache).
    lock: Option<Arc<ImageLock>>,
    /// The client write log in front of the block layer, when one is configured.
    wlog: Option<Arc<WriteLog<Client>>>,
    /// The image's limits (`crate::qos`), from its header, refreshed by
    /// [`ImageExports::housekeeping_loop`].
    qos: Arc<Qos>,
    /// What its clients did (`spindle image stats`).
    stats: Arc<IoStats>,
}

impl ImageDevice {
    /// Wraps a block layer (`name`: the image, for log lines).
    pub fn new(layer: Arc<BlockLayer<Client>>, name: &str) -> Self {
        let qos = Arc::new(Qos::default());
        if layer.image().snapshot().is_none() {
            qos.set(&layer.image().info().qos);
        }
        ImageDevice {
            layer,
            name: name.to_string(),
            write_errors: WriteErrorLog::default(),
            lock: None,
            wlog: None,
            qos,
            stats: Arc::new(IoStats::default()),
        }
    }

    /// The image's limits in force.
    pub fn qos(&self) -> &Arc<Qos> {
        &self.qos
    }

    /// The image's I/O counters.
    pub fn io_stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    /// Counts an operation and waits for the image's limits to let it start.
    async fn admit(&self, kind: IoKind, bytes: u64) -> crate::qos::IoTimer<'_> {
        let timer = self.stats.begin(kind, bytes);
        self.qos.admit(kind, bytes).await;
        timer
    }

    /// The same, with writes acknowledged from `wlog` (persist and publish).
    pub fn with_write_log(mut self, wlog: Arc<WriteLog<Client>>) -> Self {
        self.wlog = Some(wlog);
        self
    }

    /// The write log, if any.
    pub fn write_log(&self) -> Option<&Arc<WriteLog<Client>>> {
        self.wlog.as_ref()
    }

    /// The same, serving only while `lock` is held.
    pub fn with_lock(mut self, lock: Arc<ImageLock>) -> Self {
        self.lock = Some(lock);
        self
    }

    /// The lock this device holds, if any.
    pub fn image_lock(&self) -> Option<&Arc<ImageLock>> {
        self.lock.as_ref()
    }

    /// Fails once the lock is lost.
    fn check_lock(&self) -> Result<(), DeviceError> {
        match &self.lock {
            Some(l) => l.check().map_err(|e| DeviceError::Io(e.to_string())),
            None => Ok(()),
        }
    }

    /// Notes a fenced write in the lock.
    fn observe<T>(&self, r: Result<T, ImageError>) -> Result<T, ImageError> {
        match &self.lock {
            Some(l) => l.observe(r),
            None => r,
        }
    }

    /// A failed read as the NBD error, logged (EIO on a read is what the NBD client
    /// sees; without the cause here, nothing says why).
    fn read_failed(&self, offset: u64, len: u32, e: ImageError) -> DeviceError {
        let d = device_error(e, DeviceError::Invalid);
        tracing::warn!(
            "image {}: read {offset}+{len} failed: {d} (errno {})",
            self.name,
            d.errno()
        );
        d
    }

    /// The block layer (for statistics).
    pub fn layer(&self) -> &Arc<BlockLayer<Client>> {
        &self.layer
    }
}

impl BlockDevice for ImageDevice {
    fn size_bytes(&self) -> u64 {
        self.layer.size_bytes()
    }

    /// True: all connections share this device's block layer and completed writes are
    /// durable, so FLUSH on one connection covers writes completed on the others.
    fn multi_conn_consistent(&self) -> bool {
        true
    }

    /// A snapshot (`IMAGE@SNAP`) is exported read-only.
    fn read_only(&self) -> bool {
        self.layer.image().snapshot().is_some()
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, DeviceError> {
        self.check_lock()?;
        let _io = self.admit(IoKind::Read, u64::from(len)).await;
        if let Some(w) = &self.wlog {
            let pieces = w
                .read_pieces(offset, u64::from(len))
                .await
                .map_err(|e| device_error(e, DeviceError::Invalid))?;
            let mut out = Vec::with_capacity(len as usize);
            for p in &pieces {
                out.extend_from_slice(p);
            }
            return Ok(out);
        }
        self.layer
            .read(offset, u64::from(len))
            .await
            .map_err(|e| self.read_failed(offset, len, e))
    }

    async fn read_pieces(&self, offset: u64, len: u32) -> Result<Vec<Bytes>, DeviceError> {
        self.check_lock()?;
        let _io = self.admit(IoKind::Read, u64::from(len)).await;
        if let Some(w) = &self.wlog {
            return w
                .read_pieces(offset, u64::from(len))
                .await
                .map_err(|e| device_error(e, DeviceError::Invalid));
        }
        self.layer
            .read_pieces(offset, u64::from(len))
            .await
            .map_err(|e| self.read_failed(offset, len, e))
    }

    /// Without a write log, `fua` needs no extra work: a write completes only once durable
    /// on all up replicas. With one, a write completes once durable in the log, and `fua`
    /// waits until it is published.
    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), DeviceError> {
        self.check_lock()?;
        let _io = self.admit(IoKind::Write, data.len() as u64).await;
        let r = match &self.wlog {
            Some(w) => {
                // Range checks first: the log must not accept what the image refuses.
                let size = self.layer.size_bytes();
                if offset
                    .checked_add(data.len() as u64)
                    .is_none_or(|end| end > size)
                {
                    return Err(DeviceError::NoSpace(format!(
                        "write {offset}+{} is outside the image (size {size} bytes)",
                        data.len()
                    )));
                }
                w.write(offset, data, fua).await
            }
            None => self.layer.write_owned(offset, data).await,
        };
        let r = self
            .observe(r)
            .map_err(|e| device_error(e, DeviceError::NoSpace));
        self.write_errors.observe(&self.name, "write", r)
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        self.check_lock()?;
        let r = match &self.wlog {
            Some(w) => w.flush().await,
            None => self.layer.flush().await,
        };
        self.observe(r)
            .map_err(|e| device_error(e, DeviceError::Invalid))
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), DeviceError> {
        self.check_lock()?;
        let _io = self.admit(IoKind::Other, u64::from(len)).await;
        let r = match &self.wlog {
            Some(w) => w.write_zeroes(offset, u64::from(len)).await,
            None => self.layer.discard(offset, u64::from(len)).await,
        };
        let r = self
            .observe(r)
            .map_err(|e| device_error(e, DeviceError::NoSpace));
        self.write_errors.observe(&self.name, "trim", r)
    }

    /// `may_trim` is ignored: the block layer zeroes (and may deallocate whole objects)
    /// either way, and reads of the range return zeros in both cases.
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _may_trim: bool,
        _fua: bool,
    ) -> Result<(), DeviceError> {
        self.check_lock()?;
        let _io = self.admit(IoKind::Other, u64::from(len)).await;
        let r = match &self.wlog {
            Some(w) => w.write_zeroes(offset, u64::from(len)).await,
            None => self.layer.write_zeroes(offset, u64::from(len)).await,
        };
        let r = self
            .observe(r)
            .map_err(|e| device_error(e, DeviceError::NoSpace));
        self.write_errors.observe(&self.name, "write zeroes", r)
    }
}

/// Every image of one pool, each as an export named after the image. Devices are opened
/// on first use and shared by every later connection.
pub struct ImageExports {
    client: Arc<Client>,
    pool: String,
    config: BlockConfig,
    /// How each image's exclusive lock is taken on open (None: no lock, for read-only
    /// uses), and who we are as its holder.
    locking: Option<(LockOptions, String)>,
    /// Where each image's client write log lives, if writes go through one.
    write_log: Option<WriteLogConfig>,
    /// Image name -> its device (opened once; held across the open so concurrent first
    /// connections cannot create two block layers for one image).
    open: Mutex<HashMap<String, Arc<ImageDevice>>>,
}

impl ImageExports {
    /// Exports the images of `pool`, each behind a block layer configured by `config`.
    pub fn new(client: Arc<Client>, pool: impl Into<String>, config: BlockConfig) -> Self {
        ImageExports {
            client,
            pool: pool.into(),
            config,
            locking: Some((LockOptions::default(), holder_description("spindle nbd"))),
            write_log: None,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Acknowledges writes from a client write log per image (`spindle nbd --write-log`).
    /// Needs the image lock (a log is one writer's).
    pub fn with_write_log(mut self, config: Option<WriteLogConfig>) -> Self {
        self.write_log = config.map(|mut c| {
            // An offload agent's writes carry this client's id (fencing covers them).
            c.client_id = self.client.client_id();
            c.cluster_id = self.client.map().cluster_id;
            c
        });
        let holder = self.holder();
        if let Some((_, h)) = &mut self.locking {
            *h = holder;
        }
        self
    }

    /// Takes each image's lock with `options` (e.g. `take_over` for `--break-lock`); None
    /// opens images without a lock.
    pub fn with_locking(mut self, options: Option<LockOptions>) -> Self {
        self.locking = options.map(|o| (o, self.holder()));
        self
    }

    /// This server as a lock holder (marked when it acknowledges from a write log).
    fn holder(&self) -> String {
        if self.write_log.is_some() {
            holder_description(&format!(
                "spindle nbd {}",
                crate::lock::WRITE_LOG_HOLDER_MARK
            ))
        } else {
            holder_description("spindle nbd")
        }
    }

    /// Releases the lock of every opened image (a graceful stop, after `flush_all`).
    pub async fn release_locks(&self) {
        for (_, dev) in self.opened().await {
            if let Some(lock) = dev.image_lock() {
                lock.release().await;
            }
        }
    }

    /// The devices opened so far (name, device), sorted by name.
    pub async fn opened(&self) -> Vec<(String, Arc<ImageDevice>)> {
        let mut v: Vec<_> = self
            .open
            .lock()
            .await
            .iter()
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Every second, for every served image (not snapshots): applies the limits its header
    /// holds now, and publishes its I/O rates in `img.NAME.stats` (while it is busy, and
    /// once more when it goes idle) for `spindle image stats`.
    pub async fn housekeeping_loop(self: Arc<Self>) {
        let mut last: HashMap<String, (std::time::Instant, IoTotals, bool)> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let served_by = self
            .locking
            .as_ref()
            .map_or_else(|| holder_description("spindle nbd"), |(_, h)| h.clone());
        loop {
            tick.tick().await;
            for (name, dev) in self.opened().await {
                if name.contains('@') {
                    continue;
                }
                let image = dev.layer().image();
                match image.read_qos().await {
                    Ok(spec) => dev.qos().set(&spec),
                    Err(e) => tracing::debug!("image {name}: reading its limits: {e}"),
                }
                let now = std::time::Instant::now();
                let totals = dev.io_stats().totals();
                let (at, before, was_busy) =
                    last.get(&name)
                        .cloned()
                        .unwrap_or((now, IoTotals::default(), true));
                let busy = totals != before;
                if busy || was_busy {
                    let interval = now.duration_since(at).max(Duration::from_millis(1));
                    let (throttled_ops, throttled_ns) = dev.qos().throttled();
                    let report = ImageIoReport {
                        image: name.clone(),
                        pool: self.pool.clone(),
                        served_by: served_by.clone(),
                        unix_ms: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64),
                        interval_ms: interval.as_millis() as u64,
                        rates: totals.rates_since(&before, interval),
                        totals,
                        qos: dev.qos().spec(),
                        throttled_ops,
                        throttled_ms: throttled_ns / 1_000_000,
                    };
                    let body = serde_json::to_vec(&report).unwrap_or_default();
                    if let Err(e) = self
                        .client
                        .write_full_object(&self.pool, &stats_object_name(&name), body)
                        .await
                    {
                        tracing::debug!("image {name}: publishing its statistics: {e}");
                    }
                }
                last.insert(name, (now, totals, busy));
            }
        }
    }

    /// Flushes every opened device; returns the first error.
    pub async fn flush_all(&self) -> Result<(), DeviceError> {
        let mut first = Ok(());
        for (_, dev) in self.opened().await {
            if let Err(e) = dev.flush().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Exports for ImageExports {
    type Device = ImageDevice;

    async fn list(&self) -> Result<Vec<ExportInfo>, DeviceError> {
        let images = Image::list(&*self.client, &self.pool)
            .await
            .map_err(|e| DeviceError::Io(format!("{e:#}")))?;
        Ok(images
            .into_iter()
            .map(|i| ExportInfo {
                description: format!(
                    "spindle image {}/{} ({} objects of {} KiB)",
                    i.pool,
                    i.name,
                    i.object_count,
                    i.object_size_bytes / 1024
                ),
                name: i.name,
                size_bytes: i.size_bytes,
            })
            .collect())
    }

    /// Opens `name`; "" (the default export) is the pool's only image, if it has exactly one.
    async fn open(&self, name: &str) -> Result<Arc<ImageDevice>, DeviceError> {
        let name = if name.is_empty() {
            let images = Image::list(&*self.client, &self.pool)
                .await
                .map_err(|e| DeviceError::Io(format!("{e:#}")))?;
            match images.as_slice() {
                [only] => only.name.clone(),
                _ => {
                    return Err(DeviceError::Invalid(format!(
                        "no default export: pool {} has {} images; name one",
                        self.pool,
                        images.len()
                    )))
                }
            }
        } else {
            name.to_string()
        };
        let mut open = self.open.lock().await;
        if let Some(dev) = open.get(&name) {
            return Ok(dev.clone());
        }
        let open_error = |e: ImageError| match e {
            ImageError::NotFound(_) | ImageError::InvalidName(_) | ImageError::Snapshot(_) => {
                DeviceError::Invalid(e.to_string())
            }
            ImageError::Locked(_) => DeviceError::NotPermitted(e.to_string()),
            e => DeviceError::Io(format!("{e:#}")),
        };
        // `IMAGE@SNAP`: the snapshot, read-only, without the image's lock (the writer may
        // keep writing the image meanwhile) and without a write log.
        if let Some((image, snap)) = name.split_once('@') {
            let at = Image::open_snap(self.client.clone(), &self.pool, image, snap)
                .await
                .map_err(open_error)?;
            let layer = Arc::new(
                BlockLayer::new(Arc::new(at), self.config.clone())
                    .map_err(|e| DeviceError::Io(e.to_string()))?,
            );
            let dev = Arc::new(ImageDevice::new(layer, &name));
            open.insert(name, dev.clone());
            return Ok(dev);
        }
        let image = Image::open(self.client.clone(), &self.pool, &name)
            .await
            .map_err(open_error)?;
        // Who holds the lock now (before this opener takes it): a write log left by that
        // holder may be replayed, one left by an earlier holder may not.
        let previous_lock_client = {
            let map = self.client.map();
            map.pool_by_name(&self.pool)
                .map(|p| map.image_locks.get(&(p.id, name.clone())).map(|l| l.client))
        };
        // The lock before the block layer: nothing is cached or written without it.
        let lock = match &self.locking {
            Some((options, holder)) => Some(Arc::new(
                ImageLock::acquire(self.client.clone(), &self.pool, &name, holder, options)
                    .await
                    .map_err(|e| {
                        tracing::warn!("export {name}: {e}");
                        open_error(e)
                    })?,
            )),
            None => None,
        };
        if lock.is_some() {
            // The lock holder is the only writer: a clone may remember what it lacks.
            image.set_sole_writer();
        }
        let layer = Arc::new(
            BlockLayer::new(Arc::new(image), self.config.clone())
                .map_err(|e| DeviceError::Io(e.to_string()))?,
        );
        let mut dev = ImageDevice::new(layer.clone(), &name);
        if let Some(config) = &self.write_log {
            if lock.is_none() {
                return Err(DeviceError::Io(
                    "a write log needs the image lock (one writer per log)".into(),
                ));
            }
            // Replays what a crash left in the log before anything is served.
            let mut config = config.clone();
            config.previous_lock_client = previous_lock_client;
            let (wlog, report) = WriteLog::open(&config, &self.pool, &name, layer)
                .await
                .map_err(|e| {
                    tracing::error!("export {name}: {e}");
                    open_error(e)
                })?;
            if report.records_applied > 0 || report.stopped.is_some() {
                tracing::warn!(
                    "export {name}: write log replay: {} records ({} bytes) applied{}",
                    report.records_applied,
                    report.bytes_applied,
                    report
                        .stopped
                        .as_deref()
                        .map(|s| format!("; {s}"))
                        .unwrap_or_default()
                );
            }
            dev = dev.with_write_log(Arc::new(wlog));
        }
        if let Some(lock) = lock {
            dev = dev.with_lock(lock);
        }
        let dev = Arc::new(dev);
        open.insert(name, dev.clone());
        Ok(dev)
    }
}
