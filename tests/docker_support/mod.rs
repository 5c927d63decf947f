//! Shared helpers of the tests that run real containers: whether a Docker
//! engine answers, images built locally from this machine's files (there is no
//! registry), and guards that remove containers and networks even when a test
//! fails. Everything goes through the `docker` CLI, as an operator would.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run `docker args...`; its trimmed stdout, or why it failed.
pub fn docker<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| format!("docker: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        Err(format!(
            "docker {}: {}{}",
            shown.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// Record that `test` is skipped, and why, where CI finds it: the line
/// `SKIPPED <test>: <reason>` on stderr (shown with `--nocapture`) and
/// appended to the file `K3SCP_SKIP_LOG` names (default
/// `target/skipped-tests.txt`), which the captured output of a passing test
/// cannot hide. `.ci/run` prints that file's lines after `cargo test`.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("SKIPPED {test}: {reason}");
    eprintln!("{line}");
    let path = std::env::var_os("K3SCP_SKIP_LOG").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/skipped-tests.txt"),
        PathBuf::from,
    );
    // One short append per line: concurrent test processes do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("could not record the skip in {}: {e}", path.display());
    }
}

/// Why containers cannot run here: only when no Docker engine answers.
pub fn skip_reason() -> Option<String> {
    match docker(&["info", "--format", "{{.ServerVersion}}"]) {
        Ok(_) => None,
        Err(e) => Some(format!("no Docker engine answers `docker info` ({e})")),
    }
}

/// Copy `binary` to `<root>/<at>` and every shared library `ldd` reports
/// (with the dynamic loader) to its own path under `root`, as hack/image.sh does.
pub fn stage_binary(root: &Path, binary: &Path, at: &str) -> std::io::Result<()> {
    let dest = root.join(at.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().expect("a path inside the root"))?;
    std::fs::copy(binary, &dest)?;
    let ldd = Command::new("ldd").arg(binary).output()?;
    // A static binary makes ldd fail ("not a dynamic executable"): nothing to copy.
    let listing = String::from_utf8_lossy(&ldd.stdout);
    for lib in listing
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .collect::<std::collections::BTreeSet<_>>()
    {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a library path has a parent"))?;
        // Follows symlinks: the image gets the library itself.
        std::fs::copy(lib, &to)?;
    }
    Ok(())
}

/// SHA-256 of every file under `dir` (relative path and content, in order).
pub fn content_hash(dir: &Path) -> std::io::Result<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for file in files {
        let rel = file.strip_prefix(dir).expect("walked from dir");
        ctx.update(rel.to_string_lossy().as_bytes());
        ctx.update(&[0]);
        ctx.update(&std::fs::read(&file)?);
    }
    Ok(ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

const CONTENT_LABEL: &str = "org.k3scp.content-sha256";

/// Build `context` (with `dockerfile`) as `tag`, unless an image `tag` built
/// from the same content is already present. Returns whether it was built.
pub fn build_image(tag: &str, context: &Path, dockerfile: &Path) -> Result<bool, String> {
    let mut hash = content_hash(context).map_err(|e| format!("hash {context:?}: {e}"))?;
    let dockerfile_text =
        std::fs::read(dockerfile).map_err(|e| format!("read {dockerfile:?}: {e}"))?;
    hash.push_str(&format!("-{}", dockerfile_text.len()));
    let present = docker(&[
        "image",
        "inspect",
        "--format",
        &format!("{{{{ index .Config.Labels \"{CONTENT_LABEL}\" }}}}"),
        tag,
    ]);
    if present.as_deref() == Ok(hash.as_str()) {
        return Ok(false);
    }
    docker(&[
        "build".as_ref(),
        "--quiet".as_ref(),
        "--label".as_ref(),
        format!("{CONTENT_LABEL}={hash}").as_ref(),
        "-t".as_ref(),
        tag.as_ref(),
        "-f".as_ref(),
        dockerfile.as_os_str(),
        context.as_os_str(),
    ])?;
    Ok(true)
}

/// Image size in bytes, as `docker image inspect` reports it.
pub fn image_size(tag: &str) -> Result<u64, String> {
    docker(&["image", "inspect", "--format", "{{.Size}}", tag])?
        .parse()
        .map_err(|e| format!("image size of {tag}: {e}"))
}

/// A container removed (with its anonymous volumes) when dropped.
pub struct ContainerGuard(pub String);

impl ContainerGuard {
    pub fn logs_tail(&self) -> String {
        let out = Command::new("docker")
            .args(["logs", "--tail", "20", &self.0])
            .output();
        match out {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("docker logs: {e}"),
        }
    }

    pub fn running(&self) -> bool {
        docker(&["inspect", "--format", "{{.State.Running}}", &self.0]).as_deref() == Ok("true")
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", "-v", &self.0]);
    }
}

/// A user-defined network removed when dropped (declare it before the
/// containers on it, so that they are removed first).
pub struct NetworkGuard(pub String);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let _ = docker(&["network", "rm", &self.0]);
    }
}

/// A short random suffix for names of one run.
pub fn run_suffix() -> String {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
