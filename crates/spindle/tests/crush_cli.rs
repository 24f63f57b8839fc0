//! The `spindle crush` commands against the real `crushtool`, as a user would run them.

use std::path::PathBuf;
use std::process::Command;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

fn crushtool() -> Command {
    let path = PathBuf::from("/usr/bin/crushtool");
    assert!(
        path.exists(),
        "crushtool is not installed: run scripts/test.sh (installs ceph-base)"
    );
    Command::new(path)
}

fn shared() -> PathBuf {
    let dir = std::env::var_os("SPINDLE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        dir.join("crush/vectors/public").is_dir(),
        "reference data missing at {}",
        dir.display()
    );
    dir
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A scratch directory of one test, removed when it goes out of scope.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("spindle-cli-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn test_output_diffs_clean_against_crushtool() {
    let case = shared().join("crush/vectors/public/h8x4_straw2_firstn_r3_out");
    let bin = case.join("map.bin");
    let weights = [
        "--weight", "5", "0", "--weight", "12", "0", "--weight", "13", "0", "--weight", "22", "0.5",
    ];
    for flags in [
        vec![
            "--show-mappings",
            "--rule",
            "1",
            "--num-rep",
            "6",
            "--min-x",
            "0",
            "--max-x",
            "2000",
        ],
        vec!["--show-statistics", "--rule", "0", "--num-rep", "3"],
        vec![
            "--show-utilization",
            "--num-rep",
            "4",
            "--min-x",
            "100",
            "--max-x",
            "5000",
        ],
        vec!["--show-statistics"],
        vec!["--show-bad-mappings", "--rule", "0", "--num-rep", "9"],
    ] {
        let theirs = stdout(
            crushtool()
                .arg("-i")
                .arg(&bin)
                .arg("--test")
                .args(&flags)
                .args(weights),
        );
        let ours = stdout(
            spindle()
                .args(["crush", "test", "-i"])
                .arg(&bin)
                .arg("--test")
                .args(&flags)
                .args(weights),
        );
        assert!(
            !theirs.is_empty(),
            "crushtool printed nothing for {flags:?}"
        );
        assert_eq!(ours, theirs, "output differs for {flags:?}");
    }
}

#[test]
fn compile_and_decompile_match_crushtool() {
    let example =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../spindle-crush/maps/example.txt");
    let scratch = Scratch::new("compile");
    let ours_bin = scratch.path("ours.bin");
    let theirs_bin = scratch.path("theirs.bin");
    stdout(
        spindle()
            .args(["crush", "compile"])
            .arg(&example)
            .arg("-o")
            .arg(&ours_bin),
    );
    stdout(
        crushtool()
            .arg("-c")
            .arg(&example)
            .arg("-o")
            .arg(&theirs_bin),
    );
    assert_eq!(
        std::fs::read(&ours_bin).unwrap(),
        std::fs::read(&theirs_bin).unwrap(),
        "compiled bytes differ"
    );
    let ours_text = stdout(spindle().args(["crush", "decompile"]).arg(&theirs_bin));
    let theirs_text = stdout(crushtool().arg("-d").arg(&theirs_bin));
    assert_eq!(ours_text, theirs_text);
    // The decompiled text compiles back to the same bytes.
    let text_path = scratch.path("round.txt");
    std::fs::write(&text_path, &ours_text).unwrap();
    let again = scratch.path("again.bin");
    stdout(
        spindle()
            .args(["crush", "compile"])
            .arg(&text_path)
            .arg("-o")
            .arg(&again),
    );
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&theirs_bin).unwrap()
    );
}

#[test]
fn main_job_summarizes_the_bundled_map() {
    let out = stdout(spindle().args(["crush", "test"]));
    assert!(out.contains("bundled example map"), "{out}");
    for rule in ["replicated_rule", "ssd_rule", "ec_rule"] {
        assert!(out.contains(rule), "summary lacks rule {rule}:\n{out}");
    }
    // ssd_rule only ever uses ssd devices (osd.0, 3, 6, 9, 12, 15).
    let ssd_section = out
        .split("ssd_rule")
        .nth(1)
        .unwrap()
        .split("rule 2")
        .next()
        .unwrap();
    for line in ssd_section
        .lines()
        .filter(|l| l.trim_start().starts_with("osd."))
    {
        let id: i32 = line.split_whitespace().next().unwrap()[4..]
            .parse()
            .unwrap();
        assert_eq!(id % 3, 0, "ssd rule placed data on non-ssd osd.{id}");
    }
}

#[test]
fn errors_are_clear_and_line_numbered() {
    let scratch = Scratch::new("errors");
    let bad = scratch.path("bad.txt");
    std::fs::write(
        &bad,
        "device 0 osd.0\ntype 0 osd\nroot r {\n\tid -1\n\talg straw7\n}\n",
    )
    .unwrap();
    let out = spindle()
        .args(["crush", "compile"])
        .arg(&bad)
        .arg("-o")
        .arg(scratch.path("x.bin"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 5") && err.contains("straw7"), "{err}");
    let out = spindle()
        .args(["crush", "test", "-i"])
        .arg(scratch.path("missing.txt"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.txt"));
    let out = spindle()
        .args(["crush", "test", "--rule", "9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rule 9 does not exist"));
}
