//! The agent binaries the upgrade tests run besides the working tree's:
//! every release in `releases.toml`, built from its own commit, and the
//! `abi-probe` build of the working tree (a different datapath layout).
//! They land in `target/releases/bin/` (`sluice-<version>`,
//! `sluice-abi-probe`); a release is rebuilt only when its commit changes.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{
    ebpf,
    exec::{output, root, run},
    toolchain::Toolchain,
};

/// One line of `releases.toml`.
#[derive(Debug, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub commit: String,
}

/// Parses the `[[release]]` tables of `releases.toml` (version and commit
/// strings; other keys are for readers).
pub fn parse(text: &str) -> Result<Vec<Release>> {
    let mut out = Vec::new();
    let mut current: Option<(Option<String>, Option<String>)> = None;
    let mut flush = |cur: &mut Option<(Option<String>, Option<String>)>| -> Result<()> {
        if let Some((v, c)) = cur.take() {
            match (v, c) {
                (Some(version), Some(commit)) => out.push(Release { version, commit }),
                other => bail!("releases.toml: a release lacks version or commit: {other:?}"),
            }
        }
        Ok(())
    };
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line == "[[release]]" {
            flush(&mut current)?;
            current = Some((None, None));
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("releases.toml: cannot read `{line}`");
        };
        let value = value.trim().trim_matches('"').to_owned();
        let Some(cur) = current.as_mut() else {
            bail!("releases.toml: `{line}` outside a [[release]]");
        };
        match key.trim() {
            "version" => cur.0 = Some(value),
            "commit" => cur.1 = Some(value),
            _ => {}
        }
    }
    flush(&mut current)?;
    Ok(out)
}

pub fn bin_dir() -> PathBuf {
    root().join("target/releases/bin")
}

/// Shared by every build here, apart from the working tree's own target
/// directory so that they never replace `target/debug/sluice`.
fn target_dir() -> PathBuf {
    root().join("target/releases/target")
}

/// Builds every release and the `abi-probe` build.
pub fn build_all(tc: &Toolchain) -> Result<PathBuf> {
    let text = fs::read_to_string(root().join("releases.toml")).context("reading releases.toml")?;
    fs::create_dir_all(bin_dir())?;
    for release in parse(&text)? {
        build_release(&release)?;
    }
    build_probe(tc)?;
    Ok(bin_dir())
}

fn git(args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(root()).args(args);
    cmd
}

fn build_release(release: &Release) -> Result<()> {
    let bin = bin_dir().join(format!("sluice-{}", release.version));
    let stamp = bin_dir().join(format!("sluice-{}.commit", release.version));
    if bin.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(release.commit.as_str()) {
        eprintln!(
            "release {}: {} is up to date",
            release.version,
            bin.display()
        );
        return Ok(());
    }
    let have = output(&mut git(&[
        "cat-file",
        "-e",
        &format!("{}^{{commit}}", release.commit),
    ]))
    .is_some();
    if !have {
        // A shallow clone: fetch the history the release needs.
        let _ = run(&mut git(&["fetch", "--quiet", "--unshallow"]));
        if output(&mut git(&[
            "cat-file",
            "-e",
            &format!("{}^{{commit}}", release.commit),
        ]))
        .is_none()
        {
            bail!(
                "commit {} of release {} is not in this clone: fetch the full history",
                release.commit,
                release.version
            );
        }
    }
    let src = root().join("target/releases/src").join(&release.version);
    if src.exists() {
        fs::remove_dir_all(&src)?;
    }
    fs::create_dir_all(&src)?;
    // The release's own tree, as it was (not a worktree: nothing to prune).
    let archive = root()
        .join("target/releases/src")
        .join(format!("{}.tar", release.version));
    run(git(&["archive", "--format=tar", "-o"])
        .arg(&archive)
        .arg(&release.commit))?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&src))?;
    fs::remove_file(&archive)?;
    // Its own eBPF object with its own xtask, then its agent embedding it.
    run(Command::new("cargo")
        .current_dir(&src)
        .args(["xtask", "build-ebpf"])
        .env("CARGO_TARGET_DIR", target_dir()))?;
    build_agent(&src, &[], &src.join("target/bpf/sluice.bpf.o"), &bin)?;
    fs::write(&stamp, &release.commit)?;
    Ok(())
}

fn build_probe(tc: &Toolchain) -> Result<()> {
    let object = root().join("target/bpf-probe/sluice.bpf.o");
    ebpf::build_variant(tc, &["abi-probe"], "ebpf-probe", &object)?;
    build_agent(
        &root(),
        &["abi-probe"],
        &object,
        &bin_dir().join("sluice-abi-probe"),
    )
}

fn build_agent(src: &Path, features: &[&str], object: &Path, dest: &Path) -> Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(src)
        .args(["build", "--quiet", "-p", "sluice", "--bin", "sluice"])
        .env("CARGO_TARGET_DIR", target_dir())
        .env("SLUICE_BPF_OBJECT", object)
        // Its preallocating object beside it; where there is none (the
        // `abi-probe` build), `--preallocate-maps` refuses to load rather
        // than load another build's object.
        .env(
            "SLUICE_BPF_OBJECT_PREALLOC",
            object.with_file_name("sluice-prealloc.bpf.o"),
        );
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    run(&mut cmd)?;
    let built = target_dir().join("debug/sluice");
    fs::copy(&built, dest)
        .with_context(|| format!("copying {} to {}", built.display(), dest.display()))?;
    eprintln!("built {}", dest.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_release_list() {
        let text = "# c\n[[release]]\nversion = \"0.1.0\"\ncommit = \"abc\"\nabi = 4\n\n[[release]]\nversion = \"0.2.0\"\ncommit = \"def\"\n";
        let releases = parse(text).unwrap();
        assert_eq!(
            releases,
            vec![
                Release {
                    version: "0.1.0".into(),
                    commit: "abc".into()
                },
                Release {
                    version: "0.2.0".into(),
                    commit: "def".into()
                },
            ]
        );
        assert!(parse("[[release]]\nversion = \"1\"\n").is_err());
        assert!(parse("version = \"1\"\n").is_err());
    }

    #[test]
    fn the_checked_in_list_starts_with_0_1_0() {
        let text = fs::read_to_string(root().join("releases.toml")).unwrap();
        let releases = parse(&text).unwrap();
        assert_eq!(releases[0].version, "0.1.0");
        assert!(releases[0].commit.starts_with("95941c0"));
    }
}
