//! Records the commit the binary is built from (`TUMBLER_COMMIT`:
//! the variable when set, as an image build without `.git` can pass it,
//! else `git rev-parse`, else "unknown") for `tumbler_build_info`.

use std::process::Command;

/// `git <args>`'s output, trimmed; None when git or the repository is
/// missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn commit() -> String {
    println!("cargo:rerun-if-env-changed=TUMBLER_COMMIT");
    if let Ok(commit) = std::env::var("TUMBLER_COMMIT")
        && !commit.trim().is_empty()
    {
        return commit.trim().to_owned();
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    // Built again when HEAD moves: HEAD itself (a checkout), the branch it
    // names (a commit) and the packed refs. Only files that exist are
    // named: cargo takes a named file that is missing as changed on every
    // build, which would rebuild the crate each time in a clone whose
    // branch ref is packed or whose refs were never packed.
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["rev-parse", "--symbolic-full-name", "HEAD"]),
    ) {
        // A packed branch gets a loose file at its next commit: watch the
        // folder it will appear in until it exists.
        let loose = std::path::Path::new(&common).join(&branch);
        match loose.parent() {
            Some(folder) if !loose.exists() => watched.push(folder.display().to_string()),
            _ => watched.push(loose.display().to_string()),
        }
        watched.push(format!("{common}/packed-refs"));
    }
    for file in watched {
        if std::path::Path::new(&file).exists() {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    commit
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rustc-env=TUMBLER_COMMIT={}", commit());
    Ok(())
}
