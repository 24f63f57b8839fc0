//! Compiles the reduction program (`crates/spindle-prog/programs/zarr_reduce.c`) with
//! Debian's clang for eBPF; the module embeds the object file (`REDUCE_PROGRAM`), so the
//! package needs no compiler when it runs.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let prog = manifest.join("../crates/spindle-prog");
    let src = prog.join("programs/zarr_reduce.c");
    let include = prog.join("include");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("zarr_reduce.o");
    println!("cargo:rerun-if-changed={}", src.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("spindle_prog.h").display()
    );
    let status = Command::new("clang")
        .args(["-O2", "-target", "bpf", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed ({s}) on {}", src.display()),
        Err(e) => panic!(
            "cannot run clang ({e}): the package compiles its reduction program for eBPF with \
             Debian's clang (apt-get install clang; scripts/setup.sh installs it)"
        ),
    }
}
