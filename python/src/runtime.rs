//! Where the Rust futures run, and how Python waits for them.
//!
//! One tokio runtime per process (made again in a child after `fork`, where the parent's
//! threads are gone). A blocking call runs its future on the calling thread with the GIL
//! released, and stops for Ctrl-C. An async call spawns its future on the runtime and answers
//! an `asyncio.Future` of the running loop: a thread of its own hands each result to the loop
//! with `call_soon_threadsafe` (batched, so that the runtime's workers never wait for the GIL),
//! and cancelling the asyncio future aborts the task, which drops the Rust future: a wait
//! cancelled in Python gives up its place in line as a dropped Rust future does.

use std::future::Future;
use std::pin::pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyAny;
use tokio::runtime::Runtime;
use tokio::task::AbortHandle;

/// A result on its way to the loop: set on the asyncio future, or, if that future was
/// cancelled meanwhile, undone (a permit that was never received goes back).
type Deliver = Box<dyn FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<()> + Send>;

/// One finished future, for the loop that awaits it (held weakly: an asyncio future nobody
/// holds any more was dropped, and its Rust future with it).
struct Done {
    future: Py<PyAny>,
    deliver: Deliver,
}

/// What this process has made: a fork leaves the parent's behind.
struct Process {
    runtime: &'static Runtime,
    done: mpsc::Sender<Done>,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

fn process<T>(with: impl FnOnce(&Process) -> T) -> T {
    let mut process = PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    let process = process.get_or_insert_with(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tollgate")
            .enable_all()
            .build()
            .expect("a tokio runtime can be made");
        // Leaked on purpose: a runtime lives as long as its process, and one inherited by a
        // forked child can't be shut down (its threads are not there to join).
        let runtime: &'static Runtime = Box::leak(Box::new(runtime));
        let (done, results) = mpsc::channel();
        std::thread::Builder::new()
            .name("tollgate-results".into())
            .spawn(move || hand_over(results))
            .expect("a thread can be started");
        Process { runtime, done }
    });
    with(process)
}

/// The runtime of this process.
pub(crate) fn runtime() -> &'static Runtime {
    process(|p| p.runtime)
}

/// Forgets the parent's runtime in a child after `fork` (`os.register_at_fork`).
pub(crate) fn after_fork() {
    // The lock may have been held by a thread of the parent that the child doesn't have.
    PROCESS.clear_poison();
    if let Ok(mut process) = PROCESS.try_lock() {
        std::mem::forget(process.take());
    }
}

/// Whether the interpreter still takes threads of ours: held by the thread that hands results
/// over while it holds the GIL, and set to false at exit (`atexit`), after which that thread
/// never asks for the GIL again. (A thread that asks for it while the interpreter finalizes is
/// ended by Python mid-call, which aborts the process.)
static OPEN: Mutex<bool> = Mutex::new(true);

/// Called at exit, with the GIL: no thread of ours asks for it from now on.
pub(crate) fn at_exit(py: Python<'_>) {
    py.detach(|| *OPEN.lock().unwrap_or_else(PoisonError::into_inner) = false);
}

/// Hands finished futures to their loops, a batch at a time under one hold of the GIL.
fn hand_over(results: mpsc::Receiver<Done>) {
    while let Ok(first) = results.recv() {
        let mut batch = vec![first];
        batch.extend(results.try_iter());
        let open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            // Exiting: nobody awaits these any more, and the Python objects are left as they
            // are (dropping them would need the GIL).
            std::mem::forget(batch);
            continue;
        }
        Python::attach(|py| {
            for done in batch {
                let setter = Setter {
                    deliver: Mutex::new(Some(done.deliver)),
                };
                // The weak reference answers None once nobody holds the asyncio future.
                let Ok(future) = done.future.bind(py).call0() else {
                    continue;
                };
                if future.is_none() {
                    continue;
                }
                let handed =
                    future
                        .call_method0(pyo3::intern!(py, "get_loop"))
                        .and_then(|event_loop| {
                            event_loop.call_method1(
                                pyo3::intern!(py, "call_soon_threadsafe"),
                                (setter, &future),
                            )
                        });
                // A closed loop: nobody awaits the result any more. Dropping it (the Setter)
                // undoes what it held, inside the runtime.
                if let Err(err) = handed {
                    drop(err);
                }
            }
        });
    }
}

/// Sets a result on the loop's thread, or undoes it if the future was cancelled.
#[pyclass(frozen)]
struct Setter {
    deliver: Mutex<Option<Deliver>>,
}

#[pymethods]
impl Setter {
    fn __call__(&self, py: Python<'_>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        let deliver = self
            .deliver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match deliver {
            Some(deliver) => {
                let _inside = runtime().enter();
                deliver(py, future)
            }
            None => Ok(()),
        }
    }
}

impl Drop for Setter {
    fn drop(&mut self) {
        let _inside = runtime().enter();
        drop(self.deliver.get_mut().map(Option::take));
    }
}

/// The task of an asyncio future, aborted when the future is cancelled, or dropped (a task
/// left behind when its loop closed, a coroutine never resumed).
type Task = Arc<OnceLock<AbortHandle>>;

/// Aborts the task of a cancelled asyncio future (its done callback).
#[pyclass(frozen)]
struct Canceller {
    task: Task,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, py: Python<'_>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future
            .call_method0(pyo3::intern!(py, "cancelled"))?
            .is_truthy()?
            && let Some(task) = self.task.get()
        {
            task.abort();
        }
        Ok(())
    }
}

/// Aborts the task of an asyncio future that nobody holds any more (its weak reference's
/// callback).
#[pyclass(frozen)]
struct Forgotten {
    task: Task,
}

#[pymethods]
impl Forgotten {
    fn __call__(&self, _reference: &Bound<'_, PyAny>) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

/// A value an async call answers, and what becomes of it when its asyncio future was
/// cancelled before it could be set (a permit goes back).
pub(crate) trait Answer: Send + 'static {
    /// The Python object.
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>>;
    /// Nobody will receive it.
    fn undelivered(self)
    where
        Self: Sized,
    {
    }
}

impl Answer for () {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(py.None())
    }
}

impl Answer for Py<PyAny> {
    fn into_py(self, _: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self)
    }
}

/// Why an async call failed, kept as Rust until it reaches the loop's thread: making the
/// Python exception takes the GIL, which the runtime's workers never wait for.
pub(crate) enum Failure {
    /// tollgate's error, raised as its Python exception.
    Tollgate(tollgate::Error),
    /// An exception already made (without the GIL: a lazy one).
    Python(PyErr),
}

impl From<tollgate::Error> for Failure {
    fn from(err: tollgate::Error) -> Failure {
        Failure::Tollgate(err)
    }
}

impl From<PyErr> for Failure {
    fn from(err: PyErr) -> Failure {
        Failure::Python(err)
    }
}

impl Failure {
    fn into_py_err(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Tollgate(err) => crate::errors::convert(py, err),
            Failure::Python(err) => err,
        }
    }
}

/// An `asyncio.Future` of the running loop that `future` completes; cancelling it drops
/// `future`.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: Answer,
{
    let event_loop = get_running_loop(py)?;
    let py_future = event_loop.call_method0(pyo3::intern!(py, "create_future"))?;
    let (done, runtime) = process(|p| (p.done.clone(), p.runtime));
    let task: Task = Arc::default();
    let future_ref = weak_ref(py)?
        .call1((
            &py_future,
            Forgotten {
                task: Arc::clone(&task),
            },
        ))?
        .unbind();
    let spawned = runtime.spawn(async move {
        let result = future.await;
        let deliver: Deliver = Box::new(move |py, fut| {
            let cancelled = fut.call_method0(pyo3::intern!(py, "done"))?.is_truthy()?;
            match result {
                Ok(value) if cancelled => {
                    value.undelivered();
                    Ok(())
                }
                Err(_) if cancelled => Ok(()),
                Ok(value) => {
                    let value = value.into_py(py)?;
                    fut.call_method1(pyo3::intern!(py, "set_result"), (value,))?;
                    Ok(())
                }
                Err(err) => {
                    fut.call_method1(
                        pyo3::intern!(py, "set_exception"),
                        (err.into_py_err(py).into_value(py),),
                    )?;
                    Ok(())
                }
            }
        });
        // Nobody reads this once the process exits; the result is dropped with it.
        let _ = done.send(Done {
            future: future_ref,
            deliver,
        });
    });
    let _ = task.set(spawned.abort_handle());
    py_future.call_method1(
        pyo3::intern!(py, "add_done_callback"),
        (Canceller { task },),
    )?;
    Ok(py_future)
}

/// Like [`awaitable`], but `future` is polled once here first: when it is ready at once (an
/// admission a memory store pays on the spot), the asyncio future comes back already done, and
/// awaiting it doesn't yield to the loop. A call admitted this way goes out before the loop
/// runs anything else: on the loop's turn, other tasks' work would stand between its admission
/// and its send, and the provider's windows refill from its arrival, not its admission.
pub(crate) fn awaitable_now<'py, F, T>(py: Python<'py>, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: Answer,
{
    let mut future = Box::pin(future);
    let Some(result) = now_or_later(&mut future) else {
        return awaitable(py, future);
    };
    let py_future = get_running_loop(py)?.call_method0(pyo3::intern!(py, "create_future"))?;
    match result {
        Ok(value) => {
            py_future.call_method1(pyo3::intern!(py, "set_result"), (value.into_py(py)?,))?;
        }
        Err(err) => {
            py_future.call_method1(
                pyo3::intern!(py, "set_exception"),
                (err.into_py_err(py).into_value(py),),
            )?;
        }
    }
    Ok(py_future)
}

static WEAK_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn weak_ref(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(WEAK_REF
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("weakref")?.getattr("ref")?.unbind())
        })?
        .bind(py))
}

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn get_running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    GET_RUNNING_LOOP
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
        })?
        .bind(py)
        .call0()
}

/// Polls `future` once where it is, without a runtime's help: a memory store answers at once,
/// and this saves the trip through the runtime (the in-memory `try_acquire` fast path).
/// `None`: it would wait; the caller finishes it with [`block`].
pub(crate) fn now_or_later<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    let _inside = runtime().enter();
    match std::pin::Pin::new(future).poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// Runs `future` to its end on this thread with the GIL released; Ctrl-C (a signal handler
/// that raises) stops the wait, dropping the future.
pub(crate) fn block<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime();
    py.detach(|| {
        runtime.block_on(async {
            let mut future = pin!(future);
            let mut ticks = tokio::time::interval(Duration::from_millis(50));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    out = &mut future => return Ok(out),
                    _ = ticks.tick() => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    })
}

/// A value that must be dropped inside the runtime (its drop may spawn a settlement).
pub(crate) struct InRuntime<T>(pub(crate) Option<T>);

impl<T> Drop for InRuntime<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            let _inside = runtime().enter();
            drop(value);
        }
    }
}

/// Shared, lockable state of a Python object, dropped inside the runtime.
pub(crate) type Slot<T> = Arc<Mutex<InRuntime<T>>>;

pub(crate) fn slot<T>(value: T) -> Slot<T> {
    Arc::new(Mutex::new(InRuntime(Some(value))))
}

/// Takes the value out of a slot (`None`: already taken).
pub(crate) fn take<T>(slot: &Slot<T>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).0.take()
}

/// Puts a value back into a slot.
pub(crate) fn put<T>(slot: &Slot<T>, value: T) {
    slot.lock().unwrap_or_else(PoisonError::into_inner).0 = Some(value);
}
