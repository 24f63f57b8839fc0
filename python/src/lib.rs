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
    Closed,
    Setup(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        Failure::Client(e)
    }
}

impl Failure {
    fn class(&self) -> &'static str {
        match self {
            Failure::Closed => "ClientClosed",
            Failure::Setup(_) => "ConnectionFailed",
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
            Failure::Setup(m) => m.clone(),
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

/// What an operation gives back, turned into a Python value with the GIL held.
enum Value {
    None,
    Bytes(Vec<u8>),
    Stat { size_bytes: u64, version: String },
    Listing(Vec<(String, u64)>),
    Exec { ret: u64, output: Vec<u8> },
}

impl Value {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Value::None => py.None(),
            Value::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
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
            Value::Exec { ret, output } => {
                let d = PyDict::new(py);
                d.set_item("ret", ret)?;
                d.set_item("output", PyBytes::new(py, &output))?;
                d.into_any().unbind()
            }
        })
    }
}

type Op = std::pin::Pin<Box<dyn Future<Output = Result<Value, Failure>> + Send>>;

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

    /// Runs `op` to its end with the GIL released.
    fn block(&self, py: Python<'_>, op: Op) -> PyResult<Py<PyAny>> {
        let rt = runtime()?;
        match py.detach(|| rt.block_on(op)) {
            Ok(v) => v.into_py(py),
            Err(f) => Err(f.into_pyerr(py)),
        }
    }

    /// Starts `op` on the runtime; `callback(error, value)` gets its end.
    fn start(&self, op: Op, callback: Py<PyAny>) -> PyResult<()> {
        let rt = runtime()?;
        rt.spawn(async move {
            let r = op.await;
            Python::attach(|py| {
                let (err, val) = match r.map(|v| v.into_py(py)) {
                    Ok(Ok(v)) => (py.None(), v),
                    Ok(Err(e)) => (e.into_value(py).into_any(), py.None()),
                    Err(f) => (f.into_pyerr(py).into_value(py).into_any(), py.None()),
                };
                if let Err(e) = callback.call1(py, (err, val)) {
                    e.print(py);
                }
            });
        });
        Ok(())
    }

    fn op_get(&self, pool: String, name: String, offset: u64, length: Option<u64>) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let len = length.unwrap_or(spindle_client::OBJECT_BYTES_MAX);
            Ok(Value::Bytes(c.read(&pool, &name, offset, len).await?))
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
        jit: bool,
        cache: bool,
    ) -> Op {
        let c = self.client();
        Box::pin(async move {
            let c = c?;
            let code = ProgramCode::new(program);
            let names: Vec<&str> = objects.iter().map(|s| s.as_str()).collect();
            let r = c
                .exec(&pool, &names, &code, &args, ExecOptions { jit, cache })
                .await?;
            Ok(Value::Exec {
                ret: r.ret,
                output: r.output,
            })
        })
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
        self.block(py, self.op_get(pool, name, offset, length))
    }

    #[pyo3(signature = (pool, name, offset, length, callback))]
    fn get_cb(
        &self,
        pool: String,
        name: String,
        offset: u64,
        length: Option<u64>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        self.start(self.op_get(pool, name, offset, length), callback)
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
        self.block(py, self.op_put(pool, name, data, offset))
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
        self.start(self.op_put(pool, name, data.to_vec(), offset), callback)
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
        self.block(py, self.op_delete(pool, name, missing_ok))
    }

    fn delete_cb(
        &self,
        pool: String,
        name: String,
        missing_ok: bool,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        check_name("name", &name)?;
        self.start(self.op_delete(pool, name, missing_ok), callback)
    }

    /// `{"size": bytes, "version": str}` of object `name`.
    fn stat(&self, py: Python<'_>, pool: String, name: String) -> PyResult<Py<PyAny>> {
        check_name("name", &name)?;
        self.block(py, self.op_stat(pool, name))
    }

    fn stat_cb(&self, pool: String, name: String, callback: Py<PyAny>) -> PyResult<()> {
        check_name("name", &name)?;
        self.start(self.op_stat(pool, name), callback)
    }

    /// `[(name, size)]` of the pool's objects whose names start with `prefix`, sorted.
    #[pyo3(signature = (pool, prefix=String::new()))]
    fn list(&self, py: Python<'_>, pool: String, prefix: String) -> PyResult<Py<PyAny>> {
        self.block(py, self.op_list(pool, prefix))
    }

    fn list_cb(&self, pool: String, prefix: String, callback: Py<PyAny>) -> PyResult<()> {
        self.start(self.op_list(pool, prefix), callback)
    }

    /// Runs the eBPF object file `program` on the daemon holding `objects` (one, or up to
    /// 16 sharing a placement key): `{"ret": int, "output": bytes}`.
    #[pyo3(signature = (pool, objects, program, args=Vec::new(), jit=true, cache=false))]
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
    ) -> PyResult<Py<PyAny>> {
        if objects.is_empty() {
            return Err(PyValueError::new_err("exec needs at least one object"));
        }
        self.block(py, self.op_exec(pool, objects, program, args, jit, cache))
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
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        if objects.is_empty() {
            return Err(PyValueError::new_err("exec needs at least one object"));
        }
        self.start(
            self.op_exec(pool, objects, program, args, jit, cache),
            callback,
        )
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_function(wrap_pyfunction!(_register_errors, m)?)?;
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
