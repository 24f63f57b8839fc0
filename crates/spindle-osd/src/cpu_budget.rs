//! A CPU budget for the execution threads (`exec.rs`): each may use at most a set share of
//! one CPU, however long a program runs and whatever engine runs it.
//!
//! Why not only a scheduling policy: the threads already run under `SCHED_IDLE`, yet with
//! the kernel's autogroups every daemon is a scheduling group of its own (its own session),
//! and a group gets its fair share of the CPUs whatever the policy of the threads inside
//! it. A daemon whose execution thread spins therefore takes a whole CPU's share from
//! fio, the NBD server and the other daemons (measured: p99 3.5x, IOPS halved on 2 CPUs).
//!
//! How: a per-thread timer on the thread's own CPU clock (`CLOCK_THREAD_CPUTIME_ID`,
//! delivered to that thread alone with `SIGEV_THREAD_ID`) fires after every
//! [`SLICE_CPU_NS`] of CPU the thread has used, and the signal handler sleeps for as long
//! as the budget says: at `p` percent, `SLICE_CPU_NS * (100 - p) / p`. The handler only
//! reads a thread-local value and calls `nanosleep`, both async-signal-safe, so it can
//! interrupt anything, JIT-compiled code included, without cooperation from the program
//! or the virtual machine. A thread that waits for work uses no CPU and gets no signal.

use std::cell::Cell;
use std::sync::OnceLock;

/// CPU time a throttled thread runs between two pauses: short enough that I/O never
/// waits long behind a program, long enough that the signals cost nothing measurable
/// (100 per CPU-second). CPU-clock timers are checked at the scheduler's tick (1-4 ms),
/// so much shorter slices would not be kept anyway.
pub const SLICE_CPU_NS: u64 = 10_000_000;
/// Default share of one CPU that a daemon's execution threads may use together.
pub const EXEC_CPU_PERCENT_DEFAULT: u32 = 25;
/// The most a daemon may give its execution threads: all of 64 CPUs.
pub const EXEC_CPU_PERCENT_MAX: u32 = 6400;

thread_local! {
    /// Nanoseconds the calling thread sleeps after each slice; 0: not throttled. A plain
    /// const-initialised cell: reading it from a signal handler needs no allocation.
    static PAUSE_NS: Cell<u64> = const { Cell::new(0) };
}

/// How long a thread allowed `percent` of one CPU pauses after each slice.
pub fn pause_ns(percent: u32) -> u64 {
    if percent == 0 || percent >= 100 {
        return 0;
    }
    SLICE_CPU_NS * u64::from(100 - percent) / u64::from(percent)
}

/// The budget of one of `threads` threads that share `total_percent` of a CPU.
pub fn per_thread_percent(total_percent: u32, threads: usize) -> u32 {
    assert!(threads > 0);
    let p = total_percent / threads as u32;
    p.clamp(1, 100)
}

fn signal_number() -> libc::c_int {
    // Past the real-time signals glibc keeps for itself; nothing else in a daemon uses it.
    libc::SIGRTMIN() + 5
}

extern "C" fn on_slice(_signal: libc::c_int) {
    let ns = PAUSE_NS.with(|p| p.get());
    if ns == 0 {
        return;
    }
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: errno is saved and restored around nanosleep (async-signal-safe) so that the
    // interrupted code sees its own errno; `ts` is valid for the call. An early wake-up
    // (another signal) only shortens this pause.
    unsafe {
        let errno = *libc::__errno_location();
        libc::nanosleep(&ts, std::ptr::null_mut());
        *libc::__errno_location() = errno;
    }
}

static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();

/// Limits the calling thread to `percent` of one CPU (100 or more: no limit). Errors say
/// why the timer could not be set; the caller logs them and runs the thread unthrottled.
pub fn limit_this_thread(percent: u32) -> std::io::Result<()> {
    let pause = pause_ns(percent);
    PAUSE_NS.with(|p| p.set(pause));
    if pause == 0 {
        return Ok(());
    }
    // The handler is installed once per process, and every thread checks that it was: a
    // timer whose signal has no handler would end the process (the default action).
    let installed = INSTALL.get_or_init(|| {
        // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn that only
        // does async-signal-safe work; SA_RESTART restarts system calls it interrupts.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_slice as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(signal_number(), &act, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
        }
        Ok(())
    });
    if let Err(e) = installed {
        return Err(std::io::Error::other(format!("signal handler: {e}")));
    }
    // SAFETY: a zeroed sigevent is valid; the timer is created for this thread (its id
    // from gettid) on its own CPU clock and armed with a valid itimerspec. The timer is
    // never deleted: it lives as long as the thread, and the kernel drops it with the
    // thread (a thread-targeted CPU timer of an exited thread never fires again).
    unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = signal_number();
        sev.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut timer) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let slice = libc::timespec {
            tv_sec: 0,
            tv_nsec: SLICE_CPU_NS as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: slice,
            it_value: slice,
        };
        if libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) != 0 {
            let e = std::io::Error::last_os_error();
            libc::timer_delete(timer);
            return Err(e);
        }
    }
    Ok(())
}

const _: () = assert!(SLICE_CPU_NS < 1_000_000_000, "a slice fits in tv_nsec");
const _: () = assert!(EXEC_CPU_PERCENT_DEFAULT >= 1 && EXEC_CPU_PERCENT_DEFAULT <= 100);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is valid for the call to write.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    #[test]
    fn pauses_follow_the_percent() {
        assert_eq!(pause_ns(100), 0);
        assert_eq!(pause_ns(0), 0);
        assert_eq!(pause_ns(50), SLICE_CPU_NS);
        assert_eq!(pause_ns(25), 3 * SLICE_CPU_NS);
        assert_eq!(per_thread_percent(25, 1), 25);
        assert_eq!(per_thread_percent(200, 4), 50);
        assert_eq!(per_thread_percent(3, 8), 1);
        assert_eq!(per_thread_percent(800, 2), 100);
    }

    /// A spinning thread limited to 20 % of a CPU uses about a fifth of the wall time it
    /// takes (never more than a third).
    #[test]
    fn a_spinning_thread_keeps_to_its_budget() {
        let spin = |percent: u32| {
            std::thread::spawn(move || {
                limit_this_thread(percent).expect("timer");
                let started = Instant::now();
                let cpu0 = thread_cpu();
                let mut x = 0u64;
                while started.elapsed() < Duration::from_millis(1500) {
                    for i in 0..10_000u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
                    }
                    std::hint::black_box(x);
                }
                (thread_cpu() - cpu0).as_secs_f64() / started.elapsed().as_secs_f64()
            })
            .join()
            .expect("thread")
        };
        let limited = spin(20);
        eprintln!(
            "a thread limited to 20 %: {:.1} % of its wall time on a CPU",
            limited * 100.0
        );
        assert!(
            limited < 0.34,
            "limited to 20 %, used {:.1} %",
            limited * 100.0
        );
        assert!(
            limited > 0.02,
            "limited to 20 %, hardly ran: {:.1} %",
            limited * 100.0
        );
    }
}
