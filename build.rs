//! Builds the native host helper (`remote-scripts/cairn-host.rs`) with the rustc that builds
//! this crate, for the host triple, statically linked, and records its SHA-256; the client
//! embeds both (`src/host_helper.rs`). Where it cannot be built (another OS, a cross build, no
//! static C library), an empty helper is embedded and cairn uses the sh script everywhere.

use std::path::PathBuf;
use std::process::Command;

include!("remote-scripts/sha256.rs");

fn main() {
    println!("cargo:rerun-if-changed=remote-scripts/cairn-host.rs");
    println!("cargo:rerun-if-changed=remote-scripts/sha256.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let bin = out.join("cairn-host");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    let built = linux && target == host && build(&bin, &target);
    let bytes = if built {
        std::fs::read(&bin).unwrap_or_default()
    } else {
        Vec::new()
    };
    if !built {
        let _ = std::fs::write(&bin, b"");
    }
    let sha = if bytes.is_empty() {
        String::new()
    } else {
        sha256(&bytes).iter().map(|b| format!("{b:02x}")).collect()
    };
    std::fs::write(out.join("cairn-host.sha256"), sha).expect("write the helper's hash");
}

fn build(bin: &std::path::Path, target: &str) -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let r = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-name",
            "cairn_host",
            "--crate-type",
            "bin",
        ])
        .args(["--target", target])
        .args(["-C", "target-feature=+crt-static", "-C", "panic=abort"])
        .args(["-C", "opt-level=z", "-C", "strip=symbols", "-C", "lto=fat"])
        .args(["-C", "codegen-units=1", "-C", "relocation-model=static"])
        .arg("remote-scripts/cairn-host.rs")
        .arg("-o")
        .arg(bin)
        .output();
    match r {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            for l in String::from_utf8_lossy(&o.stderr).lines().take(20) {
                println!("cargo:warning=cairn-host: {l}");
            }
            println!("cargo:warning=the host helper was not built; cairn will use the sh script");
            false
        }
        Err(e) => {
            println!("cargo:warning=cannot run rustc for the host helper ({e}); cairn will use the sh script");
            false
        }
    }
}
