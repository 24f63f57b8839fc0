//! CPU time of processes, for the benchmarks that report CPU per operation: user + system
//! time of a running process from `/proc/PID/stat`, and of this process's reaped
//! children from `getrusage(RUSAGE_CHILDREN)`.
//!
//! Resolution: `/proc/PID/stat` counts clock ticks (`sysconf(_SC_CLK_TCK)`, 100 per second
//! on Linux), so one sample is exact to 10 ms per process; a difference of two samples is
//! the CPU the process used in between (all its threads).

use anyhow::{bail, Context};

/// Clock ticks per second of `/proc/PID/stat` (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// utime + stime (fields 14 and 15) of the text of a `/proc/PID/stat`, in clock ticks.
/// The command name (field 2) is in parentheses and may itself hold spaces and `)`, so
/// the fields are counted from the last `)`.
pub fn stat_cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let Some(close) = stat.rfind(')') else {
        bail!("no ')' after the command name in {stat:?}");
    };
    // After the name: field 3 (state) is index 0, so utime (14) is 11 and stime (15) 12.
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let field = |index: usize, name: &str| -> anyhow::Result<u64> {
        let text = fields
            .get(index)
            .with_context(|| format!("no {name} field in {stat:?}"))?;
        text.parse()
            .with_context(|| format!("{name} {text:?} is not a number in {stat:?}"))
    };
    Ok(field(11, "utime")? + field(12, "stime")?)
}

/// Clock ticks as microseconds.
pub fn ticks_to_us(ticks: u64, ticks_per_second: u64) -> u64 {
    ticks.saturating_mul(1_000_000) / ticks_per_second.max(1)
}

/// User + system CPU time of a live process (all its threads), in µs.
pub fn process_cpu_us(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    Ok(ticks_to_us(
        stat_cpu_ticks(&stat)?,
        clock_ticks_per_second(),
    ))
}

/// User + system CPU time of every child of this process that has exited and been
/// waited for (and of their waited-for descendants), in µs. The difference around one
/// `Command::output()` is that command's CPU, all its processes included, provided no
/// other child is reaped meanwhile.
pub fn reaped_children_cpu_us() -> anyhow::Result<u64> {
    // SAFETY: an all-zero rusage is a valid value; getrusage only writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with a valid `who` and a pointer to a live rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        bail!(
            "getrusage(RUSAGE_CHILDREN): {}",
            std::io::Error::last_os_error()
        );
    }
    let us = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    Ok(us(usage.ru_utime) + us(usage.ru_stime))
}

/// The command line of a live process, arguments joined by spaces (None if gone).
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text = String::from_utf8_lossy(&raw);
    Some(text.trim_end_matches('\0').replace('\0', " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line of `/proc/PID/stat` (a `spindle osd run`), and names with `)`.
    #[test]
    fn stat_cpu_ticks_reads_utime_and_stime() {
        let line = "4242 (spindle) S 1 4242 4242 0 -1 4194560 30181 0 0 0 1234 567 0 0 20 0 \
                    9 0 5021 1234567 2345 18446744073709551615 1 1 0 0 0 0 0 4096 17991 0 0 0 \
                    17 1 0 0 0 0 0";
        assert_eq!(stat_cpu_ticks(line).ok(), Some(1234 + 567));
        let odd = "7 (a) b) c) R 1 7 7 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 1 1 1";
        assert_eq!(stat_cpu_ticks(odd).ok(), Some(30));
        assert!(stat_cpu_ticks("7 (x) R 1 2").is_err());
        assert!(stat_cpu_ticks("no parenthesis").is_err());
        assert!(stat_cpu_ticks("7 (x) R 1 7 7 0 -1 0 0 0 0 0 ten 20").is_err());
    }

    #[test]
    fn ticks_convert_to_microseconds() {
        assert_eq!(ticks_to_us(150, 100), 1_500_000);
        assert_eq!(ticks_to_us(1, 1000), 1000);
        assert_eq!(ticks_to_us(5, 0), 5_000_000);
    }

    /// This process is alive and has used some CPU; its command line is readable.
    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(process_cpu_us(me).is_ok());
        assert!(cmdline(me).is_some_and(|c| !c.is_empty()));
        assert!(reaped_children_cpu_us().is_ok());
    }
}
