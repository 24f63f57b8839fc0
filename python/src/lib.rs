//! `spindle._native`: the Rust client (`spindle-client`) for Python, built with PyO3.
//!
//! Every call that waits on the network releases the GIL. Each blocking method has a
//! callback twin (`*_cb`) that starts the operation on the client's own runtime and calls
//! `callback(error, value)` from a runtime thread when it ends: the Python package turns
//! that into an `asyncio` future (`loop.call_soon_threadsafe`), so coroutines wait without
//! a thread per call, and many operations are in flight at once through one client.
//!
//! Errors: the Python package registers its exception classes (`_register_errors`) and
//! every `ClientError` becomes the matching one (`NotFound`, `Timeout`, ...).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use spindle_client::{ClientError, ExecOptions, ProgramCode};
use spindle_image::lock::{holder_description, ImageLock, LockOptions};
use spindle_image::{ImageError, ImageInfo};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The runtime every client of this process runs on (two worker threads: the calls are
/// I/O, not computation).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spindle-py")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| PyRuntimeError::new_err(format!("cannot start the client runtime: {e}")))
}

/// The Python exception classes by name (`spindle/errors.py`), registered at import.
static ERRORS: OnceLock<Py<PyDict>> = OnceLock::new();

#[pyfunction]
fn _register_errors(classes: Bound<'_, PyDict>) -> PyResult<()> {
    ERRORS
        .set(classes.unbind())
        .map_err(|_| PyRuntimeError::new_err("errors are registered already"))
}

/// Why a call failed, before it becomes a Python exception (made with the GIL held).
#[derive(Debug)]
enum Failure {
    Client(ClientError),
    Image(ImageError),
    Closed,
    Setup(String),
    ReadOnly(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        Failure::Client(e)
    }
}

impl From<ImageError> for Failure {
    fn from(e: ImageError) -> Failure {
        match e {
            ImageError::Backend(c) => Failure::Client(c),
            e => Failure::Image(e),
        }
    }
}

impl Failure {
    fn class(&self) -> &'static str {
        match self {
            Failure::Closed => "ClientClosed",
            Failure::Setup(_) => "ConnectionFailed",
            Failure::ReadOnly(_) => "ReadOnly",
            Failure::Image(e) => match e {
                ImageError::NotFound(_) | ImageError::NoSnapshot(_) => "NotFound",
                ImageError::Exists(_) => "AlreadyExists",
                ImageError::OutOfRange { .. }
                | ImageError::InvalidName(_)
                | ImageError::InvalidSize(_)
                | ImageError::InvalidObjectSize(_)
                | ImageError::InvalidConfig(_)
                | ImageError::InvalidSetting(_) => "InvalidArgument",
                ImageError::CorruptHeader { .. } => "Corrupt",
                ImageError::Locked(_) => "Locked",
                ImageError::Fenced(_) => "Fenced",
                ImageError::ReadOnly(_) => "ReadOnly",
                _ => "SpindleError",
            },
            Failure::Client(e) => match e {
                ClientError::NotFound(_) | ClientError::NoSuchPool(_) => "NotFound",
                ClientError::Invalid(_) => "InvalidArgument",
                ClientError::Corrupt(_) => "Corrupt",
                ClientError::Timeout { .. } => "Timeout",
                ClientError::Monitor { .. } => "ConnectionFailed",
                ClientError::NoSpace(_) => "NoSpace",
                ClientError::Auth(_) | ClientError::Denied(_) => "PermissionDenied",
                ClientError::Program(_) => "ProgramFailed",
                ClientError::Fenced(_) => "Fenced",
                ClientError::Conflict(_) | ClientError::SnapChanged(_) => "Conflict",
                _ => "SpindleError",
            },
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Closed => "the client is closed".into(),
            Failure::Setup(m) | Failure::ReadOnly(m) => m.clone(),
            Failure::Image(e) => e.to_string(),
            Failure::Client(e) => e.to_string(),
        }
    }

    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let class = ERRORS
            .get()
            .and_then(|d| d.bind(py).get_item(self.class()).ok().flatten());
        match class {
            Some(c) => match c.call1((self.message(),)) {
                Ok(instance) => PyErr::from_value(instance),
                Err(e) => e,
            },
            None => PyRuntimeError::new_err(self.message()),
        }
    }
}

/// One program run's return value and output.
type Run = (u64, Vec<u8>);

/// What an operation gives back, turned into a Python value with the GIL held.
enum Value {
    None,
    Bytes(Vec<u8>),
    Stat {
        size_bytes: u64,
        version: String,
    },
    /// Bytes handed to Python without a copy (a `Blob`).
    Blob(Vec<u8>),
    Listing(Vec<(String, u64)>),
    Exec {
        ret: u64,
        output: Vec<u8>,
        /// A shard-local run's parts: (return value, output) per data shard.
        parts: Vec<(u64, Vec<u8>)>,
    },
    Image(Arc<OpenImage>),
    Images(Vec<ImageInfo>),
    /// A batch of runs: each `(ret, output)`, or None where the object does not exist.
    Runs(Vec<Option<Run>>),
}

/// An image's description as a dict (the fields of `spindle image info --json`).
fn info_dict<'py>(py: Python<'py>, i: &ImageInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &i.name)?;
    d.set_item("pool", &i.pool)?;
    d.set_item("size", i.size_bytes)?;
    d.set_item("object_size", i.object_size_bytes)?;
    d.set_item("object_count", i.object_count)?;
    d.set_item("created_unix_secs", i.created_unix_secs)?;
    d.set_item("parent", i.parent.clone())?;
    Ok(d)
}

impl Value {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Value::None => py.None(),
            Value::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
            Value::Blob(data) => Py::new(py, Blob { data })?.into_any(),
            Value::Stat {
                size_bytes,
                version,
            } => {
                let d = PyDict::new(py);
                d.set_item("size", size_bytes)?;
                d.set_item("version", version)?;
                d.into_any().unbind()
            }
            Value::Listing(items) => items.into_pyobject(py)?.into_any().unbind(),
            Value::Exec { ret, output, parts } => {
                let d = PyDict::new(py);
                d.set_item("ret", ret)?;
                d.set_item("output", PyBytes::new(py, &output))?;
                let list = pyo3::types::PyList::empty(py);
                for (r, out) in parts {
                    list.append((r, PyBytes::new(py, &out)))?;
                }
                d.set_item("parts", list)?;
                d.into_any().unbind()
            }
            Value::Image(open) => Py::new(
                py,
                Image {
                    inner: Mutex::new(Some(open)),
                },
            )?
            .into_any(),
            Value::Runs(runs) => {
                let list = pyo3::types::PyList::empty(py);
                for r in runs {
                    match r {
                        None => list.append(py.None())?,
                        Some((ret, output)) => list.append((ret, PyBytes::new(py, &output)))?,
                    }
                }
                list.into_any().unbind()
            }
            Value::Images(infos) => {
                let list = pyo3::types::PyList::empty(py);
                for i in &infos {
                    list.append(info_dict(py, i)?)?;
                }
                list.into_any().unbind()
            }
        })
    }
}

type Op = std::pin::Pin<Box<dyn Future<Output = Result<Value, Failure>> + Send>>;

/// Runs `op` to its end with the GIL released.
fn block(py: Python<'_>, op: Op) -> PyResult<Py<PyAny>> {
    let rt = runtime()?;
    match py.detach(|| rt.block_on(op)) {
        Ok(v) => v.into_py(py),
        Err(f) => Err(f.into_pyerr(py)),
    }
}

/// Callbacks running (or about to) on runtime threads.
static CALLBACKS_ACTIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Set at interpreter exit: no callback enters Python any more.
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called at interpreter exit (`atexit`, registered by the package): stops runtime threads
/// from entering Python and waits (up to a second, the GIL released) for callbacks that
/// already did. Without it a runtime thread could still be giving the GIL back after a
/// callback while the interpreter finalizes, which aborts the process.
#[pyfunction]
fn _at_exit(py: Python<'_>) {
    use std::sync::atomic::Ordering::SeqCst;
    EXITING.store(true, SeqCst);
    py.detach(|| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while CALLBACKS_ACTIVE.load(SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
}

/// Where the operations started from one asyncio event loop end: a runtime thread
/// queues each end here, without Python, and wakes the loop through a socket (one byte
/// when the queue stops being empty); the loop takes every end queued so far in one call
/// (`take`), which makes the Python objects. No runtime thread waits for the GIL while the
/// loop runs Python code, and a burst of ends costs the loop one wake-up. `spindle/__init__.py`
/// keeps one queue per event loop.
#[pyclass(module = "spindle._native", frozen)]
struct CompletionQueue {
    inner: Arc<QueueInner>,
}

struct QueueInner {
    ended: Mutex<Vec<(u64, Result<Value, Failure>)>>,
    wake_tx: std::os::unix::net::UnixStream,
    wake_rx: std::os::unix::net::UnixStream,
}

impl QueueInner {
    fn push(&self, token: u64, r: Result<Value, Failure>) {
        let was_empty = {
            let mut ended = match self.ended.lock() {
                Ok(e) => e,
                Err(poisoned) => poisoned.into_inner(),
            };
            ended.push((token, r));
            ended.len() == 1
        };
        if was_empty {
            // Non-blocking: a full socket already holds a wake-up the loop has not read.
            let _ = std::io::Write::write(&mut &self.wake_tx, &[1]);
        }
    }
}

#[pymethods]
impl CompletionQueue {
    #[new]
    fn new() -> PyResult<CompletionQueue> {
        let (wake_tx, wake_rx) = std::os::unix::net::UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(CompletionQueue {
            inner: Arc::new(QueueInner {
                ended: Mutex::new(Vec::new()),
                wake_tx,
                wake_rx,
            }),
        })
    }

    /// The descriptor that becomes readable when ends are queued (for `loop.add_reader`).
    fn fileno(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.inner.wake_rx.as_raw_fd()
    }

    /// The target to pass as the callback of a `*_cb` call: its end is queued here under
    /// `token`.
    fn target(&self, token: u64) -> Completion {
        Completion {
            queue: self.inner.clone(),
            token,
        }
    }

    /// Every end queued so far, as `(token, error, value)`, oldest first.
    fn take(&self, py: Python<'_>) -> PyResult<Vec<Ended>> {
        // The wake-ups first: an end queued after this read and before the queue is
        // emptied below is taken now, and its wake-up only costs an empty call.
        let mut sink = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut &self.inner.wake_rx, &mut sink) {
            if n < sink.len() {
                break;
            }
        }
        let ended = {
            let mut e = match self.inner.ended.lock() {
                Ok(e) => e,
                Err(poisoned) => poisoned.into_inner(),
            };
            std::mem::take(&mut *e)
        };
        let mut out = Vec::with_capacity(ended.len());
        for (token, r) in ended {
            let (err, val) = match r.map(|v| v.into_py(py)) {
                Ok(Ok(v)) => (py.None(), v),
                Ok(Err(e)) => (e.into_value(py).into_any(), py.None()),
                Err(f) => (f.into_pyerr(py).into_value(py).into_any(), py.None()),
            };
            out.push((token, err, val));
        }
        Ok(out)
    }
}

/// An operation's end as `take` gives it: (token, error or None, value or None).
type Ended = (u64, Py<PyAny>, Py<PyAny>);

/// One operation's place in a `CompletionQueue` (from `CompletionQueue.target`), given to
/// a `*_cb` call instead of a callable.
#[pyclass(module = "spindle._native", frozen)]
struct Completion {
    queue: Arc<QueueInner>,
    token: u64,
}

/// Starts `op` on the runtime; its end goes to `callback`: a `Completion` (queued, see
/// `CompletionQueue`) or a callable, called `callback(error, value)` from a runtime
/// thread.
fn start(op: Op, callback: Py<PyAny>) -> PyResult<()> {
    use std::sync::atomic::Ordering::SeqCst;
    let rt = runtime()?;
    let queued = Python::attach(|py| {
        callback
            .bind(py)
            .cast::<Completion>()
            .ok()
            .map(|c| (c.get().queue.clone(), c.get().token))
    });
    if let Some((queue, token)) = queued {
        rt.spawn(async move { queue.push(token, op.await) });
        return Ok(());
    }
    rt.spawn(async move {
        let r = op.await;
        // Counted before the check, so `_at_exit` either sees this callback or this
        // callback sees the flag.
        CALLBACKS_ACTIVE.fetch_add(1, SeqCst);
        if EXITING.load(SeqCst) {
            CALLBACKS_ACTIVE.fetch_sub(1, SeqCst);
            // Nobody waits any more; the callback is let go without touching Python.
            std::mem::forget(callback);
            return;
        }
        Python::attach(|py| {
            let (err, val) = match r.map(|v| v.into_py(py)) {
                Ok(Ok(v)) => (py.None(), v),
                Ok(Err(e)) => (e.into_value(py).into_any(), py.None()),
                Err(f) => (f.into_pyerr(py).into_value(py).into_any(), py.None()),
            };
            if let Err(e) = callback.call1(py, (err, val)) {
                e.print(py);
            }
            drop(callback);
        });
        CALLBACKS_ACTIVE.fetch_sub(1, SeqCst);
    });
    Ok(())
}

/// The items of one run of a batch (their indices), each with its run or None.
type GroupRuns = Vec<(usize, Option<Run>)>;

/// The runs of a batch whose items may share a run: the indices of the items, grouped by
/// placement group (`pg_of`) and arguments, in the items' order, at most
/// `EXEC_OBJECTS_MAX` per run.
fn batch_groups(items: &[(String, Vec<u8>)], pg_of: impl Fn(&str) -> u32) -> Vec<Vec<usize>> {
    let max = spindle_types::limits::EXEC_OBJECTS_MAX;
    let mut open: std::collections::HashMap<(u32, &[u8]), usize> = Default::default();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, (name, args)) in items.iter().enumerate() {
        let key = (pg_of(name), args.as_slice());
        match open.get(&key) {
            Some(&g) if groups[g].len() < max => groups[g].push(i),
            _ => {
                open.insert(key, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// One run of a batch: the items `group` of `items` (one, or several of one placement
/// group with the same arguments when `per_object` output bytes are given), each with its
/// run, or None where its object does not exist.
async fn exec_group(
    c: &spindle_client::Client,
    pool: &str,
    items: &[(String, Vec<u8>)],
    group: &[usize],
    code: &ProgramCode,
    options: ExecOptions,
    per_object: Option<usize>,
) -> Result<GroupRuns, Failure> {
    let Some(&first) = group.first() else {
        return Ok(Vec::new());
    };
    let args = &items[first].1;
    if group.len() > 1 {
        let names: Vec<&str> = group.iter().map(|&i| items[i].0.as_str()).collect();
        match c.exec(pool, &names, code, args, options).await {
            Ok(r) => {
                let each = per_object.unwrap_or(0);
                if r.output.len() != each * group.len() {
                    return Err(ClientError::Program(format!(
                        "a run of {} objects emitted {} bytes, not {each} per object",
                        group.len(),
                        r.output.len()
                    ))
                    .into());
                }
                return Ok(group
                    .iter()
                    .zip(r.output.chunks_exact(each.max(1)))
                    .map(|(&i, out)| (i, Some((r.ret, out.to_vec()))))
                    .collect());
            }
            // Some object of the group is missing: run them one by one.
            Err(ClientError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut runs = Vec::with_capacity(group.len());
    for &i in group {
        let run = match c
            .exec(pool, &[items[i].0.as_str()], code, &items[i].1, options)
            .await
        {
            Ok(r) => {
                if per_object.is_some_and(|each| each != r.output.len()) {
                    return Err(ClientError::Program(format!(
                        "a run of 1 object emitted {} bytes, not {}",
                        r.output.len(),
                        per_object.unwrap_or(0)
                    ))
                    .into());
                }
                Some((r.ret, r.output))
            }
            Err(ClientError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        runs.push((i, run));
    }
    Ok(runs)
}

/// Bytes read from the cluster, held as the client received them: no copy into a Python
/// `bytes`. NumPy views them in place (`numpy.asarray(blob)`: a read-only uint8 array that
/// keeps the blob alive, through `__array_interface__`); `bytes(blob)` copies them.
#[pyclass(module = "spindle._native", frozen)]
struct Blob {
    data: Vec<u8>,
}

#[pymethods]
impl Blob {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// NumPy's array interface (version 3): the bytes, read-only, in place.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.data.len(),))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.data.as_ptr() as usize, true))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<spindle Blob of {} bytes>", self.data.len())
    }
}

/// A connection to a cluster. Made by `Client.connect`; thread-safe; `close()` ends it.
#[pyclass(module = "spindle._native", frozen)]
struct Client {
    inner: Mutex<Option<Arc<spindle_client::Client>>>,
}

impl Client {
    fn client(&self) -> Result<Arc<spindle_client::Client>, Failure> {
        self.inner
            .lock()
            .map_err(|_| Failure::Closed)?
            .clone()
            .ok_or(Failure::Closed)
    }

    /// A read: the bytes as a `bytes` object, or with `blob` as a `Blob` (no copy).
    fn op_get(
        &self,
        pool: String,
        name: String,
        offset: u64,
        length: Option<u64>,
        blob: bool,
    ) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let len = length.unwrap_or(spindle_client::OBJECT_BYTES_MAX);
            let data = c.read(&pool, &name, offset, len).await?;
            Ok(if blob {
                Value::Blob(data)
            } else {
                Value::Bytes(data)
            })
        })
    }

    fn op_put(&self, pool: String, name: String, data: Vec<u8>, offset: Option<u64>) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            match offset {
                None => c.write_full(&pool, &name, data).await?,
                Some(o) => c.write(&pool, &name, o, data).await?,
            };
            Ok(Value::None)
        })
    }

    fn op_delete(&self, pool: String, name: String, missing_ok: bool) -> Op {
        let c = self.client();
        Box::pin(async move {
            match c?.delete(&pool, &name).await {
                Ok(()) => Ok(Value::None),
                Err(ClientError::NotFound(_)) if missing_ok => Ok(Value::None),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn op_stat(&self, pool: String, name: String) -> Op {
        let c = self.client();
        Box::pin(async move {
            let s = c?.stat(&pool, &name).await?;
            Ok(Value::Stat {
                size_bytes: s.size_bytes,
                version: format!("{:?}", s.version),
            })
        })
    }

    fn op_list(&self, pool: String, prefix: String) -> Op {
        let c = self.client();
        Box::pin(async move {
            let all = c?.list(&pool).await?;
            Ok(Value::Listing(
                all.into_iter()
                    .filter(|l| l.name.starts_with(&prefix))
                    .map(|l| (l.name, l.size_bytes))
                    .collect(),
            ))
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn op_exec(
        &self,
        pool: String,
        objects: Vec<String>,
        program: Vec<u8>,
        args: Vec<u8>,
        options: ExecOptions,
    ) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let code = ProgramCode::new(program);
            let names: Vec<&str> = objects.iter().map(|s| s.as_str()).collect();
            let r = c.exec(&pool, &names, &code, &args, options).await?;
            let parts = r
                .parts
                .iter()
                .map(|(ret, range)| (*ret, r.output[range.clone()].to_vec()))
                .collect();
            Ok(Value::Exec {
                ret: r.ret,
                output: r.output,
                parts,
            })
        })
    }
}

impl Client {
    /// Runs `program` once per `(object, args)` item, `in_flight` at a time, in order.
    /// A batch of runs (see `exec_batch_cb`). With `group_output_bytes` set, items of one
    /// placement group with the same arguments run together, up to
    /// `EXEC_OBJECTS_MAX` objects per run, and the program must emit that many bytes per
    /// object in the run's order; a group whose run finds an object missing is run item
    /// by item.
    fn op_exec_batch(
        &self,
        pool: String,
        items: Vec<(String, Vec<u8>)>,
        program: Vec<u8>,
        options: ExecOptions,
        in_flight: usize,
        group_output_bytes: Option<usize>,
    ) -> Op {
        use futures::StreamExt;
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let groups: Vec<Vec<usize>> = match group_output_bytes {
                None => (0..items.len()).map(|i| vec![i]).collect(),
                Some(_) => {
                    let map = c.map();
                    let pg_count = map
                        .pool_by_name(&pool)
                        .ok_or_else(|| ClientError::NoSuchPool(pool.clone()))?
                        .pg_count;
                    batch_groups(&items, |name| spindle_map::object_pg(name, pg_count))
                }
            };
            let code = Arc::new(ProgramCode::new(program));
            let pool: Arc<str> = pool.into();
            let items = Arc::new(items);
            // Each run owns what it uses (a stream of borrowing futures is not `Send`
            // for every lifetime, which the boxed operation needs).
            let done: Vec<Result<GroupRuns, Failure>> =
                futures::stream::iter(groups.into_iter().map(|group| {
                    let (c, code, pool, items) =
                        (c.clone(), code.clone(), pool.clone(), items.clone());
                    async move {
                        exec_group(
                            &c,
                            &pool,
                            &items,
                            &group,
                            &code,
                            options,
                            group_output_bytes,
                        )
                        .await
                    }
                }))
                .buffered(in_flight)
                .collect()
                .await;
            let mut runs: Vec<Option<Run>> = vec![None; items.len()];
            for group in done {
                for (i, run) in group? {
                    runs[i] = run;
                }
            }
            Ok(Value::Runs(runs))
        })
    }

    fn op_image_create(
        &self,
        pool: String,
        name: String,
        size_bytes: u64,
        object_size_bytes: Option<u64>,
    ) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let object_size_bytes = match object_size_bytes {
                Some(b) => b,
                None => spindle_image::image::default_object_size(&c.map(), &pool)
                    .ok_or_else(|| ClientError::NoSuchPool(pool.clone()))?,
            };
            let img = spindle_image::Image::create(c, &pool, &name, size_bytes, object_size_bytes)
                .await?;
            Ok(Value::Images(vec![img.info()]))
        })
    }

    fn op_image_open(
        &self,
        pool: String,
        name: String,
        read_only: bool,
        snapshot: Option<String>,
        take_over: bool,
    ) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            // Views without the lock: a snapshot, or the head read-only.
            if snapshot.is_some() || read_only {
                let (image, label) = match &snapshot {
                    Some(snap) => (
                        spindle_image::Image::open_snap(c, &pool, &name, snap).await?,
                        format!("{pool}/{name}@{snap}"),
                    ),
                    None => (
                        spindle_image::Image::open(c, &pool, &name).await?,
                        format!("{pool}/{name}"),
                    ),
                };
                return Ok(Value::Image(Arc::new(OpenImage {
                    image,
                    lock: Mutex::new(None),
                    label,
                })));
            }
            let label = format!("{pool}/{name}");
            // `ImageLock::acquire` refuses a lock held by a writer with a client write
            // log (its acknowledged writes may be only in that log).
            // The lock first: nothing is read for writing or written without it.
            let options = LockOptions {
                take_over,
                ..LockOptions::default()
            };
            let lock = ImageLock::acquire(
                c.clone(),
                &pool,
                &name,
                &holder_description("python"),
                &options,
            )
            .await?;
            let image = match spindle_image::Image::open(c, &pool, &name).await {
                Ok(i) => i,
                Err(e) => {
                    lock.release().await;
                    return Err(e.into());
                }
            };
            image.set_sole_writer();
            Ok(Value::Image(Arc::new(OpenImage {
                image,
                lock: Mutex::new(Some(lock)),
                label,
            })))
        })
    }

    fn op_image_list(&self, pool: String) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            Ok(Value::Images(spindle_image::Image::list(&*c, &pool).await?))
        })
    }

    fn op_image_remove(&self, pool: String, name: String) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            spindle_image::admin::remove(&c, &pool, &name, "python (image_remove)", |_, _| {})
                .await?;
            Ok(Value::None)
        })
    }
}

/// Most runs of one batch in flight at once (each holds a request and its reply).
const EXEC_BATCH_IN_FLIGHT_MAX: usize = 1024;

/// Largest single image read or write from Python (the buffer is built in memory).
const IMAGE_IO_BYTES_MAX: u64 = 1 << 30;

fn check_io_len(len: u64) -> PyResult<()> {
    if len > IMAGE_IO_BYTES_MAX {
        return Err(PyValueError::new_err(format!(
            "{len} bytes in one call: at most {IMAGE_IO_BYTES_MAX} (split it)"
        )));
    }
    Ok(())
}

/// An open image: its handle and, when open for writing, its exclusive lock.
struct OpenImage {
    image: spindle_image::Image<spindle_client::Client>,
    /// None when read-only, and once closed.
    lock: Mutex<Option<ImageLock>>,
    /// `POOL/NAME` or `POOL/NAME@SNAP`, for messages.
    label: String,
}

impl OpenImage {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ImageLock>> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// May this handle write now? (Open for writing and still holding its lock.)
    fn writer(&self) -> Result<(), Failure> {
        match self.lock().as_ref() {
            Some(l) => l.check().map_err(Failure::from),
            None => Err(Failure::ReadOnly(format!(
                "{} is open read-only (a snapshot, or read_only=True)",
                self.label
            ))),
        }
    }

    /// A write's result, noting a fencing refusal on the lock (later writes fail at once).
    fn observe<T>(&self, r: Result<T, ImageError>) -> Result<T, Failure> {
        match self.lock().as_ref() {
            Some(l) => l.observe(r).map_err(Failure::from),
            None => r.map_err(Failure::from),
        }
    }
}

impl Drop for OpenImage {
    /// An image dropped without `close()` still gives its lock back (in the background).
    fn drop(&mut self) {
        let lock = self.lock.get_mut().ok().and_then(|l| l.take());
        if let (Some(lock), Ok(rt)) = (lock, runtime()) {
            rt.spawn(async move { lock.release().await });
        }
    }
}

/// An image open for reading and writing (holding its exclusive lock), read-only, or at
/// a snapshot. Made by `Client.image_open`; thread-safe; `close()` flushes and unlocks.
#[pyclass(module = "spindle._native", frozen)]
struct Image {
    inner: Mutex<Option<Arc<OpenImage>>>,
}

impl Image {
    fn open(&self) -> Result<Arc<OpenImage>, Failure> {
        self.inner
            .lock()
            .map_err(|_| Failure::Closed)?
            .clone()
            .ok_or(Failure::Closed)
    }

    fn op_read(&self, offset: u64, length: u64) -> Op {
        let o = self.open();
        Box::pin(async move { Ok(Value::Bytes(o?.image.read(offset, length).await?)) })
    }

    fn op_write(&self, offset: u64, data: Vec<u8>) -> Op {
        let o = self.open();
        Box::pin(async move {
            let o = o?;
            o.writer()?;
            let r = o.image.write_owned(offset, data).await;
            o.observe(r)?;
            Ok(Value::None)
        })
    }

    fn op_discard(&self, offset: u64, length: u64) -> Op {
        let o = self.open();
        Box::pin(async move {
            let o = o?;
            o.writer()?;
            let r = o.image.discard(offset, length).await;
            o.observe(r)?;
            Ok(Value::None)
        })
    }

    fn op_flush(&self) -> Op {
        let o = self.open();
        Box::pin(async move {
            let o = o?;
            o.image.flush().await?;
            // A flush answers for the writes before it: they were all acknowledged
            // durable, and this handle still held the lock when they were.
            if o.lock().is_some() {
                o.writer()?;
            }
            Ok(Value::None)
        })
    }

    fn op_close(&self) -> Op {
        let o = self.inner.lock().ok().and_then(|mut g| g.take());
        Box::pin(async move {
            let Some(o) = o else { return Ok(Value::None) };
            let flushed = o.image.flush().await;
            let lock = o.lock().take();
            if let Some(lock) = lock {
                lock.release().await;
            }
            flushed?;
            Ok(Value::None)
        })
    }
}

#[pymethods]
impl Image {
    /// Reads `length` bytes at `offset` (never-written bytes read as zeros).
    fn read(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<Py<PyAny>> {
        check_io_len(length)?;
        block(py, self.op_read(offset, length))
    }

    fn read_cb(&self, offset: u64, length: u64, callback: Py<PyAny>) -> PyResult<()> {
        check_io_len(length)?;
        start(self.op_read(offset, length), callback)
    }

    /// Writes `data` at `offset`; returns once it is durable on every up replica.
    fn write(&self, py: Python<'_>, offset: u64, data: &[u8]) -> PyResult<Py<PyAny>> {
        check_io_len(data.len() as u64)?;
        block(py, self.op_write(offset, data.to_vec()))
    }

    fn write_cb(&self, offset: u64, data: &[u8], callback: Py<PyAny>) -> PyResult<()> {
        check_io_len(data.len() as u64)?;
        start(self.op_write(offset, data.to_vec()), callback)
    }

    /// Makes `[offset, offset + length)` read as zeros and frees its space.
    fn discard(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<Py<PyAny>> {
        block(py, self.op_discard(offset, length))
    }

    /// Waits for every write started before it (each is durable once acknowledged).
    fn flush(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        block(py, self.op_flush())
    }

    fn flush_cb(&self, callback: Py<PyAny>) -> PyResult<()> {
        start(self.op_flush(), callback)
    }

    /// Changes the size (shrinking drops the data past the end; growing reads as zeros).
    fn resize(&self, py: Python<'_>, size: u64) -> PyResult<Py<PyAny>> {
        let o = self.open();
        let op: Op = Box::pin(async move {
            let o = o?;
            o.writer()?;
            let r = o.image.resize(size).await;
            o.observe(r)?;
            Ok(Value::None)
        });
        block(py, op)
    }

    /// Flushes and gives the lock back; later calls raise `ClientClosed`. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        block(py, self.op_close())
    }

    fn close_cb(&self, callback: Py<PyAny>) -> PyResult<()> {
        start(self.op_close(), callback)
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|g| g.is_none()).unwrap_or(true)
    }

    /// The image's description (`name`, `pool`, `size`, `object_size`, ...).
    fn info(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let o = self.open().map_err(|f| f.into_pyerr(py))?;
        Ok(info_dict(py, &o.image.info())?.into_any().unbind())
    }

    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let o = self.open().map_err(|f| f.into_pyerr(py))?;
        Ok(o.image.size_bytes())
    }

    #[getter]
    fn read_only(&self, py: Python<'_>) -> PyResult<bool> {
        let o = self.open().map_err(|f| f.into_pyerr(py))?;
        let read_only = o.lock().is_none();
        Ok(read_only)
    }
}

fn check_name(what: &str, name: &str) -> PyResult<()> {
    if name.is_empty() {
        return Err(PyValueError::new_err(format!("{what} must not be empty")));
    }
    Ok(())
}

#[pymethods]
impl Client {
    /// Connects to a cluster: the monitors at `mon` ("host:port,..."), else those of the
    /// embedded cluster in `dir` (default `$SPINDLE_DIR`, else `./spindle-data`), with the
    /// keyring `keyring` (default `DIR/keyring` if it exists) as entity `name`.
    #[staticmethod]
    #[pyo3(signature = (dir=None, mon=None, keyring=None, name=None, timeout_ms=30000))]
    fn connect(
        py: Python<'_>,
        dir: Option<PathBuf>,
        mon: Option<String>,
        keyring: Option<PathBuf>,
        name: Option<String>,
        timeout_ms: u64,
    ) -> PyResult<Client> {
        if timeout_ms == 0 {
            return Err(PyValueError::new_err("timeout_ms must be positive"));
        }
        let target = spindle_cluster::Target {
            dir: dir
                .or_else(|| std::env::var_os("SPINDLE_DIR").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("./spindle-data")),
            mon,
            keyring: keyring.or_else(|| std::env::var_os("SPINDLE_KEYRING").map(PathBuf::from)),
            entity: name
                .or_else(|| std::env::var("SPINDLE_NAME").ok())
                .unwrap_or_else(|| "client.admin".into()),
        };
        let mut config = target
            .client_config()
            .map_err(|e| Failure::Setup(format!("{e:#}")).into_pyerr(py))?;
        config.op_timeout_ms = timeout_ms;
        let rt = runtime()?;
        let connected = py.detach(|| {
            rt.block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_millis(timeout_ms),
                    spindle_client::Client::connect(config),
                )
                .await
            })
        });
        match connected {
            Ok(Ok(c)) => Ok(Client {
                inner: Mutex::new(Some(Arc::new(c))),
            }),
            Ok(Err(e)) => Err(Failure::Client(e).into_pyerr(py)),
            Err(_) => Err(Failure::Client(ClientError::Timeout {
                ms: timeout_ms,
                last: "connecting to the monitors".into(),
            })
            .into_pyerr(py)),
        }
    }

    /// Ends the connection; calls afterwards raise `ClientClosed`.
    fn close(&self) {
        if let Ok(mut g) = self.inner.lock() {
            g.take();
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|g| g.is_none()).unwrap_or(true)
    }

    /// Reads `length` bytes (default: to the end) at `offset` of object `name`.
    #[pyo3(signature = (pool, name, offset=0, length=None))]
    fn get(
        &self,
        py: Python<'_>,
        pool: String,
        name: String,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        block(py, self.op_get(pool, name, offset, length, false))
    }

    /// `get` started on the runtime; with `blob` the bytes come as a `Blob` (no copy).
    #[pyo3(signature = (pool, name, offset, length, blob, callback))]
    fn get_cb(
        &self,
        pool: String,
        name: String,
        offset: u64,
        length: Option<u64>,
        blob: bool,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        start(self.op_get(pool, name, offset, length, blob), callback)
    }

    /// Writes `data` as the whole object (`offset` None) or at `offset` in it.
    #[pyo3(signature = (pool, name, data, offset=None))]
    fn put(
        &self,
        py: Python<'_>,
        pool: String,
        name: String,
        data: &[u8],
        offset: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        let data = data.to_vec();
        block(py, self.op_put(pool, name, data, offset))
    }

    #[pyo3(signature = (pool, name, data, offset, callback))]
    fn put_cb(
        &self,
        pool: String,
        name: String,
        data: &[u8],
        offset: Option<u64>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        start(self.op_put(pool, name, data.to_vec(), offset), callback)
    }

    #[pyo3(signature = (pool, name, missing_ok=false))]
    fn delete(
        &self,
        py: Python<'_>,
        pool: String,
        name: String,
        missing_ok: bool,
    ) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        block(py, self.op_delete(pool, name, missing_ok))
    }

    fn delete_cb(
        &self,
        pool: String,
        name: String,
        missing_ok: bool,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        start(self.op_delete(pool, name, missing_ok), callback)
    }

    /// `{"size": bytes, "version": str}` of object `name`.
    fn stat(&self, py: Python<'_>, pool: String, name: String) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        block(py, self.op_stat(pool, name))
    }

    fn stat_cb(&self, pool: String, name: String, callback: Py<PyAny>) -> PyResult<()> {
        check_name("name", &name)?;
        start(self.op_stat(pool, name), callback)
    }

    /// `[(name, size)]` of the pool's objects whose names start with `prefix`, sorted.
    #[pyo3(signature = (pool, prefix=String::new()))]
    fn list(&self, py: Python<'_>, pool: String, prefix: String) -> PyResult<Py<PyAny>> {
        block(py, self.op_list(pool, prefix))
    }

    fn list_cb(&self, pool: String, prefix: String, callback: Py<PyAny>) -> PyResult<()> {
        start(self.op_list(pool, prefix), callback)
    }

    /// Runs the eBPF object file `program` on the daemon holding `objects` (one, or up to
    /// 16 sharing a placement key): `{"ret": int, "output": bytes, "parts": [...]}`. With
    /// `shards` on an erasure-coded pool, once per data shard on the daemon holding it
    /// (`parts`: `(ret, output)` per shard; `ret` their sum, `output` theirs back to back);
    /// `parts` is empty for a whole-object run.
    #[pyo3(signature = (pool, objects, program, args=Vec::new(), jit=true, cache=false, shards=false))]
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        py: Python<'_>,
        pool: String,
        objects: Vec<String>,
        program: Vec<u8>,
        args: Vec<u8>,
        jit: bool,
        cache: bool,
        shards: bool,
    ) -> PyResult<Py<PyAny>> {
        if objects.is_empty() {
            return Err(PyValueError::new_err("exec needs at least one object"));
        }
        let options = ExecOptions { jit, cache, shards };
        block(py, self.op_exec(pool, objects, program, args, options))
    }

    #[allow(clippy::too_many_arguments)]
    fn exec_cb(
        &self,
        pool: String,
        objects: Vec<String>,
        program: Vec<u8>,
        args: Vec<u8>,
        jit: bool,
        cache: bool,
        shards: bool,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        if objects.is_empty() {
            return Err(PyValueError::new_err("exec needs at least one object"));
        }
        let options = ExecOptions { jit, cache, shards };
        start(
            self.op_exec(pool, objects, program, args, options),
            callback,
        )
    }

    /// Runs `program` once per `(object, args)` item of `items`, up to `in_flight` at a
    /// time, and calls back with a list in the items' order: `(ret, output)` per run, or
    /// None where the object does not exist. Any other failure fails the batch.
    ///
    /// With `group_output_bytes`, items of one placement group with the same arguments run
    /// together (up to 16 objects per run: fewer messages and program starts), and the
    /// program must emit exactly that many bytes per object, in the run's order; each item
    /// gets its share, with the run's return value.
    #[allow(clippy::too_many_arguments)]
    fn exec_batch_cb(
        &self,
        pool: String,
        items: Vec<(String, Vec<u8>)>,
        program: Vec<u8>,
        jit: bool,
        cache: bool,
        in_flight: usize,
        group_output_bytes: Option<usize>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        if group_output_bytes == Some(0) {
            return Err(PyValueError::new_err(
                "group_output_bytes: at least 1 (the bytes the program emits per object)",
            ));
        }
        if in_flight == 0 || in_flight > EXEC_BATCH_IN_FLIGHT_MAX {
            return Err(PyValueError::new_err(format!(
                "in_flight {in_flight}: 1 to {EXEC_BATCH_IN_FLIGHT_MAX}"
            )));
        }
        start(
            self.op_exec_batch(
                pool,
                items,
                program,
                ExecOptions {
                    jit,
                    cache,
                    shards: false,
                },
                in_flight,
                group_output_bytes,
            ),
            callback,
        )
    }

    /// Creates image `name` of `size` bytes (a multiple of 512) in `pool`, thin, with
    /// data objects of `object_size` bytes (default: the pool's); returns its description.
    #[pyo3(signature = (pool, name, size, object_size=None))]
    fn image_create(
        &self,
        py: Python<'_>,
        pool: String,
        name: String,
        size: u64,
        object_size: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let infos = block(py, self.op_image_create(pool, name, size, object_size))?;
        Ok(infos.bind(py).get_item(0)?.unbind())
    }

    /// Opens image `name`: for writing (taking its exclusive lock; `take_over` takes it
    /// from a live holder, which is then fenced), `read_only`, or at `snapshot`.
    #[pyo3(signature = (pool, name, read_only=false, snapshot=None, take_over=false))]
    fn image_open(
        &self,
        py: Python<'_>,
        pool: String,
        name: String,
        read_only: bool,
        snapshot: Option<String>,
        take_over: bool,
    ) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        block(
            py,
            self.op_image_open(pool, name, read_only, snapshot, take_over),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn image_open_cb(
        &self,
        pool: String,
        name: String,
        read_only: bool,
        snapshot: Option<String>,
        take_over: bool,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        start(
            self.op_image_open(pool, name, read_only, snapshot, take_over),
            callback,
        )
    }

    /// The images of `pool`, sorted by name, as dicts.
    fn image_list(&self, py: Python<'_>, pool: String) -> PyResult<Py<PyAny>> {
        block(py, self.op_image_list(pool))
    }

    /// Removes image `name` and its data (refused while it has snapshots or is served).
    fn image_remove(&self, py: Python<'_>, pool: String, name: String) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        block(py, self.op_image_remove(pool, name))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Image>()?;
    m.add_class::<Blob>()?;
    m.add_class::<CompletionQueue>()?;
    m.add_class::<Completion>()?;
    m.add_function(wrap_pyfunction!(_register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(_at_exit, m)?)?;
    m.add("OBJECT_BYTES_MAX", spindle_client::OBJECT_BYTES_MAX)?;
    // The reduction program (`crates/spindle-prog/programs/zarr_reduce.c`, built by
    // build.rs): run by `spindle.zarr.reduce` next to each chunk.
    m.add(
        "REDUCE_PROGRAM",
        PyBytes::new(
            m.py(),
            include_bytes!(concat!(env!("OUT_DIR"), "/zarr_reduce.o")),
        ),
    )?;
    Ok(())
}
