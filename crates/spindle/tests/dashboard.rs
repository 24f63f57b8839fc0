//! The monitor's web dashboard (issue #22) in a real headless browser: Debian's Chromium
//! driven by Playwright (`tests/browser/dashboard.mjs`). The page loads with no console
//! error and no failed request, shows the cluster's three daemons, an image served by a
//! real `spindle nbd` under a real fio job with its size, used space (as `spindle image
//! du` counts it) and live rate, and shows a stopped daemon as down within 10 s; a
//! screenshot is saved.

mod common;

use common::{content, run_ok, spindle, Cluster, NbdProc};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `tests/browser`, with its npm packages installed (`npm ci`, once).
fn browser_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    if !dir.join("node_modules/playwright-core").exists() {
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .output()
            .expect("npm (scripts/setup.sh installs Node.js and npm)");
        assert!(
            out.status.success(),
            "npm ci in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "no /usr/bin/chromium: scripts/setup.sh installs Debian's chromium"
    );
    dir
}

#[test]
fn the_dashboard_shows_the_cluster_and_a_stopped_daemon_in_a_real_browser() {
    let browser = browser_dir();
    let c = Cluster::start("dashboard", 3, 16);
    // Some data, so the page has objects and rates to show.
    run_ok(
        spindle()
            .args([
                "bench",
                "objects",
                "--seconds",
                "1",
                "--sizes",
                "4k",
                "--dir",
            ])
            .arg(&c.dir),
    );
    // An image with 6 MiB of data, served over NBD and read by fio meanwhile.
    let data = c.dir.join("dash.img");
    std::fs::write(&data, content("dash", 1, 6 << 20)).unwrap();
    run_ok(
        spindle()
            .args(["image", "import"])
            .arg(&data)
            .args(["dash", "--size", "64M", "--dir"])
            .arg(&c.dir),
    );
    let du: serde_json::Value = serde_json::from_str(&run_ok(
        spindle()
            .args(["image", "du", "dash", "--json", "--dir"])
            .arg(&c.dir),
    ))
    .expect("du JSON");
    let used = du[0]["used_bytes"].as_u64().expect("used_bytes");
    assert_eq!(used, 6 << 20, "{du}");
    let nbd = NbdProc::start(&c);
    let fio = Command::new("fio")
        .args([
            "--name=dashboard",
            "--ioengine=nbd",
            &format!("--uri={}", nbd.uri("dash")),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=4",
            "--size=6m",
            "--time_based",
            "--runtime=60",
            "--rate_iops=200",
            // The job as a thread of fio's one process: a forked job process puts itself
            // in a group of its own and outlived even a group kill (seen in CI).
            "--thread",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // fio forks its job into a child process: a group of its own lets the guard stop
        // both (killing the parent alone left the job spinning after the test).
        .process_group(0)
        .spawn()
        .expect("fio (scripts/setup.sh installs it)");
    let mut fio = FioGroup(fio);
    // `spindle status` names the leader's dashboard.
    let text = run_ok(spindle().args(["status", "--dir"]).arg(&c.dir));
    let url = text
        .lines()
        .find_map(|l| l.strip_prefix("dashboard: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("`spindle status` names no dashboard:\n{text}"))
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let shot = c.dir.join("dashboard.png");
    let mut node = Command::new("node")
        .arg(browser.join("dashboard.mjs"))
        .arg(&url)
        .arg(&shot)
        .current_dir(&browser)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node");
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut next = || {
        lines
            .next()
            .unwrap_or_else(|| panic!("the browser script ended early"))
            .unwrap()
    };
    let loaded = next();
    assert_eq!(loaded, "LOADED 3", "the page shows three daemons");
    let image = next();
    let fields: Vec<&str> = image.split(' ').collect();
    assert_eq!(
        fields.first(),
        Some(&"IMAGE"),
        "the page shows no image: {image}"
    );
    assert_eq!(fields[1], (64u64 << 20).to_string(), "size: {image}");
    assert_eq!(
        fields[2],
        used.to_string(),
        "used as `image du` counts it: {image}"
    );
    let ops: f64 = fields[3].parse().unwrap_or(0.0);
    assert!(ops > 0.0, "fio's reads show as a rate: {image}");
    assert!(
        fields[4..].contains(&"default/dash"),
        "the image's chart: {image}"
    );
    eprintln!("{image}");
    fio.stop();

    c.kill_osd(2);
    writeln!(node.stdin.as_mut().unwrap(), "stopped").unwrap();
    let seen = next();
    let ms: u64 = seen
        .strip_prefix("SEEN ")
        .unwrap_or_else(|| panic!("the page did not show osd.2 down within 10 s: {seen}"))
        .parse()
        .unwrap();
    assert!(ms <= 10_000, "{ms} ms");
    let health = next();
    assert!(
        health.starts_with("HEALTH HEALTH_WARN") || health.starts_with("HEALTH HEALTH_ERR"),
        "{health}"
    );
    let problems = next();
    assert_eq!(
        problems, "PROBLEMS []",
        "the page met console errors or failed requests"
    );
    let out = node.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!(
        "dashboard showed osd.2 down after {ms} ms; screenshot {}",
        shot.display()
    );
}

/// A fio process group, killed whole when stopped or dropped (also on a failed assert).
struct FioGroup(std::process::Child);

impl FioGroup {
    fn stop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals the group fio leads; no memory is
        // involved.
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

impl Drop for FioGroup {
    fn drop(&mut self) {
        self.stop();
    }
}
