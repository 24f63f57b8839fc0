//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The project's `shared/` folder (reference data): `$SPINDLE_SHARED_DIR`, or the
/// checkout's sibling `../shared`. Panics with a clear message when it is missing: these
/// tests must never pass by skipping.
pub fn shared_dir() -> PathBuf {
    let dir = match std::env::var_os("SPINDLE_SHARED_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    assert!(
        dir.join("crush/vectors/public").is_dir(),
        "reference data not found at {} (set SPINDLE_SHARED_DIR)",
        dir.display()
    );
    dir
}

/// Path of the installed crushtool; panics (never skips) when it is not installed.
pub fn crushtool() -> PathBuf {
    let path = PathBuf::from("/usr/bin/crushtool");
    assert!(
        path.exists(),
        "crushtool is not installed: run scripts/test.sh (installs Debian package ceph-base)"
    );
    path
}

pub fn run(cmd: &mut Command) -> String {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Runs a command with a time limit; returns its exit status (None if it had to be killed)
/// and everything it wrote to stdout. crushtool can deadlock in its crash handler after
/// corrupting its heap, so oracle runs are bounded.
pub fn run_with_timeout(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String) {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    (status, reader.join().expect("reader thread"))
}
