//! Progress bars on long commands (issue #22): drawn on a terminal (a pseudo-terminal from
//! util-linux `script`), with counts, rate and time left; absent from the output when
//! nothing is a terminal, so scripts see only the command's own lines.

mod common;

use common::{content, run_ok, spindle, Cluster};
use std::process::Command;

/// Runs `spindle ARGS` on a pseudo-terminal; everything it drew.
fn on_terminal(args: &[String]) -> String {
    let exe = env!("CARGO_BIN_EXE_spindle");
    let line = std::iter::once(exe.to_string())
        .chain(args.iter().map(|a| format!("'{a}'")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{line}: {text}");
    text
}

/// Runs `spindle ARGS` with pipes only; (stdout, stderr).
fn piped(args: &[String]) -> (String, String) {
    let out = spindle().args(args).output().expect("spindle");
    assert!(out.status.success(), "{args:?}: {:?}", out);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn long_commands_draw_progress_bars_on_a_terminal_only() {
    let c = Cluster::start("progress", 3, 16);
    let dir = c.dir.display().to_string();
    let file = c.dir.join("big.img");
    std::fs::write(&file, content("big", 1, 80 << 20)).unwrap();
    let file = file.display().to_string();
    let args = |v: &[&str]| -> Vec<String> {
        v.iter()
            .map(|s| s.to_string())
            .chain(["--dir".to_string(), dir.clone()])
            .collect()
    };

    // Import: 80 objects of 1 MiB.
    let shown = on_terminal(&args(&[
        "image",
        "import",
        &file,
        "a",
        "--object-size",
        "1M",
    ]));
    assert!(
        shown.contains("importing a: [")
            && shown.contains("80.00 MiB/80.00 MiB, ")
            && shown.contains(" left"),
        "no import bar on a terminal: {shown:?}"
    );
    assert!(shown.contains("imported a: "), "{shown:?}");
    let (out, err) = piped(&args(&[
        "image",
        "import",
        &file,
        "b",
        "--object-size",
        "1M",
    ]));
    assert!(out.contains("imported b: "), "{out}");
    assert!(
        !err.contains("importing") && !out.contains("importing"),
        "a bar without a terminal: {err:?}"
    );

    // Export of the same image, then removal.
    let back = c.dir.join("back.img").display().to_string();
    let shown = on_terminal(&args(&["image", "export", "a", &back]));
    assert!(
        shown.contains("exporting a: [") && shown.contains("80.00 MiB/80.00 MiB, "),
        "{shown:?}"
    );
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&file).unwrap());
    let shown = on_terminal(&args(&["image", "rm", "a"]));
    assert!(
        shown.contains("removing a: [") && shown.contains("80/80 objects, "),
        "{shown:?}"
    );
    let (_, err) = piped(&args(&["image", "rm", "b"]));
    assert!(!err.contains("removing b"), "{err:?}");

    // Scrub of a pool of 128 groups.
    run_ok(spindle().args(args(&["pool", "create", "many", "--pg-count", "128"])));
    let obj = c.dir.join("obj.bin");
    std::fs::write(&obj, content("obj", 1, 16 << 20)).unwrap();
    let (out, _) = piped(&args(&[
        "put",
        "one",
        &obj.display().to_string(),
        "--pool",
        "many",
    ]));
    assert!(
        out.starts_with("wrote one (16777216 bytes, ") && out.contains(" MB/s"),
        "{out}"
    );
    let shown = on_terminal(&args(&["scrub", "many"]));
    assert!(
        shown.contains("scrubbing many: [") && shown.contains("128/128 groups, "),
        "no scrub bar: {shown:?}"
    );
    let (out, err) = piped(&args(&["scrub", "many"]));
    assert!(
        out.contains("pool 'many': 128 pgs, 1 objects scrubbed"),
        "{out}"
    );
    assert!(!err.contains("scrubbing"), "{err:?}");
}
